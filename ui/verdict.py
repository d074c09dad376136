"""The verdict under Run: Mirror-SD against AR and vanilla SD in one line, and why, with the arithmetic shown, from
the figures the numbers panel already computed (ui/numbers.py: the measured wall-time speedups, and the latency
model's stage means from the engine's spans and counters). Nothing here is timed by the page.

With several repeats the line reads the middle repeat (its Mirror ÷ AR is the median for an odd count), so every
figure of its arithmetic comes from one repeat and the division can be redone; the range covers all repeats. Mirror ÷
vanilla SD is the median of the per-repeat ratios (the middle repeat by Mirror ÷ AR need not be SD's middle one).
"""
from __future__ import annotations

import html
import statistics

from .costs import costs_html, sd_reason, window_words
from .gauge import DEFINITION as GAUGE, break_even, gauge_html
from .numbers import MIN_TIMED_STEPS, MIN_TIMED_TOKENS, latency_model, noisiest, per_repeat, speedup, too_short
from .render import count
from .session import DecoderRun, Session
from .settings import DECODER_TITLES

EMPTY = ("The verdict appears under this line when the runs finish: Mirror-SD against target-only AR and vanilla SD, "
         "and why, in numbers.")  # said by the status line before any run (the verdict's box is empty then)
DEFINITIONS = ("× AR: AR's wall time ÷ Mirror-SD's for the same tokens (measured; tok/s = new tokens ÷ wall time); × "
               "vanilla SD: SD's wall time ÷ Mirror-SD's, the median over the repeats; AR "
               "is the target alone, on the cores named above (on every core where that is the fastest target-only "
               "decoding here: Mirror-SD splits the cores between its two lanes). "
               "An AR step: the AR run's mean one-token target step (T_AR). A verification: the target's pass over "
               "the γ+1 window positions, early-exit readout included (T_pre + T_rv^ee + Δ). τ: tokens committed per "
               "verification, correction or bonus included. The prefill: the prompt's forward before the first new "
               "token (its time is TTFT). Below: one step's milliseconds and every verify cost from load to run; "
               "Learn defines each term.")


def verdict_html(session: Session) -> str:
    """The verdict for the session's comparison (a placeholder before any run, a line saying why there is none),
    labelled as the earlier comparison's where the last Run ended before it replaced the results."""
    body = _verdict(session)
    if not body or not session.earlier:
        return _box(body) if body else ""
    why = "failed (its error is on the status line)" if session.error else "was stopped while its pair loaded"
    return _box(f"<p class='mirror-earlier' id='mirror-verdict-earlier'><b>The earlier comparison's verdict</b>: the "
                f"last Run {why} before it timed anything.</p>" + body)


