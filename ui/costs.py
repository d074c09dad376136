"""Where one step's time goes, from load to run: each verify cost defined once, and shown as one chain.

- window at load: the target's forward over the γ+1 window as the load timed it, the figure the choice of γ, κ
  modelled with (StepCosts.verify: linear between the timed one-token step and window), over the baseline's step
  at load (AR's one-token step on the cores AR runs on);
- window: the same forward in this run, T_pre + Δ (layers 1..ℓ_e, then ℓ_e+1..N: the pass split at ℓ_e);
- verification: the window plus the early-exit readout at ℓ_e (T_rv^ee);
- step: the verification plus acceptance, the wait for the draft lane and the rest, as the run measured a step.

Each is shown in ms and in AR steps (÷ T_AR, the AR run's mean one-token step; at load, the baseline's step timed
then). Beside them, a stacked bar of one step's milliseconds per decoder, and the load's modelled speedup against
the run's with the term that moved it most. Every figure comes from the engine's spans and load-time records.
"""
from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, replace

from mirror_core import events as ev
from mirror_core.config import SERIAL_DECODERS
from mirror_core.latency import per_step_totals, step_costs
from mirror_core.phases import PHASES, REST, StepPhases, step_phases, versus_sd

from .whatif import WhatIf, prediction
from .numbers import latency_model, speedup
from .plots import STAGE_STYLE
from .session import DecoderRun
from .settings import DECODER_TITLES

OTHER = REST  # the step's time between the spans: (name, definition)
PARTS = PHASES
COLOURS = {"step": STAGE_STYLE[ev.STAGE_TARGET_STEP][1], "verify": STAGE_STYLE[ev.STAGE_TARGET_VERIFY][1],
           "prefix": STAGE_STYLE[ev.STAGE_TARGET_PREFIX][1], "readout": STAGE_STYLE[ev.STAGE_EXIT_READOUT][1],
           "suffix": STAGE_STYLE[ev.STAGE_TARGET_SUFFIX][1], "accept": STAGE_STYLE[ev.STAGE_ACCEPT][1],
           "wait for the draft": STAGE_STYLE[ev.STAGE_DRAFT_BRANCHES][1], "the rest": "#d1d5db"}


def step_bar(run: DecoderRun | None) -> StepPhases | None:
    """The run's mean step by part (mirror_core/phases.py; None for a run with no timed steps)."""
    if run is None or run.summary is None:
        return None
    return step_phases(run.decoder, run.spans, run.steps, run.summary.tau)


def bars_html(runs: dict[str, DecoderRun]) -> str:
    """A stacked bar of one step's milliseconds per decoder, on one scale, with its cost per committed token."""
    bars = [b for b in (step_bar(runs.get(d)) for d in ("ar", "sd", "mirror")) if b is not None]
    if not bars:
        return ""
    top = max(b.step_ms for b in bars)
    rows = ""
    for b in bars:
        segments = "".join(
            f"<i style='width:{100 * ms / top:.2f}%;background:{COLOURS[name]}' title='{html.escape(name)}: "
            f"{ms:.2f} ms'></i>" for name, ms in b.parts if ms > 0)
        label = "one token" if b.decoder == "ar" else f"one step, τ = {b.tau:.2f} tokens"
        rows += (f"<div class='mirror-stack-row' data-decoder='{b.decoder}'><span>{DECODER_TITLES[b.decoder]}: "
                 f"{label}</span><div class='mirror-stack'>{segments}</div><span>{b.step_ms:.2f} ms · "
                 f"{b.step_ms / b.tau:.2f} ms a token</span></div>")
    seen = {name for b in bars for name, ms in b.parts if ms > 0}
    key = " ".join(f"<span><i style='background:{COLOURS[name]}'></i>{html.escape(name)}</span>"
                   for name in COLOURS if name in seen)
    return (f"<div class='mirror-stacks' id='mirror-step-bars'>{rows}<p class='mirror-plot-legend'>{key}</p>"
            "<p class='mirror-def'>Each bar: the mean step on the target lane, by the engine's spans (AR: its "
            "one-token step, T_AR); ms a token = the step ÷ τ.</p></div>")


