"""Run numbers with their definitions (docs/ALGORITHM.md §8) and the latency model (§4), from engine spans and summaries."""
from __future__ import annotations

import html
import statistics

from mirror_core.events import STAGE_TARGET_STEP, STAGE_WAIT
from mirror_core.latency import LatencyModel, latency_model_from_events, per_step_totals, stage_mean, step_times
from mirror_core.events import WHOLE_MACHINE_BOUND  # ui/ reaches records through events
from mirror_core.models.pairs import target_function

from .render import count as counted, shown_path
from .session import DecoderRun
from .settings import DECODER_ORDER, DECODER_TITLES
from .whatif import why_model


def speedup(baseline: DecoderRun | None, run: DecoderRun | None) -> tuple[float | None, str]:
    """Baseline wall / method wall for the same token count; per-token times when the counts differ."""
    if baseline is None or run is None or not baseline.end or not run.end:
        return None, ""
    b, m = baseline.summary, run.summary
    if not (b.wall_s and m.wall_s and b.new_tokens and m.new_tokens):
        return None, ""
    if b.new_tokens == m.new_tokens:
        return b.wall_s / m.wall_s, "wall time"
    return (b.wall_s / b.new_tokens) / (m.wall_s / m.new_tokens), "per-token time"


def speedups(runs: dict[str, DecoderRun]) -> dict[str, tuple[float | None, str]]:
    return {d: speedup(runs.get("ar"), r) for d, r in runs.items()}


# The one rule for "too short to time": fewer committed tokens or (speculative runs) fewer verification steps than
# this, and a run's time is mostly its prefill and start-up noise, so it gets no speedup verdict.
MIN_TIMED_TOKENS = 16
MIN_TIMED_STEPS = 4


def too_short(run: DecoderRun | None) -> str | None:
    """Why a finished run is too short to time (None: long enough), by MIN_TIMED_TOKENS and MIN_TIMED_STEPS."""
    s = run.summary if run is not None else None
    if s is None:
        return None
    if s.new_tokens < MIN_TIMED_TOKENS:
        return f"{s.new_tokens} tokens committed (fewer than {MIN_TIMED_TOKENS})"
    if run.decoder != "ar" and s.steps < MIN_TIMED_STEPS:
        return f"{s.steps} verification steps (fewer than {MIN_TIMED_STEPS})"
    return None


# The noise meter's rule: while a run was timed, other processes used more than this share of one core (the CPU time
# they used ÷ the run's wall time; machine.others_cores), so its figures are not clean: another process took a share of
# the cores the lanes were timed on.
NOISY_CORES = 0.10


def noisiest(runs) -> DecoderRun | None:
    """The run other processes disturbed most while it was timed, where that is above NOISY_CORES (None: clean)."""
    worst = max((r for r in runs if r.others is not None), key=lambda r: r.others, default=None)
    return worst if worst is not None and worst.others > NOISY_CORES else None


def decode_tokens_per_s(summary) -> float | None:
    """Tokens after the prefill ÷ the time after it: (new tokens − 1) / (wall − TTFT); None when there is none."""
    if summary is None or summary.ttft_s is None or summary.new_tokens < 2 or summary.wall_s <= summary.ttft_s:
        return None
    return (summary.new_tokens - 1) / (summary.wall_s - summary.ttft_s)


def _f(v, fmt="{:.3f}", scale=1.0) -> str:
    return "—" if v is None else fmt.format(v * scale)


def _source_cell(run: DecoderRun, source: str) -> str:
    """steps · accepted / proposed · mean accepted run, of the windows from one source ("—": none, or AR)."""
    c = run.summary.by_source[source]
    if not c["steps"]:
        return "—"
    return f"{c['steps']} · {c['accepted']}/{c['proposed']} · {c['mean_accepted_run']:.2f}"


def _zero_cell(summary) -> str:
    """'31 of 52 steps': the steps that took a window of zero ("—": AR, no steps)."""
    return f"{summary.zero_windows} of {counted(summary.steps, 'step')}" if summary.steps else "—"


def _positions_cell(summary) -> str:
    """'α_1 0.62 (n 39) · α_2 …': each position's acceptance beside the windows it was counted over."""
    if not summary.steps:
        return "—"
    return " · ".join(f"α_{i} {_f(a / n if n else None, '{:.2f}')} (n {n})"
                      for i, (a, n) in enumerate(zip(summary.pos_accepted, summary.pos_drafted), 1))


