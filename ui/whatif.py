"""What if the hardware were different? The latency model (mirror_core/latency.py, docs/ALGORITHM.md §4) fed
with a few knobs instead of measured spans: modelled, never measured, and labelled so on the page.

Knobs (WhatIf): the target's one-token step T_AR, the cost of verifying γ+1 tokens relative to one step,
the share of that pass after the early exit (Δ), the draft's time per token, how much a branch batch costs
relative to one fresh γ-token rollout, the readout and message overhead, τ and the fallback frequency. They
map onto the model's terms, so Mirror-SD's step is T_pre + T_rv + max(Δ, T_branch) + FF·T_fresh and vanilla
SD's is T_verify + T_fresh, exactly as the Run tab's latency table computes them from a real run.

The knobs start from figures with a source (ui/learn/starts.py): a run's measured spans (from_model), the loaded pair's
load-time timings on this machine (from_load), or the paper's illustrative accelerator (ACCELERATOR).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, fields, replace

from mirror_core import SpecConfig
from mirror_core.latency import LatencyModel, step_costs
from mirror_core.models.loading import local_folder
from mirror_core.models.profile import load_profile

# The paper's Table 1 means (speedup over target-only AR; Qwen3-14B/32B targets on accelerators, γ = 7,
# κ = 8): docs/ALGORITHM.md. Reference points for the modelled bars, not measurements of this machine.
PAPER_MEANS = (("Mirror-SD", 3.44, 3.82), ("EAGLE-3", 2.70, 3.00), ("Vanilla SD", 1.87, 2.53))


@dataclass(frozen=True)
class WhatIf:
    """The latency model's terms as knobs (ms and ratios); every start says where its figures come from."""

    t_ar_ms: float        # one target-only decode step
    verify_ratio: float   # T_verify(γ+1 tokens) / T_AR
    suffix_share: float   # Δ / T_verify: the layers after the early exit
    draft_ms: float       # the draft's time per token (a fresh rollout is γ of these)
    branch_factor: float  # T_branch / T_fresh: the batched branch rollout against one fresh rollout
    overhead_ms: float    # readout + messages + acceptance (T_rv)
    tau: float            # τ: tokens committed per step
    ff: float             # fallback frequency
    gamma: int            # γ

    def model(self) -> LatencyModel:
        verify = self.verify_ratio * self.t_ar_ms / 1e3
        fresh = self.gamma * self.draft_ms / 1e3
        return LatencyModel(t_pre=(1 - self.suffix_share) * verify, t_rv_ee=self.overhead_ms / 1e3,
                            delta=self.suffix_share * verify, t_branch=self.branch_factor * fresh, t_rv_fv=0.0,
                            t_fresh=fresh, ff=self.ff, tau=self.tau, t_ar=self.t_ar_ms / 1e3, measured_step=0.0)

    @classmethod
    def from_model(cls, m: LatencyModel, gamma: int) -> WhatIf:
        """The knobs that reproduce a run's measured latency model (the Run tab's last Mirror-SD run)."""
        verify = m.t_pre + m.delta
        knobs = dict(t_ar_ms=1e3 * (m.t_ar or verify), verify_ratio=verify / m.t_ar if m.t_ar else 1.0,
                     suffix_share=m.delta / verify if verify else 0.5, draft_ms=1e3 * m.t_fresh / gamma,
                     branch_factor=m.t_branch / m.t_fresh if m.t_fresh else 1.0,
                     overhead_ms=1e3 * (m.t_rv_ee + m.t_rv_fv), tau=m.tau, ff=m.ff)
        return cls(**{k: round(v, 3) for k, v in knobs.items()}, gamma=gamma)  # a readable slider value

    @classmethod
    def from_load(cls, info) -> WhatIf | None:
        """The knobs the engine's choice of γ, κ modelled at load (mirror_core.latency.choose_spec over the lanes'
        calibrations and the draft's profile), at the γ, κ, ℓ_e the pair would run: T_AR is the baseline's step (AR on
        every core where it runs there), the window's cost is the chooser's (latency.step_costs), τ and FF come from the
        profile, and the readout and messages as the load's short runs timed them (PairInfo.overheads; 0 where it
        timed none). So the knobs' Mirror-SD speedup is the one the choice promised. None where the load timed too
        little (no draft, a forced dtype)."""
        profile = load_profile(local_folder(info.draft)) if info.draft else None
        if profile is None or info.target_dtype is None or info.draft_dtype is None:
            return None
        spec = info.resolve(SpecConfig())
        costs = step_costs(info, spec.exit_layer)
        if costs is None:
            return None
        branch = costs.branch(spec.kappa * (spec.gamma + 1), spec.gamma)
        knobs = dict(t_ar_ms=costs.base, verify_ratio=costs.mirror_window(spec.gamma) / costs.base,
                     suffix_share=1 - costs.exit_share, draft_ms=costs.draft_token,
                     branch_factor=branch / (spec.gamma * costs.draft_token),
                     overhead_ms=costs.overheads.readout + costs.overheads.mirror if costs.overheads else 0.0,
                     tau=profile.tau(spec.gamma), ff=1 - profile.hit_rate(spec.kappa, spec.gamma))
        return cls(**{k: round(v, 3) for k, v in knobs.items()}, gamma=spec.gamma)

    def values(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]


