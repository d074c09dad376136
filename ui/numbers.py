"""Run numbers with their definitions (mirror_sd.md §8) and the latency model (§4), both from engine spans/stats."""
from __future__ import annotations

import html
from dataclasses import dataclass
from statistics import fmean

from .session import DecoderRun
from .settings import DECODER_TITLES


def speedup(baseline: DecoderRun | None, run: DecoderRun | None) -> tuple[float | None, str]:
    """Baseline wall / method wall for the same token count; per-token times when the counts differ."""
    if baseline is None or run is None or not baseline.end or not run.end:
        return None, ""
    b, m = baseline.stats, run.stats
    if not (b.get("wall_s") and m.get("wall_s") and b.get("new_tokens") and m.get("new_tokens")):
        return None, ""
    if b["new_tokens"] == m["new_tokens"]:
        return b["wall_s"] / m["wall_s"], "wall time"
    return (b["wall_s"] / b["new_tokens"]) / (m["wall_s"] / m["new_tokens"]), "per-token time"


def speedups(runs: dict[str, DecoderRun]) -> dict[str, tuple[float | None, str]]:
    return {d: speedup(runs.get("ar"), r) for d, r in runs.items()}


def _f(v, fmt="{:.3f}", scale=1.0) -> str:
    return "—" if v is None else fmt.format(v * scale)


# (label, how to read it from a run, definition)
_ROWS = (
    ("tokens/s", lambda r, s: _f(r.stats.get("tokens_per_s"), "{:.1f}"), "new tokens / decode wall time (prefill start → last commit)"),
    ("TTFT", lambda r, s: _f(r.stats.get("ttft_s"), "{:.1f} ms", 1e3), "time to the first new token (the prefill)"),
    ("wall time", lambda r, s: _f(r.stats.get("wall_s"), "{:.1f} ms", 1e3), "prefill start → last commit, on the engine's clock"),
    ("speedup vs AR", lambda r, s: _speedup_cell(r, s), "AR wall time / this wall time, same prompt, settings, seed and token count"),
    ("τ", lambda r, s: _f(r.stats.get("tau"), "{:.2f}"), "Σ n_t / #steps: tokens committed per verification, incl. the correction/bonus"),
    ("α", lambda r, s: _f(r.stats.get("acceptance_rate")), "Σ A_t / Σ D_t: share of drafted tokens the target accepted"),
    ("hit rate", lambda r, s: _f(r.stats.get("hit_rate")), "#steps whose correction c was among the early-exit top-κ / #steps with branches"),
    ("fallback frequency", lambda r, s: _f(r.stats.get("fallback_frequency")), "1 − hit rate: steps that needed a fresh draft rollout"),
    ("draft-hidden fraction", lambda r, s: _f(r.stats.get("draft_hidden_fraction")), "Σ|draft busy ∩ target busy| / Σ|draft busy| on one clock"),
    ("Ω̂_κ (exit overlap)", lambda r, s: _f(r.stats.get("exit_overlap")), "share of slots whose target token is in that slot's early-exit top-κ"),
    ("new tokens / steps", lambda r, s: f"{r.stats.get('new_tokens', len(r.tokens))} / {r.stats.get('steps', len(r.steps))}", "steps = target verification passes after the prefill"),
)


def _speedup_cell(run: DecoderRun, sp: dict) -> str:
    value, kind = sp.get(run.decoder, (None, ""))
    if run.decoder == "ar":
        return "1.00× (baseline)"
    if value is None:
        return "— (run AR too)"
    cls = "mirror-slow" if value < 1 else "mirror-fast"
    note = " (stopped early)" if run.end and run.end.stopped else ""
    return f'<span class="{cls}">{value:.2f}×</span> <small>{kind}{note}</small>'


def numbers_html(runs: dict[str, DecoderRun]) -> str:
    """One table: a column per decoder, a row per metric, each with its definition."""
    done = [r for r in runs.values() if r.end is not None]
    if not done:
        return "<p><i>Numbers appear when a run finishes.</i></p>"
    sp = speedups(runs)
    head = "".join(f"<th>{html.escape(DECODER_TITLES[r.decoder])}</th>" for r in done)
    body = "".join(f"<tr><th>{label}</th>" + "".join(f"<td>{cell(r, sp)}</td>" for r in done)
                   + f"<td class='mirror-def'>{html.escape(definition)}</td></tr>" for label, cell, definition in _ROWS)
    notes = "".join(f"<li><b>{html.escape(DECODER_TITLES[r.decoder])}</b>: {html.escape(n)}</li>"
                    for r in done for n in _run_notes(r))
    return (f"<table class='mirror-table'><tr><th>metric</th>{head}<th>definition</th></tr>{body}</table>"
            + (f"<ul class='mirror-notes'>{notes}</ul>" if notes else ""))


def _run_notes(run: DecoderRun) -> list[str]:
    end, notes = run.end, []
    if end.stopped:
        notes.append("stopped by the user; numbers cover the tokens committed so far")
    if end.fallback:
        notes.append(f"fallback: {end.fallback}")
    if end.error:
        notes.append(f"error: {end.error}")
    return notes