def _source_row(source: str, title: str) -> tuple:
    return (f"windows: {title}", lambda r, s: _source_cell(r, source),
            f"steps whose window came from the {title} · tokens accepted / proposed (Σ A_t / Σ D_t) · mean accepted "
            "run (Σ A_t / steps)")


# (label, how to read it from a run, definition)
_ROWS = (
    ("tokens/s (wall)", lambda r, s: _f(r.summary.tokens_per_s, "{:.1f}"), "new tokens / wall time (prefill start → last commit)"),
    ("tokens/s (decode)", lambda r, s: _f(decode_tokens_per_s(r.summary), "{:.1f}"),
     "(new tokens − 1) / (wall time − TTFT): after the prefill, the part speculation speeds up"),
    ("TTFT", lambda r, s: _f(r.summary.ttft_s, "{:.1f} ms", 1e3), "time to the first new token (the prefill)"),
    ("wall time", lambda r, s: _f(r.summary.wall_s, "{:.1f} ms", 1e3), "prefill start → last commit, on the engine's clock"),
    ("speedup vs AR", lambda r, s: _speedup_cell(r, s), "AR wall time / this wall time, same prompt, settings, seed and token count"),
    ("τ", lambda r, s: _f(r.summary.tau, "{:.2f}"), "Σ n_t / #steps: tokens committed per verification, incl. the correction/bonus"),
    ("α", lambda r, s: _f(r.summary.acceptance_rate), "Σ A_t / Σ D_t: share of drafted tokens the target accepted"),
    ("α_i (n) by position", lambda r, s: _positions_cell(r.summary),
     "α_i = #(A_t ≥ i) / #(D_t ≥ i) at draft position i = 1..γ, n = #(D_t ≥ i): the windows that offered position i"),
    ("τ(γ) from α_i", lambda r, s: _f(r.summary.tau_from_positions, "{:.2f}"),
     "1 + α_1 + … + α_γ: what a step of γ draft tokens commits at these acceptances (= τ when every window had γ)"),
    ("hit rate", lambda r, s: _f(r.summary.hit_rate), "#steps whose correction c was among the early-exit top-κ / #steps with branches"),
    ("fallback frequency", lambda r, s: _f(r.summary.fallback_frequency), "1 − hit rate: steps that needed a fresh draft rollout"),
    ("draft-hidden fraction", lambda r, s: _f(r.summary.draft_hidden_fraction), "Σ|draft busy ∩ target busy| / Σ|draft busy| on one clock"),
    ("Ω̂_κ (exit overlap)", lambda r, s: _f(r.summary.exit_overlap), "share of slots whose target token is in that slot's early-exit top-κ"),
    *(_source_row(source, title)
      for source, title in (("model", "model draft"), ("branch", "adopted branch"), ("context", "context copy"))),
    ("windows of zero", lambda r, s: _zero_cell(r.summary), "steps whose window had zero tokens: no window was "
     "modelled to commit more tokens per millisecond than a plain target step, so the target verified [w0] alone and "
     "committed its own token (Zero windows on; the step inspector says why at each step)"),
    ("new tokens / target passes", lambda r, s: f"{r.summary.new_tokens} / {r.summary.target_passes}", "target forward passes after the prefill: verification passes (sd, mirror) + one-token steps (ar)"),
    ("other processes", lambda r, s: _f(r.others, "{:.0%} of a core"),
     "the CPU time other processes used while this run was timed ÷ its wall time (the machine's busy time less this "
     f"page's and its draft lane's); above {NOISY_CORES:.0%} of a core the figures are not clean"),
)


def _speedup_cell(run: DecoderRun, ctx: tuple[dict, dict]) -> str:
    sp, shortness = ctx  # decoder → (speedup, kind); decoder → why it (or its AR run) is too short to time, or None
    value, kind = sp.get(run.decoder, (None, ""))
    if run.decoder == "ar":
        return "1.00× (baseline)"
    if value is None:
        return "— (run AR too)"
    short = shortness.get(run.decoder)
    if short:
        return f'{value:.2f}× <small>too short to time: {html.escape(short)}</small>'
    cls = "mirror-slow" if value < 1 else "mirror-fast"
    note = " (stopped early)" if run.end and run.end.stopped else ""
    return f'<span class="{cls}">{value:.2f}×</span> <small>{kind}{note}</small>'