KNOBS = tuple(f.name for f in fields(WhatIf))


# The paper's illustrative accelerator numbers (docs/ALGORITHM.md §4: T_target 40 ms = 20 + 20, T_branch 15,
# T_rv 0.5, T_fresh 10, FF 0.3, E[A_t] = 4, T_AR 30): illustrative, not measured anywhere.
ACCELERATOR = WhatIf(30.0, 40 / 30, 0.5, 10 / 7, 1.5, 0.5, 5.0, 0.3, 7)


# The accelerator view ("verify ≈ 1 step": the curve's switch, the step player's accelerator-shaped timeline), modelled.
# What moves, and why: a window of γ+1 rows rides one read of the target's weights, so its forward costs one AR step;
# the early-exit readout and the messages are a γ+1-row pass too and shrink by the same factor; the branch batch runs
# on the draft's own device, where its rows ride one read of the draft's weights, so it costs no more than one fresh
# rollout. What stays as the knobs give it: listed in ACCELERATOR_KEPT.
ACCELERATOR_MODELLED = ("the window's forward = one AR step; the readout and messages ÷ the window's old cost in AR "
                        "steps; the branch batch ≤ one fresh rollout, on the draft's own device")
ACCELERATOR_KEPT = ("T_AR, the exit layer's split, the draft's time per token (and so each fallback rollout), τ, the "
                    "fallback frequency and γ")


def on_accelerator(w: WhatIf) -> WhatIf:
    """The knobs as the accelerator view models them (ACCELERATOR_MODELLED; the rest kept: ACCELERATOR_KEPT)."""
    shrink = max(w.verify_ratio, 1.0)
    return replace(w, verify_ratio=min(w.verify_ratio, 1.0), overhead_ms=w.overhead_ms / shrink,
                   branch_factor=min(w.branch_factor, 1.0))


def ordering(w: WhatIf) -> str:
    """Mirror-SD against vanilla SD at these knobs, and why: same τ, so Mirror-SD is ahead exactly when its own costs
    (the readouts, the branches' overrun past Δ, the fallback rollouts) are less than the rollout SD waits for; when
    they are not, the sentence names the largest of them."""
    m, p = w.model(), prediction(w)
    own = (("the readout and messages", m.t_rv_ee + m.t_rv_fv), ("the branches' overrun past Δ",
           max(m.t_branch - m.delta, 0.0)), ("the fallback rollouts FF·T_fresh", m.ff * m.t_fresh))
    said = ", ".join(f"{name} {1e3 * v:.2f} ms" for name, v in own)
    total = 1e3 * sum(v for _, v in own)
    if p["mirror_x"] >= p["sd_x"]:
        return (f"Mirror-SD {p['mirror_x']:.2f}× ≥ vanilla SD {p['sd_x']:.2f}×, the paper's ordering: its own costs "
                f"({said}: {total:.2f} ms) stay under the {1e3 * m.t_fresh:.2f} ms rollout SD waits for.")
    name, worst = max(own, key=lambda t: t[1])
    return (f"Mirror-SD {p['mirror_x']:.2f}× < vanilla SD {p['sd_x']:.2f}×, against the paper's ordering; the largest "
            f"term that prevents it: {name} ({1e3 * worst:.2f} ms). Its own costs ({said}: {total:.2f} ms) exceed the "
            f"{1e3 * m.t_fresh:.2f} ms rollout SD waits for.")