def _verdict(session: Session) -> str:
    """verdict_html's body ('' before any run)."""
    runs = session.runs
    if not any(r.end is not None for r in runs.values()):
        return ""
    if session.stopped:
        return "<b>Stopped</b>: no verdict, the runs did not finish. Press Run for a full comparison."
    if "ar" not in runs or "mirror" not in runs:
        return ("<b>No verdict</b>: tick both Target-only AR and Mirror-SD (and Vanilla SD for the paper's "
                "comparison).")
    short: dict[str, list[str]] = {}  # why → the decoders it applies to
    for r in runs.values():
        if why := too_short(r):
            short.setdefault(why, []).append(DECODER_TITLES[r.decoder])
    if short:
        said = "; ".join(f"{', '.join(names)}: {why}" for why, names in short.items())
        return (f"<b>Too short to time</b> ({html.escape(said)}). A run this short is mostly its "
                f"prefill and start-up noise; a verdict needs at least {MIN_TIMED_TOKENS} tokens and "
                f"{MIN_TIMED_STEPS} verification steps per run. Raise <i>Max new tokens</i> or pick a longer "
                "example.")
    repeats = _repeats(session.history)
    if not repeats:
        return "<b>No verdict</b>: no repeat has both a finished AR and Mirror-SD run."
    timed, planned = len(repeats), session.planned_repeats
    provisional = (f"<b>Provisional</b> ({timed} of {planned} repeats timed; it updates as each one ends): "
                   if not session.idle.is_set() and timed < planned else "")
    ranked = _ranked(repeats)
    if not ranked:
        return provisional + "<b>No verdict</b>: the runs committed no tokens to compare."
    middle = ranked[(len(ranked) - 1) // 2]
    noisy = noise_line(session.history, ranked)
    zero = zero_windows_line(middle)  # in the fold, first: above it the sentence and the gauge stay within 70 words
    return (f"<p class='mirror-headline' id='mirror-headline'>{provisional}{html.escape(headline(repeats))}</p>"
            + (f"<p class='mirror-noisy' id='mirror-noisy'>{html.escape(noisy)}</p>" if noisy else "")
            + gauge_html(break_even(middle))
            + "<details id='mirror-why-fold'><summary>Why, in numbers, with every definition</summary>"
            + (f"<p id='mirror-zero'>{html.escape(zero)}</p>" if zero else "")
            + f"<p>{html.escape(verdict_text(repeats))}</p>"
            + f"<p><small>{html.escape(how_measured(timed) + ' ' + DEFINITIONS + ' ' + GAUGE)}</small></p>"
            + "<p><b>Where a step's time goes, from load to run</b></p>" + costs_html(middle, session.pair_info)
            + "</details>")


def headline(repeats: list[dict[str, DecoderRun]]) -> str:
    """The verdict in one plain sentence: whether speculation won here, and the one reason that decided it (the
    step's cost in AR steps against the tokens it committed; the prefill where the steps alone would have won)."""
    ranked = _ranked(repeats)
    middle = ranked[(len(ranked) - 1) // 2]
    x_ar = speedup(middle["ar"], middle["mirror"])[0]
    x_sd = versus_sd_median(repeats)
    xs = [x for r in ranked if (x := speedup(r["ar"], r["mirror"])[0]) is not None]
    besides = "" if x_sd is None else f" ({x_sd:.2f}× vanilla SD's speed)"
    if noise_note(xs):
        outcome = f"Speculation tied with AR here: Mirror-SD ran at {x_ar:.2f}× AR's speed{besides}, within timing noise"
    elif x_ar >= 1:
        outcome = f"Speculation won here: Mirror-SD ran {x_ar:.2f}× as fast as AR{besides}"
    elif (sd_ar := sd_over_ar(repeats)) is not None and sd_ar >= 1 and not noise_note(sd_xs(ranked)):
        outcome = (f"Vanilla SD won here ({sd_ar:.2f}× AR's speed), Mirror-SD lost: it ran at {x_ar:.2f}× AR's "
                   "speed")
    else:
        outcome = f"Speculation lost here: Mirror-SD ran at {x_ar:.2f}× AR's speed{besides}"
    rows = {r.decoder: r for r in break_even(middle)}
    step = rows.get("mirror")
    if step is None:
        return outcome + "."
    cost = f"{step.needed:.2f} AR steps"
    if (step.gap >= 0) != (x_ar >= 1):  # the steps alone point the other way: the prefill decided it
        ttft = lambda r: 1e3 * (r.summary.ttft_s or 0.0)  # noqa: E731
        return (f"{outcome}, though each step committed {step.got:.2f} tokens for {cost}: its prefill took "
                f"{ttft(middle['mirror']):.0f} ms against AR's {ttft(middle['ar']):.0f} ms in "
                f"{count(middle['mirror'].summary.new_tokens, 'token')}.")
    if step.gap >= 0:
        return f"{outcome}, because each step committed {step.got:.2f} tokens for the time of {cost}."
    return f"{outcome}, because each step cost {cost} but committed only {step.got:.2f} tokens."


def sd_xs(ranked: list[dict[str, DecoderRun]]) -> list[float]:
    """Vanilla SD ÷ AR per repeat (AR's wall ÷ SD's), where both ran."""
    return [x for r in ranked if (x := speedup(r.get("ar"), r.get("sd"))[0]) is not None] if ranked else []


def sd_over_ar(repeats: list[dict[str, DecoderRun]]) -> float | None:
    """Vanilla SD ÷ AR: the median of the per-repeat ratios (None where SD did not run)."""
    xs = sd_xs(repeats)
    return statistics.median(xs) if xs else None


def zero_windows_line(rep: dict[str, DecoderRun]) -> str:
    """How many steps of each speculative decoder took a window of zero, and why ('' where none did)."""
    said = [f"{DECODER_TITLES[d]} at {s.zero_windows} of {count(s.steps, 'step')}" for d in ("mirror", "sd")
            if d in rep and (s := rep[d].summary) is not None and s.zero_windows]
    if not said:
        return ""
    return (f"A window of zero (a plain target step): {' and '.join(said)}, where no window was modelled to commit "
            "more tokens per millisecond than a plain step (the step inspector says why at each step).")


def noise_line(history: list[DecoderRun], ranked: list[dict[str, DecoderRun]]) -> str:
    """Where the noise meter flagged a run of the comparison (numbers.noisiest): how much of a core another process
    took while it was timed, and the repeats' spread of Mirror ÷ AR beside it ('' where every run was clean)."""
    worst = noisiest(history)
    if worst is None:
        return ""
    xs = sorted(x for r in ranked if (x := speedup(r["ar"], r["mirror"])[0]) is not None)
    spread = (f"Mirror ÷ AR spread {xs[0]:.2f}–{xs[-1]:.2f}× over {len(xs)} repeats" if len(xs) > 1
              else "one repeat, no spread to judge by: raise Repeats")
    return (f"Another process used {worst.others:.0%} of a core while this was timed; the figures are not clean "
            f"({spread}).")


def how_measured(repeats: int) -> str:
    """How the verdict's runs were timed (ui/streaming.py: the page holds still while a decoder runs)."""
    order = ", every other one in reverse order" if repeats > 1 else ""
    return (f"Measured: each decoder alone with both lanes to itself, the page drawing nothing while it ran; "
            f"{repeats} repeat{'s' if repeats != 1 else ''}{order}.")


def _repeats(history: list[DecoderRun]) -> list[dict[str, DecoderRun]]:
    """Per repeat, its finished runs by decoder (repeats without both AR and Mirror-SD left out)."""
    done = lambda run: run.end is not None and not run.end.stopped  # noqa: E731
    return [{d: r for d, r in rep.items() if done(r)} for rep in per_repeat(history)
            if "ar" in rep and "mirror" in rep and done(rep["ar"]) and done(rep["mirror"])]


def middle_repeat(history: list[DecoderRun]) -> dict[str, DecoderRun] | None:
    """Every finished run of the repeat the verdict reads: the middle one by Mirror ÷ AR (the median for an odd
    count); None where no repeat has finished AR and Mirror-SD runs that committed tokens."""
    ranked = _ranked(_repeats(history))
    return ranked[(len(ranked) - 1) // 2] if ranked else None


def _ranked(repeats: list[dict[str, DecoderRun]]) -> list[dict[str, DecoderRun]]:
    """The repeats with a Mirror ÷ AR, by it."""
    ratio = lambda rep: speedup(rep["ar"], rep["mirror"])[0]  # noqa: E731
    return sorted((r for r in repeats if ratio(r) is not None), key=ratio)


def verdict_text(repeats: list[dict[str, DecoderRun]]) -> str:
    """'Mirror-SD 0.68× AR (10.6 vs 15.6 tok/s) · 0.92× vanilla SD. Slower here: …' from the middle repeat."""
    ratio = lambda rep, base: speedup(rep.get(base), rep["mirror"])[0]  # noqa: E731
    ranked = _ranked(repeats)
    if not ranked:
        return "No verdict: the runs committed no tokens to compare."
    middle = ranked[(len(ranked) - 1) // 2]
    x_ar = ratio(middle, "ar")
    head = (f"Mirror-SD {x_ar:.2f}× AR ({middle['mirror'].summary.tokens_per_s:.1f} vs "
            f"{middle['ar'].summary.tokens_per_s:.1f} tok/s{_where(middle['ar'])})" + _spread(ranked, "ar", len(repeats)))
    versus_sd = " Tick Vanilla SD for Mirror ÷ SD."
    x_sd = versus_sd_median(repeats)
    if x_sd is not None:
        with_sd = [r for r in repeats if speedup(r.get("sd"), r["mirror"])[0] is not None]
        head += (f" · {x_sd:.2f}× vanilla SD" + _spread(with_sd, "sd", len(with_sd), "the median")
                 + (" (SD was faster)" if x_sd < 1 else ""))
        if "sd" in middle:
            versus_sd = " " + sd_reason(middle["sd"], middle["mirror"], x_sd)
    return (f"{head}. {'Faster' if x_ar >= 1 else 'Slower'} here than AR: {_reason(middle)}{_noise(ranked)}"
            f"{versus_sd} {where_it_pays(middle, x_ar >= 1)}")


def versus_sd_median(repeats: list[dict[str, DecoderRun]]) -> float | None:
    """Mirror ÷ vanilla SD: the median of the per-repeat ratios (each repeat's SD wall ÷ Mirror-SD wall), not the
    ratio of the repeat read for Mirror ÷ AR (that one can say Mirror-SD won where SD's median beat it)."""
    xs = [x for r in repeats if (x := speedup(r.get("sd"), r["mirror"])[0]) is not None]
    return statistics.median(xs) if xs else None


def where_it_pays(rep: dict[str, DecoderRun], paid: bool) -> str:
    """How much of the answer the speculative decoders copied from the context, and what that says about where
    speculation pays (copied, predictable text) and where it cannot (open prose with a weak draft); `paid`: whether
    Mirror-SD beat AR here (where it did not, where it pays is said as a condition)."""
    runs = [r for d, r in rep.items() if d in ("mirror", "sd") and r.summary is not None]
    if not runs:
        return ""
    best = max(runs, key=lambda r: r.summary.by_source["context"]["accepted"])
    copied, tokens = best.summary.by_source["context"]["accepted"], best.summary.new_tokens
    if not best.start or not best.start.settings.request.spec.context.enabled:
        return "The context draft was off: only the draft model proposed."
    if tokens and copied / tokens >= 0.25:
        said = f"{copied} of {count(tokens, 'token')} ({copied / tokens:.0%}) were copied from the context (yellow)"
        if paid:
            return f"{said}: speculation pays where the answer copies from the prompt or from itself."
        return (f"{said}, and still speculation did not pay here: copying pays only where a step commits more "
                "tokens than it costs in AR steps.")
    if paid:
        return f"{copied} of {count(tokens, 'token')} were copied from the context: the draft model's windows paid."
    return (f"{copied} of {count(tokens, 'token')} were copied from the context: on open-ended text a small draft "
            "agrees with the target too rarely for speculation to pay much; an example that edits, corrects or "
            "converts a given text shows where it does.")


def _where(ar: DecoderRun) -> str:
    """'; AR on both cores': where the baseline ran (ar runs the target on every core unless --serial-cores lane)."""
    settings = ar.start.settings if ar.start is not None else None
    if settings is None:
        return ""
    cores = settings.serial_cpus or (settings.lanes.target_cpus if settings.lanes.target_device == "cpu" else ())
    if not cores:
        return ""
    n = len(cores)
    where = "both cores" if n == 2 else f"{n} cores" if n > 2 else "one core"
    return f"; AR on {where}" + (", the whole machine" if settings.serial_cpus else "")


def _spread(ranked: list[dict[str, DecoderRun]], base: str, n: int, shown: str = "the middle one") -> str:
    """' [min–max over n repeats, the middle one shown]' when there are several repeats."""
    xs = sorted(x for r in ranked if (x := speedup(r.get(base), r["mirror"])[0]) is not None)
    if len(xs) < 2:
        return ""
    return f" [{xs[0]:.2f}–{xs[-1]:.2f}× over {n} repeats, {shown} shown]"


def _reason(rep: dict[str, DecoderRun]) -> str:
    """The verification's cost in AR steps against the tokens it committed, divided out; then the whole step's."""
    model = latency_model(rep["mirror"], rep["ar"])
    if model is None or not model.t_ar:
        return "the AR run has no timed one-token steps to measure a verification against."
    verify = (model.t_pre + model.t_rv_ee + model.delta) / model.t_ar
    step = model.measured_step / model.t_ar
    tau = model.tau
    modelled = "" if model.speedup is None else f"; the latency model predicts {model.speedup:.2f}×"
    if verify <= 0:  # no step verified a window: every step was a window of zero
        return (f"no step proposed a window (every step was a plain target step: a window of zero, where no window "
                f"was expected to beat a plain step), so a step cost {step:.2f} AR steps and committed {tau:.2f} "
                f"tokens{modelled}.")
    windows = window_words(rep["mirror"])
    joined = " and" if windows.startswith("the window") else ", and"  # after a list of windows, a comma
    return (f"each verification ({windows}{joined} the early-exit readout) cost "
            f"{verify:.2f} AR steps and committed {tau:.2f} tokens ({tau:.2f} ÷ {verify:.2f} ≈ {tau / verify:.2f}). "
            f"With the draft's waits and acceptance a whole step cost {step:.2f} AR steps ({tau:.2f} ÷ {step:.2f} ≈ "
            f"{tau / step:.2f} per step, the prefill aside{modelled}).")


def _noise(ranked: list[dict[str, DecoderRun]]) -> str:
    return noise_note([x for r in ranked if (x := speedup(r["ar"], r["mirror"])[0]) is not None])


def noise_note(xs: list[float]) -> str:
    """'within timing noise' only when 1× lies inside the middle half of the repeats' ratios (their interquartile
    range): one repeat touching 1× does not make a run of clearly slower repeats a tie ([0.67, 0.70, 1.00] is slower)."""
    if len(xs) < 2:
        return ""
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    if q1 < 1 < q3:
        return (f" The middle half of the repeats ({q1:.2f}–{q3:.2f}×) holds 1×: on this machine the two are within "
                "timing noise.")
    return ""


def _box(body: str) -> str:
    return f"<div class='mirror-verdict' id='mirror-verdict-text'>{body}</div>"