def numbers_html(runs: dict[str, DecoderRun]) -> str:
    """One table: a column per decoder, a row per metric, each with its definition."""
    done = [runs[d] for d in DECODER_ORDER if d in runs and runs[d].end is not None]  # the page's column order
    if not done:
        return "<p><i>Numbers appear when a run finishes.</i></p>"
    ctx = (speedups(runs), {d: too_short(r) or too_short(runs.get("ar")) for d, r in runs.items()})
    head = "".join(f"<th>{html.escape(DECODER_TITLES[r.decoder])}</th>" for r in done)
    body = "".join(f"<tr><th>{label}</th>" + "".join(f"<td>{cell(r, ctx)}</td>" for r in done)
                   + f"<td class='mirror-def'>{html.escape(definition)}</td></tr>" for label, cell, definition in _ROWS)
    notes = "".join(f"<li><b>{html.escape(DECODER_TITLES[r.decoder])}</b>: {html.escape(n)}</li>"
                    for r in done for n in _run_notes(r))
    return (f"<table class='mirror-table'><tr><th>metric</th>{head}<th>definition</th></tr>{body}</table>"
            + (f"<ul class='mirror-notes'>{notes}</ul>" if notes else "") + sampling_line(done) + machine_line(done[0])
            + target_line(done[0]))


def machine_line(run: DecoderRun) -> str:
    """Where AR, the baseline of every speedup above, ran: on every core (RunSettings.serial_cpus: the load timed the
    target's step faster there), or on the target lane's cores (the paper's setting: the draft's device is otherwise
    idle), and then what AR on every core would cost instead."""
    settings = run.start.settings if run.start else None
    if settings is None or settings.whole_machine is None or settings.draft is None:
        return ""
    w = settings.whole_machine
    lane, lane_ms, every, all_ms = w.lane_cores, w.lane_ms, w.all_cores, w.all_ms
    cores = f"{lane} core{'s' if lane != 1 else ''}"
    if settings.serial_cpus:
        text = (f"Baselines: AR here ran on all {len(settings.serial_cpus)} cores, the whole machine: the load timed "
                f"the target's one-token step there at {all_ms:.1f} ms against {lane_ms:.1f} ms on the target lane's "
                f"{cores} (medians of {len(w.ratios)} alternated timings, every one on the same side), so every "
                f"speedup above is against the fastest target-only decoding here; Mirror-SD's target keeps its lane's "
                f"{cores} while the draft lane has its own.")
        return f"<p class='mirror-def'>{html.escape(text)}</p>"
    ratio = all_ms / lane_ms if lane_ms else 1.0
    if not w.bounded:  # another process held a core while it was timed: no baseline, no correction from it
        text = (f"Baselines: AR here ran on the target lane's {cores} while the draft lane had its own (the paper's "
                f"setting). AR on all {every} cores is not shown as faster or slower: its one-token step timed "
                f"{all_ms:.1f} ms against {lane_ms:.1f} ms on the lane, more than {WHOLE_MACHINE_BOUND:g}× apart, "
                f"which is another process's doing, not the cores' (timed {w.retimed + 1} times before this "
                "comparison, never within the bounds); `python -m mirror_core bench` measures ar_all.")
        return f"<p class='mirror-def'>{html.escape(text)}</p>"
    if not w.settled:  # the alternated timings disagree on which is faster: noise, not a fact about the cores
        spread = (f" ({len(w.ratios)} alternated timings at load read {min(w.ratios):.2f}–{max(w.ratios):.2f}×)"
                  if w.ratios else " (timed once at load)")
        text = (f"Baselines: AR here ran on the target lane's {cores} while the draft "
                f"lane had its own (the paper's setting). AR on all {every} cores is not shown as faster or slower: "
                f"its one-token step against the lane's was within timing noise{spread}; `python -m mirror_core "
                "bench` measures ar_all.")
        return f"<p class='mirror-def'>{html.escape(text)}</p>"
    text = (f"Baselines: AR here ran on the target lane's {cores} while the draft lane "
            f"had its own (the paper's setting). On all {every} cores the target's one-token step takes {all_ms:.1f} ms "
            f"instead of {lane_ms:.1f} ms (medians of {len(w.ratios)} alternated timings before this comparison, "
            "every one on the "
            "same side), so against AR on the whole machine each speedup above is "
            f"about {ratio:.2f}× of what it says (modelled from those two timings; `python -m mirror_core bench` "
            "measures ar_all and transformers' generate).")
    return f"<p class='mirror-def'>{html.escape(text)}</p>"