@dataclass(frozen=True)
class LatencyModel:
    """mirror_sd.md §4 terms (seconds, means over steps ≥ 1 of the Mirror-SD run) and its predictions."""

    t_pre: float          # target layers 1..ℓ_e (target_prefix spans)
    t_rv_ee: float        # early-exit readout + sending top-κ (exit_readout spans)
    delta: float          # Δ: target layers ℓ_e+1..N (target_suffix spans)
    t_branch: float       # T_draft^gen(γ) for the branch batch (draft_branches spans)
    t_rv_fv: float        # final readout: acceptance + adopting a branch (accept + select_branch spans)
    t_fresh: float        # a fresh γ-token rollout (draft_rollout spans)
    ff: float             # fallback frequency
    tau: float
    t_ar: float | None    # one target-only step (target_step spans of the AR run)
    measured_step: float  # measured mean step time of the Mirror-SD run

    @property
    def t_mirror(self) -> float:
        return self.t_pre + self.t_rv_ee + max(self.delta, self.t_branch) + self.t_rv_fv

    @property
    def expected_step(self) -> float:
        return self.t_mirror + self.ff * self.t_fresh

    @property
    def speedup(self) -> float | None:
        return None if not self.t_ar else self.tau * self.t_ar / self.expected_step


def _mean(run: DecoderRun, stages: tuple[str, ...], first_step: int = 1) -> float:
    """Mean total time per step spent in `stages` (0 when never seen)."""
    per_step: dict[int, float] = {}
    for s in run.spans:
        if s.stage in stages and s.step >= first_step:
            per_step[s.step] = per_step.get(s.step, 0.0) + (s.t1 - s.t0)
    return fmean(per_step.values()) if per_step else 0.0


def latency_model(mirror: DecoderRun | None, ar: DecoderRun | None) -> LatencyModel | None:
    if mirror is None or not mirror.steps or mirror.end is None:
        return None
    starts: dict[int, float] = {}
    for s in mirror.spans:
        if s.lane == "target" and s.step >= 1:
            starts[s.step] = min(starts.get(s.step, s.t0), s.t0)
    step_times = [r.t_end - starts[r.step] for r in mirror.steps if r.step in starts]
    if not step_times:
        return None
    measured = fmean(step_times)
    ar_steps = [s.t1 - s.t0 for s in ar.spans if s.stage == "target_step"] if ar else []
    stats = mirror.stats
    return LatencyModel(
        t_pre=_mean(mirror, ("target_prefix",)), t_rv_ee=_mean(mirror, ("exit_readout",)),
        delta=_mean(mirror, ("target_suffix",)), t_branch=_mean(mirror, ("draft_branches",)),
        t_rv_fv=_mean(mirror, ("accept",)) + _mean(mirror, ("select_branch",)),
        t_fresh=_mean(mirror, ("draft_rollout",), first_step=0), ff=stats.get("fallback_frequency") or 0.0,
        tau=stats.get("tau") or 1.0, t_ar=fmean(ar_steps) if ar_steps else None, measured_step=measured)


def latency_html(model: LatencyModel | None, measured_speedup: float | None) -> str:
    if model is None:
        return "<p><i>The latency model needs a finished Mirror-SD run (and an AR run for T_AR).</i></p>"
    ms = lambda v: "—" if v is None else f"{v * 1e3:.2f} ms"
    hidden = "yes" if model.t_branch <= model.delta else "no (the draft is on the critical path)"
    rows = [
        ("T_pre", ms(model.t_pre), "measured: target layers 1..ℓ_e"),
        ("T_rv^ee", ms(model.t_rv_ee), "measured: early-exit readout + sending top-κ"),
        ("Δ", ms(model.delta), "measured: target layers ℓ_e+1..N (the overlap budget)"),
        ("T_draft^gen(γ)", ms(model.t_branch), "measured: branch rollouts for all candidates (one batch)"),
        ("T_rv^fv", ms(model.t_rv_fv), "measured: acceptance + adopting the branch"),
        ("T_fresh", ms(model.t_fresh), "measured: one fresh γ-token rollout (fallback)"),
        ("FF, τ", f"{model.ff:.3f}, {model.tau:.2f}", "measured"),
        ("T_AR", ms(model.t_ar), "measured: one target-only step of the AR run"),
        ("draft hidden (T_draft ≤ Δ)?", hidden, "modelled"),
        ("T_Mirror = T_pre + T_rv^ee + max(Δ, T_draft) + T_rv^fv", ms(model.t_mirror), "modelled (hit path)"),
        ("E[T_step] = T_Mirror + FF·T_fresh", ms(model.expected_step), "modelled"),
        ("E[T_step]", ms(model.measured_step), "measured: mean step time of the Mirror-SD run"),
        ("speedup ≈ τ·T_AR / E[T_step]", "—" if model.speedup is None else f"{model.speedup:.2f}×", "modelled"),
        ("speedup", "—" if measured_speedup is None else f"{measured_speedup:.2f}×", "measured (wall time vs AR)"),
    ]
    body = "".join(f"<tr><th>{html.escape(a)}</th><td>{html.escape(b)}</td><td class='mirror-def'>{html.escape(c)}</td></tr>"
                   for a, b, c in rows)
    return f"<table class='mirror-table'><tr><th>term</th><th>value</th><th>source</th></tr>{body}</table>"