def prediction(w: WhatIf) -> dict[str, float]:
    """Modelled tokens/s of AR, vanilla SD and Mirror-SD, and their speedups over AR."""
    m = w.model()
    out = {"ar": 1.0 / m.t_ar, "sd": m.tau / m.t_sd, "mirror": m.tau / m.expected_step}
    return out | {f"{k}_x": v / out["ar"] for k, v in list(out.items())}


def why(w: WhatIf) -> str:
    """One computed sentence: is the draft hidden, and where does the speedup come from."""
    return "Modelled: " + why_model(w.model())


def why_model(m: LatencyModel) -> str:
    """The sentence for any latency model (the Run tab's, from a run's spans, or the what-if's)."""
    branch, delta = 1e3 * m.t_branch, 1e3 * m.delta
    hidden = (f"the branch rollouts ({branch:.1f} ms) fit inside the target's last layers (Δ = {delta:.1f} ms), "
              "so the draft is hidden" if m.t_branch <= m.delta else
              f"the branch rollouts ({branch:.1f} ms) outlast the target's last layers (Δ = {delta:.1f} ms), "
              "so the draft is not hidden")
    saving = 1e3 * (m.t_sd - m.expected_step)
    verify = (f" for a window of {(m.t_pre + m.delta) / m.t_ar:.2f} AR steps (T_pre + Δ ÷ T_AR, the readout aside)"
              if m.t_ar else "")
    loss = ""
    if saving < 0:  # hidden or not, Mirror-SD's own stages cost more than the serial rollout it saves SD
        extra = 1e3 * (m.t_rv_ee + m.t_rv_fv + max(m.t_branch - m.delta, 0.0) + m.ff * m.t_fresh)
        loss = (f": a loss, because the readouts T_rv^ee + T_rv^fv, the branches' overrun past Δ and the fallback "
                f"rollouts FF·T_fresh add {extra:.1f} ms a step, more than the {1e3 * m.t_fresh:.1f} ms rollout SD "
                "waits for")
    return (f"{hidden}; a Mirror-SD step costs {1e3 * m.expected_step:.1f} ms against vanilla SD's "
            f"{1e3 * m.t_sd:.1f} ms ({saving:+.1f} ms saved{loss}), and each step commits τ = {m.tau:.2f} "
            f"tokens{verify}.")


def whatif_html(w: WhatIf) -> str:
    """Bars of modelled tokens/s with the speedups, the paper's Table 1 means beside them, and the sentence."""
    p = prediction(w)
    top = max(p["ar"], p["sd"], p["mirror"])
    rows = "".join(
        f"<tr><th>{name}</th><td><div class='mirror-bar' style='width:{100 * p[k] / top:.0f}%'></div></td>"
        f"<td>{p[k]:.1f} tok/s</td><td>{p[k + '_x']:.2f}×</td></tr>"
        for name, k in (("Target-only AR", "ar"), ("Vanilla SD", "sd"), ("Mirror-SD", "mirror")))
    paper = "; ".join(f"{name} {lo:.2f}–{hi:.2f}×" for name, lo, hi in PAPER_MEANS)
    return (f"<table class='mirror-table' id='mirror-whatif-table'><tr><th>decoder</th><th></th>"
            f"<th>tokens/s (modelled)</th><th>× AR (modelled)</th></tr>{rows}</table>"
            f"<p class='mirror-def'>{html.escape(why(w))}</p>"
            f"<p class='mirror-def'>For reference, the paper's Table 1 means over six tasks (Qwen3-14B/32B targets "
            f"on accelerators, γ = 7, κ = 8; measured there, not here): {html.escape(paper)}.</p>")