def sampling_line(done: list[DecoderRun]) -> str:
    """At T > 0: whether the speculative decoders' texts equal AR's, and why that is (or is not) expected."""
    ar = next((r for r in done if r.decoder == "ar"), None)
    sampling = done[0].start.settings.request.sampling if done[0].start else None
    if ar is None or sampling is None or sampling.greedy:
        return ""
    differ = [DECODER_TITLES[r.decoder] for r in done if r is not ar and r.end.token_ids != ar.end.token_ids]
    if sampling.rule == "exact":
        text = ("Rule E (exact match): each slot is drawn from p_target with the target lane's generator, as AR draws "
                "it, so with the same seed every decoder's text is AR's" + (
                    "." if not differ else f"; here {', '.join(differ)} differed (a stop or a length cut earlier?)."))
    else:
        text = ("Rule R (rejection sampling): a draft token is kept with probability min(1, p_target / p_draft) and a "
                "rejected one is replaced by a draw from the residual max(0, p_target − p_draft). Every decoder's text "
                "is an exact sample of the target's distribution, but the random numbers are used differently from "
                "AR's, so " + (f"{', '.join(differ)} wrote a different text: different text, same distribution."
                               if differ else "the texts may differ from AR's (different text, same distribution); "
                                              "this time they agree."))
    return f"<p class='mirror-def'>{html.escape(text)}</p>"


def target_line(run: DecoderRun) -> str:
    """How the target computed its logits (runners/exactness.py, checked at load): what makes every decoder's tokens AR's."""
    settings = run.start.settings if run.start else None
    if settings is None:
        return ""
    rows = settings.target_rows
    if rows.plan is not None and rows.invariant:
        how = (f"one function by measured call shapes: on this machine a position's logits differed between "
               f"one-token and window calls ({rows.differing:,} logits over 16 window sizes), so the target runs "
               f"{rows.plan.label}; bit-identical now")
    else:
        how = rows.describe
    spread = settings.lanes.target_devices
    ran = (f"Ran: target {shown_path(settings.target)} on "
           f"{'+'.join(spread) if spread else settings.lanes.target_device}"
           + (f", draft {shown_path(settings.draft)} on {settings.lanes.draft_device} ({settings.lanes.kind} lane)"
              if settings.draft else ", no draft")
           + (f" (vocabulary: {settings.draft_vocab} most frequent tokens)" if settings.draft and settings.draft_vocab
              else "")
           + (f"; the draft reads the target's layer-{settings.draft_features} hidden states"
              if settings.draft and settings.draft_features else "")
           + (f"; early-exit readout: {settings.exit_readout}" if settings.draft else "") + "."
           + (f" γ {settings.request.spec.gamma}, κ {settings.request.spec.kappa}: {settings.spec_note}."
              if settings.draft and settings.spec_note else ""))
    return (f"<p class='mirror-def'>{html.escape(ran)}</p>"
            f"<p class='mirror-def'>Target: {html.escape(settings.target_runner)}, {html.escape(how)} "
            "(docs/ALGORITHM.md §3, “Up to numerics”, made exact).</p>" + dtype_line(settings)
            + roofline_html(settings.roofline))


def roofline_html(roof) -> str:
    """The target's forward against the memory roofline (records.Roofline, measured at load), a row per figure with
    its one-line definition."""
    if roof is None:
        return ""
    kernel = (f"{roof.kernel} (exact small-row kernel: every row the same bits in any call)" if roof.kernel != "torch"
              else f"torch matmul under a measured row plan — {roof.kernel_note}")
    windows = ", ".join(f"{m}: {roof.window_steps(m):.2f}" for m in range(2, len(roof.rows_ms) + 1))
    rows = [("kernel", kernel, "what runs the target's linear maps on this CPU (kernels/native.py)"),
            ("weight format", roof.weight_format, "the weights' bytes; products accumulate in float32"),
            ("weight bytes per token", f"{roof.weight_bytes / 1e6:.0f} MB",
             "bytes of weights one forward streams: every layer's linear maps and the LM head"),
            ("read bandwidth", f"{roof.read_gbs:.1f} GB/s" if roof.read_gbs else "—",
             "what the target lane streams from memory here (one thread on the kernel), measured at load"),
            ("roofline step", _f(roof.roofline_ms, "{:.1f} ms"), "weight bytes ÷ read bandwidth: the least a token can cost"),
            ("AR step", f"{roof.rows_ms[0]:.1f} ms", "the target's one-token forward, timed at load"),
            ("share of the roofline", _f(roof.step_fraction, "{:.0%}"), "roofline step ÷ AR step (100% = at the limit)"),
            ("window cost (rows: steps)", windows,
             "at load, on the target lane: a forward of that many new rows ÷ the lane's one-row forward (not ÷ T_AR "
             "where AR runs on more cores): ≈ 1 while reading the weights dominates, so a verification of γ + 1 "
             "tokens is nearly free; it grows once the arithmetic dominates")]
    body = "".join(f"<tr><th>{html.escape(a)}</th><td>{html.escape(b)}</td><td class='mirror-def'>{html.escape(c)}</td></tr>"
                   for a, b, c in rows)
    return ("<table class='mirror-table'><tr><th>the target against its roofline</th><th>value</th>"
            f"<th>definition</th></tr>{body}</table>")