@dataclass(frozen=True)
class Chain:
    """The verify cost from load to run (ms; the AR steps are these ÷ the T_AR of their side)."""

    gamma: int
    load_window: float | None   # the window at load (the choice's figure: latency.step_costs), None where the load timed none
    load_t_ar: float | None     # the baseline's one-token step at load
    cached: bool                # the load's window came from the calibration cache (timed at an earlier load)
    cache_step: float | None    # that calibration's one-token step on the target lane
    lane_step: float | None     # the lane's one-token step timed at this load (WholeMachine.lane_ms)
    window: float               # T_pre + Δ, this run's mean
    window_iqr: tuple[float, float]  # this run's windows, the middle half (Q1, Q3)
    t_ar: float                 # this run's T_AR
    readout: float              # T_rv^ee
    step: StepPhases            # the Mirror-SD step by part
    windows: str                # the run's windows in words (window_words: γ+1, or their mean length)


def window_words(run: DecoderRun) -> str:
    """'the window of γ+1 = 2 tokens', or where some windows had another length (context copies) their mean."""
    s, gamma = run.summary, run.gamma
    if not s.steps or s.drafted == gamma * s.steps:
        return f"the window of γ+1 = {gamma + 1} tokens"
    return (f"windows of {1 + s.drafted / s.steps:.2f} tokens on average, the context's copies beside the draft "
            f"model's γ+1 = {gamma + 1}")


def chain(mirror: DecoderRun | None, ar: DecoderRun | None, info=None) -> Chain | None:
    """The chain for a Mirror-SD run and its repeat's AR run (None without both, timed); `info`: the loaded pair's
    pair.PairInfo (its load-time figures are used only when it is the run's pair)."""
    model, bar = latency_model(mirror, ar), step_bar(mirror)
    if model is None or not model.t_ar or bar is None:
        return None
    pre, suf = (per_step_totals(mirror.spans, (s,)) for s in (ev.STAGE_TARGET_PREFIX, ev.STAGE_TARGET_SUFFIX))
    windows = [1e3 * (pre[k] + suf.get(k, 0.0)) for k in pre]
    if not windows:  # every step a window of zero: no verification to chain
        return None
    q1, _, q3 = statistics.quantiles(windows, n=4, method="inclusive") if len(windows) > 1 else windows * 3
    s = mirror.start.settings
    same = info is not None and (info.target, info.draft) == (s.target, s.draft)
    costs = step_costs(info, s.exit_layer) if same else None
    cal, whole = s.target_dtype, s.whole_machine
    return Chain(mirror.gamma, costs.mirror_window(mirror.gamma) if costs else None, costs.base if costs else None,
                 bool(cal and cal.cached), cal.ms(cal.sequence, "step") if cal else None,
                 whole.lane_ms if whole is not None else None, 1e3 * (model.t_pre + model.delta), (q1, q3),
                 1e3 * model.t_ar, 1e3 * model.t_rv_ee, bar, window_words(mirror))


def chain_html(c: Chain) -> str:
    """The chain as one table: each figure once, in ms and in AR steps, with its definition; then why the run's
    window differs from the load's, when it differs by more than the run's spread."""
    parts = dict(c.step.parts)
    steps = lambda ms, t_ar=c.t_ar: f"{ms / t_ar:.2f}"  # noqa: E731
    rows = []
    if c.load_window is not None:
        rows.append(("window at load", c.load_window, steps(c.load_window, c.load_t_ar),
                     f"the target's forward of γ+1 = {c.gamma + 1} tokens as the load timed it (the figure the choice "
                     f"of γ, κ modelled with), over the baseline's step then ({c.load_t_ar:.2f} ms)"))
    rows.append(("window", c.window, steps(c.window), f"T_pre + Δ in this run: layers 1..ℓ_e, then ℓ_e+1..N, over "
                 f"{c.windows} (split at ℓ_e)"))
    rows.append(("verification", c.window + c.readout, steps(c.window + c.readout),
                 "+ the early-exit readout T_rv^ee (norm, LM head and top-κ at ℓ_e, sent to the draft lane)"))
    total = c.window + c.readout
    for name in ("accept", "wait for the draft", OTHER[0]):
        total += parts.get(name, 0.0)
        rows.append((f"+ {name}", total, steps(total), _definition(name)))
    rows[-1] = ("step", c.step.step_ms, steps(c.step.step_ms), "+ the rest: " + OTHER[1] + "; the whole step as "
                "measured (= the bar above)")
    body = "".join(f"<tr><th>{html.escape(a)}</th><td>{b:.2f} ms</td><td>{x} AR steps</td>"
                   f"<td class='mirror-def'>{html.escape(d)}</td></tr>" for a, b, x, d in rows)
    return ("<table class='mirror-table' id='mirror-chain'><tr><th>the verify cost</th><th>ms</th><th>÷ T_AR</th>"
            f"<th>definition</th></tr>{body}</table><p class='mirror-def'>T_AR: the AR run's mean one-token step, "
            f"{c.t_ar:.2f} ms (at load: the baseline's step then). {html.escape(load_gap(c))}</p>")