def dtype_line(settings) -> str:
    """Each lane's format: the target's as the function that wrote the text (models/pairs.py: TargetFunction, the
    CLI's wording) and its load-time timings; the draft's, the pair's own where the kernel runs it (q8_0), else the
    fastest here (runners/calibrate.py), with its timings."""
    parts = []
    said = target_function(settings)
    cal = settings.target_dtype
    if said is not None:
        window = cal.ms(cal.sequence, "window")
        parts.append(f"target: {said.line}" + ("" if window is None else
                     f"; its window of γ+1 {window:.1f} ms at load (the fold under the verdict holds it from load to "
                     "run)"))
    cal = settings.draft_dtype
    if cal is not None:
        text = f"draft: {cal.label}"
        if cal.requested != "auto":
            text += " (forced by --dtype)"
        elif not cal.table:
            text += f" ({cal.note})"
        elif len({t.dtype for t in cal.table}) == 1:  # one format timed: the pair's own, not the fastest of several
            text += (f" ({cal.note}), its step {cal.ms(cal.sequence, 'step'):.2f} ms and branch rollout "
                     f"{cal.ms(cal.rows, 'rows'):.1f} ms")
        else:
            text += (f", the fastest step ({cal.ms(cal.sequence, 'step'):.1f} ms) and branch rollout "
                     f"({cal.ms(cal.rows, 'rows'):.1f} ms)")
        parts.append(text)
    if not parts:
        return ""
    return ("<p class='mirror-def'>Formats, set when the pair loaded (the target's is the function every decoder "
            "reproduces; the draft's, timed where it runs, never changes the output): "
            + html.escape("; ".join(parts)) + ".</p>")


# (label, value of one finished run given its repeat's AR run, format, definition) for the spread table.
_SPREAD = (
    ("tokens/s (wall)", lambda r, ar: r.summary.tokens_per_s, "{:.1f}", "as above, per repeat"),
    ("tokens/s (decode)", lambda r, ar: decode_tokens_per_s(r.summary), "{:.1f}", "as above, per repeat"),
    ("TTFT (ms)", lambda r, ar: None if r.summary.ttft_s is None else r.summary.ttft_s * 1e3, "{:.1f}",
     "as above, per repeat"),
    ("speedup vs AR", lambda r, ar: speedup(ar, r)[0] if r.decoder != "ar" else None, "{:.2f}×",
     "this repeat's AR run / this run (same prompt, settings and seed)"),
    ("other processes (of a core)", lambda r, ar: r.others, "{:.0%}", "as above, per repeat"),
)


def per_repeat(history: list[DecoderRun]) -> list[dict[str, DecoderRun]]:
    """The comparison's runs by repeat (the i-th run of each decoder is in repeat i), each repeat's in run order."""
    count: dict[str, int] = {}
    repeats: list[dict[str, DecoderRun]] = []
    for run in history:
        i = count.get(run.decoder, 0)
        count[run.decoder] = i + 1
        if i == len(repeats):
            repeats.append({})
        repeats[i][run.decoder] = run
    return repeats


def repeats_by_decoder(history: list[DecoderRun]) -> dict[str, list[tuple[DecoderRun, DecoderRun | None]]]:
    """Each decoder's finished runs over the repeats, each with the AR run of the same repeat (or None)."""
    out: dict[str, list] = {}
    for repeat in per_repeat(history):
        for d, run in repeat.items():
            if run.end is not None and not run.end.stopped:
                out.setdefault(d, []).append((run, repeat.get("ar")))
    return out


def spread_html(history: list[DecoderRun]) -> str:
    """Median and range of the main numbers over the repeats ('' for a single repeat)."""
    found = repeats_by_decoder(history)
    runs = {d: found[d] for d in DECODER_ORDER if d in found}  # the columns in the order of the table above
    if max((len(v) for v in runs.values()), default=0) < 2:
        return ""
    head = "".join(f"<th>{html.escape(DECODER_TITLES[d])} (n = {len(v)})</th>" for d, v in runs.items())
    body = ""
    for label, value, fmt, definition in _SPREAD:
        cells = ""
        for pairs in runs.values():
            xs = [x for x in (value(r, ar) for r, ar in pairs) if x is not None]
            cells += ("<td>—</td>" if not xs else
                      f"<td><b>{fmt.format(statistics.median(xs))}</b> <small>[{fmt.format(min(xs))} – "
                      f"{fmt.format(max(xs))}]</small></td>")
        body += f"<tr><th>{label}</th>{cells}<td class='mirror-def'>{html.escape(definition)}</td></tr>"
    return ("<p><b>Over the repeats</b>: median <small>[min – max]</small>; the table above is the repeat the verdict "
            "reads (its Mirror-SD ÷ AR is the middle one).</p>"
            f"<table class='mirror-table'><tr><th>metric</th>{head}<th>definition</th></tr>{body}</table>")


def _run_notes(run: DecoderRun) -> list[str]:
    end, notes = run.end, []
    if end.stopped:
        notes.append("stopped by the user; numbers cover the tokens committed so far")
    if end.fallback:
        notes.append(f"fallback: {end.fallback}")
    if end.error:
        notes.append(f"error: {end.error}")
    return notes


def latency_model(mirror: DecoderRun | None, ar: DecoderRun | None) -> LatencyModel | None:
    """The §4 model (mirror_core.latency) from the Mirror-SD run's spans, T_AR from the AR run's mean step."""
    if mirror is None or not mirror.steps or mirror.end is None:
        return None
    t_ar = stage_mean(ar.spans, (STAGE_TARGET_STEP,)) if ar else 0.0
    return latency_model_from_events(mirror.spans, mirror.steps, mirror.summary, t_ar or None)


def measured_step(run: DecoderRun | None) -> tuple[float, float] | None:
    """A speculative run's mean step and its mean wait for the draft a step (s, measured by the engine's spans: the
    step from its first target span to its record, as the step bars; None without timed steps)."""
    times = [] if run is None else step_times(run.spans, run.steps)
    if not times:
        return None
    return statistics.fmean(times), sum(per_step_totals(run.spans, (STAGE_WAIT,)).values()) / len(times)


def why_measured(model: LatencyModel, mirror: DecoderRun | None, sd: DecoderRun | None) -> str:
    """The Run tab's Why: the run's measured steps first (the figures the verdict and the bars quote), then the
    latency model's, from the same stage means, marked as modelled, with what it leaves out."""
    m, v = measured_step(mirror), measured_step(sd)
    if m is None:
        return "Modelled from this run's stage means: " + why_model(model)
    branch, delta, wait = 1e3 * model.t_branch, 1e3 * model.delta, 1e3 * m[1]
    fits = "fit inside" if model.t_branch <= model.delta else "outlast"
    said = (f"Measured in this run: a Mirror-SD step took {1e3 * m[0]:.2f} ms, of which the target waited "
            f"{wait:.2f} ms for the draft (its branch rollouts, {branch:.1f} ms, {fits} the target's last layers, "
            f"Δ = {delta:.1f} ms; the rest of the wait is messages and fresh rollouts after a miss)")
    if v is not None:
        saved = 1e3 * (v[0] - m[0])
        said += (f"; vanilla SD's step took {1e3 * v[0]:.2f} ms, waiting {1e3 * v[1]:.2f} ms for its serial rollout "
                 f"({saved:+.2f} ms a step {'saved' if saved >= 0 else 'lost'} by Mirror-SD)")
    return (f"{said}. Modelled from the same stage means (the latency model, which leaves out the time between the "
            f"spans): {1e3 * model.expected_step:.1f} ms against {1e3 * model.t_sd:.1f} ms.")


def latency_html(model: LatencyModel | None, measured_speedup: float | None, mirror: DecoderRun | None = None,
                 sd: DecoderRun | None = None) -> str:
    """The latency model's terms (each marked measured or modelled) and the Why, measured first."""
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
    return (f"<table class='mirror-table'><tr><th>term</th><th>value</th><th>source</th></tr>{body}</table>"
            f"<p class='mirror-def' id='mirror-why'>Why: {html.escape(why_measured(model, mirror, sd))} "
            "The Learn tab's what-if starts from these terms.</p>")