def _definition(name: str) -> str:
    """A Mirror-SD step part's definition."""
    return next(d for n, _, d in PARTS["mirror"] if n == name) if name != OTHER[0] else OTHER[1]


def load_gap(c: Chain) -> str:
    """Why this run's window differs from the load's, in numbers ('' when the load's lies within the run's spread)."""
    if c.load_window is None:
        return "The load timed no window for this pair (a forced dtype, or another pair loaded since)."
    q1, q3 = c.window_iqr
    if round(q1, 2) <= round(c.load_window, 2) <= round(q3, 2):  # as the page shows them (0.01 ms)
        return (f"The load's window ({c.load_window:.2f} ms) lies within this run's middle half "
                f"({q1:.2f}–{q3:.2f} ms): "
                "the run kept the load's promise on this term.")
    text = (f"This run's window took {c.window:.2f} ms against {c.load_window:.2f} ms at load "
            f"(×{c.window / c.load_window:.2f}; "
            f"its middle half {q1:.2f}–{q3:.2f} ms), and AR's step {c.t_ar:.2f} against {c.load_t_ar:.2f} ms "
            f"(×{c.t_ar / c.load_t_ar:.2f}), so in AR steps the window went from {c.load_window / c.load_t_ar:.2f} to "
            f"{c.window / c.t_ar:.2f}.")
    if c.cached and c.cache_step and c.lane_step:
        text += (f" The load's window came from the calibration cache (an earlier load): its one-token step on the "
                 f"target lane was {c.cache_step:.2f} ms, where this load timed {c.lane_step:.2f} ms "
                 f"(×{c.lane_step / c.cache_step:.2f}).")
    return text


# The terms the load's model and the run's share (WhatIf knobs), each moved alone from the load's value to the run's.
TERMS = (("AR's step T_AR", "t_ar_ms"), ("the window's forward", "window"), ("the exit layer's split", "suffix_share"),
         ("the draft's time per token", "draft_ms"), ("the branch batch's cost", "branch_factor"),
         ("the readout and messages", "overhead_ms"), ("τ", "tau"), ("the fallback frequency", "ff"))


def moved(load: WhatIf, run: WhatIf) -> list[tuple[str, float]]:
    """Per term: the modelled Mirror-SD speedup with only that term at the run's value, the largest move first."""
    base = prediction(load)["mirror_x"]
    out = []
    for name, knob in TERMS:
        if knob == "window":  # the window's ms moves; T_AR stays the load's
            w = replace(load, verify_ratio=run.verify_ratio * run.t_ar_ms / load.t_ar_ms)
        elif knob == "t_ar_ms":  # T_AR moves; the window's ms stays the load's
            w = replace(load, t_ar_ms=run.t_ar_ms, verify_ratio=load.verify_ratio * load.t_ar_ms / run.t_ar_ms)
        else:
            w = replace(load, **{knob: getattr(run, knob)})
        out.append((name, prediction(w)["mirror_x"]))
    return sorted(out, key=lambda t: -abs(t[1] - base))


def choice_check(mirror: DecoderRun, ar: DecoderRun, info) -> str:
    """The load's modelled speedup beside the measured one and the run's own model, with the term that moved most
    ('' where the run did not use the load's choice of γ, κ or the load timed too little)."""
    s = mirror.start.settings
    if not s.spec_note or info is None or (info.target, info.draft) != (s.target, s.draft):
        return ""
    load, model = WhatIf.from_load(info), latency_model(mirror, ar)
    measured = speedup(ar, mirror)[0]
    if load is None or model is None or not model.t_ar or measured is None:
        return ""
    run = WhatIf.from_model(model, mirror.gamma)
    (name, alone), *_ = moved(load, run)
    return (f"The load chose γ {s.request.spec.gamma}, κ {s.request.spec.kappa} here as modelled "
            f"{prediction(load)['mirror_x']:.2f}× AR; this run's own latency model says "
            f"{prediction(run)['mirror_x']:.2f}× "
            f"and it measured {measured:.2f}×. The term that moved most: {name} ({_value(load, name)} at load, "
            f"{_value(run, name)} here), which alone takes the load's model to {alone:.2f}×.")


def _value(w: WhatIf, name: str) -> str:
    knob = dict(TERMS)[name]
    if knob == "window":
        return f"{w.verify_ratio * w.t_ar_ms:.2f} ms"
    v = getattr(w, knob)
    return f"{v:.2f} ms" if knob.endswith("_ms") else f"{v:.2f}"


def sd_reason(sd: DecoderRun | None, mirror: DecoderRun | None, x_sd: float | None = None) -> str:
    """Mirror ÷ vanilla SD in one step's parts: the window against SD's verify, the readout SD does not have, each
    one's wait for the draft (Mirror-SD: a branch or a miss's rollout; SD: its serial rollout), the largest first;
    where these steps put the other decoder ahead per token than `x_sd` (the repeats' median wall ratio) does, it
    says that the two readings disagree instead of leaving them side by side."""
    a, b = step_bar(sd), step_bar(mirror)
    if a is None or b is None:
        return ""
    pb = dict(b.parts)
    plain = " and its plain steps' passes" if pb.get("verify") else ""  # windows of zero: no early exit
    names = {"passes": f"the window ({_cores(mirror)}){plain} against SD's verify ({_cores(sd)})",
             "readout": "the early-exit readout", "wait": "the wait for the draft", "accept": "acceptance and the rest"}
    terms = [(names[k], m, s) for k, (m, s) in versus_sd(pb, dict(a.parts)).items()]
    terms.sort(key=lambda t: -abs(t[1] - t[2]))
    said = "; ".join(f"{name} {m:.2f} vs {s:.2f} ms" for name, m, s in terms)
    per_token = (b.step_ms / b.tau, a.step_ms / a.tau)
    disagree = ""
    if x_sd is not None and (per_token[0] < per_token[1]) != (x_sd >= 1):
        ahead, behind = ("Mirror-SD", "SD") if per_token[0] < per_token[1] else ("SD", "Mirror-SD")
        disagree = (f" These steps put {ahead} ahead per token, while the median of the repeats' wall times (the "
                    f"prefill included) puts {behind} ahead ({x_sd:.2f}×): the readings disagree, so this run does not "
                    "settle which of the two is faster.")
    return (f"Against vanilla SD a step cost {b.step_ms:.2f} vs {a.step_ms:.2f} ms (τ {b.tau:.2f} vs {a.tau:.2f}: "
            f"{per_token[0]:.2f} vs {per_token[1]:.2f} ms a token), by part, the largest difference first: "
            f"{said}.{disagree}")


def _cores(run: DecoderRun) -> str:
    """Where the run's target ran: 'every core' (ar and sd where they run there), its lane's 'N cores', or for
    mirror with the draft lane's cores lent 'every core to the exit, then N cores'."""
    s = run.start.settings
    if s.serial_cpus and run.decoder in SERIAL_DECODERS:
        return "every core"
    n = len(s.lanes.target_cpus) if s.lanes.target_device == "cpu" else 0
    own = f"{n} core{'s' if n != 1 else ''}" if n else s.lanes.target_device
    return f"every core to the exit, then {own}" if s.lend_cpus and run.decoder == "mirror" else own


def costs_html(rep: dict[str, DecoderRun], info=None) -> str:
    """The fold under the verdict: the step bars, the chain from load to run, the load's choice checked."""
    mirror, ar = rep.get("mirror"), rep.get("ar")
    c = chain(mirror, ar, info)
    check = choice_check(mirror, ar, info) if c is not None else ""
    body = bars_html(rep) + (chain_html(c) if c is not None else "")
    if check:
        body += f"<p class='mirror-def' id='mirror-choice-check'>{html.escape(check)}</p>"
    return body
