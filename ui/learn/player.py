"""One Mirror-SD step of a real run, slowed down: its phases on one time axis, each with one sentence of narration
naming the step's actual tokens and the measured milliseconds of its spans (StepRecord + SpanEvents → HTML).

Phases, in the order the engine runs them (docs/ALGORITHM.md §2): the window enters the target; layers 1..ℓ_e;
the early-exit readout and the message M_t; the target's last layers while the draft lane rolls out a branch per
candidate; acceptance; then a hit adopts the matching branch, or a miss rolls out afresh.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from mirror_core import SpanEvent, StepRecord
from mirror_core.events import (
    LANE_TARGET,
    STAGE_ACCEPT,
    STAGE_DRAFT_BRANCHES,
    STAGE_DRAFT_ROLLOUT,
    STAGE_EXIT_READOUT,
    STAGE_SELECT_BRANCH,
    STAGE_TARGET_PREFIX,
    STAGE_TARGET_SUFFIX,
    STAGE_TARGET_VERIFY,
    STAGE_WAIT,
)

from mirror_core.latency import stage_median

from ..plots import DECODER_COLORS, STAGE_STYLE
from ..render import count, drafts
from ..session import DecoderRun, pick_step

# One colour code and one name per stage across the page: the Run tab's lane timeline's (ui/plots.py).
WIDTH, LANE_H, LEFT = 760, 30, 60  # the timeline's drawing units; the SVG scales to the page's width (viewBox)


@dataclass(frozen=True)
class Phase:
    title: str
    text: str      # one sentence, with this step's tokens and milliseconds
    until: float   # spans that start before this time (seconds on the run's clock) are drawn


def _ms(spans: list[SpanEvent], stage: str) -> float:
    return sum(s.t1 - s.t0 for s in spans if s.stage == stage) * 1e3


def _first(spans: list[SpanEvent], stage: str) -> SpanEvent | None:
    return next((s for s in spans if s.stage == stage), None)


def phases(run: DecoderRun, rec: StepRecord) -> tuple[list[Phase], list[SpanEvent]]:
    """The step's phases and its spans (those the engine tagged with this step)."""
    spans = sorted((s for s in run.spans if s.step == rec.step), key=lambda s: s.t0)
    if not spans:
        return [], []
    name = run.namer.show
    code = lambda t: f"<code>{html.escape(name(t))}</code>"  # noqa: E731
    gamma = rec.drafted
    end = max(s.t1 for s in spans)
    at = lambda stage, default: (_first(spans, stage).t1 if _first(spans, stage) else default)  # noqa: E731
    start = spans[0].t0
    out = [Phase("Window in", f"The target reads the window [w0, {drafts(gamma)}] = "
                 f"{' '.join(code(t) for t in rec.window)} in one forward pass; this window "
                 + {"branch": "was a reused branch (a hit at the step before).", "context": "was copied from the "
                    "context (the prompt and the output so far).", "zero": "had no draft tokens (a window of zero: "
                    "no window was modelled to beat a plain step)."}.get(rec.source, "was a fresh rollout."),
                 start)]
    layer = run.start.settings.exit_layer if run.start else None
    n = "ℓ_e" if layer is None else str(layer)
    out.append(Phase("Layers 1..ℓ_e", f"Layers 1..{n} run over the γ+1 = {gamma + 1} positions: "
                     f"{_ms(spans, STAGE_TARGET_PREFIX):.1f} ms.", at(STAGE_TARGET_PREFIX, start)))
    cands = "; ".join(f"slot {s + 1}: " + ", ".join(f"{code(t)} {math.exp(lp):.2f}" for t, lp in zip(ids, lps) if t >= 0)
                      for s, (ids, lps) in enumerate(zip(rec.topk_ids, rec.topk_logprobs)))
    out.append(Phase("Early exit sends M_t", f"At layer {n} the early exit reads out each slot's top-κ ({cands or 'none'}) "
                     f"and sends their ids and log-probs to the draft lane: {_ms(spans, STAGE_EXIT_READOUT):.1f} ms.",
                     at(STAGE_EXIT_READOUT, start)))
    suffix, branches = _ms(spans, STAGE_TARGET_SUFFIX), _ms(spans, STAGE_DRAFT_BRANCHES)
    rows = len(rec.branch_rows)
    out.append(Phase("Suffix ∥ branches", f"While the target runs its last layers ({suffix:.1f} ms), the draft lane "
                     f"rolls out {rows} branch{'es' if rows != 1 else ''}, {count(gamma, 'token')} each, one per candidate "
                     f"({branches:.1f} ms): " + ("hidden, it ends first." if branches <= suffix else
                                                 f"{branches - suffix:.1f} ms longer than the suffix."),
                     max(at(STAGE_TARGET_SUFFIX, start), at(STAGE_DRAFT_BRANCHES, start))))
    kept = " ".join(code(t) for t in rec.window[1: 1 + rec.accepted]) or "none"
    kind = "bonus" if rec.accepted == rec.drafted else "correction"
    out.append(Phase("Acceptance", f"The target keeps A_t = {rec.accepted} of {count(gamma, 'draft token')} ({kept}) and adds "
                     f"its {kind} c = {code(rec.token)} at slot s_t = A_t + 1 = {rec.accepted + 1}: {count(rec.committed, 'token')} "
                     "committed.", at(STAGE_ACCEPT, start)))
    if rec.hit:
        text = (f"Hit: c = {code(rec.token)} was a candidate at slot s_t = {rec.accepted + 1}, so its branch is the "
                f"next window at once; the draft lane adopts its cache ({_ms(spans, STAGE_SELECT_BRANCH):.1f} ms).")
    elif rec.hit is False:
        text = (f"Miss: no branch starts with c = {code(rec.token)}, so the draft rolls out {count(gamma, 'fresh token')} "
                f"({_ms(spans, STAGE_DRAFT_ROLLOUT):.1f} ms) while the target waits ({_ms(spans, STAGE_WAIT):.1f} ms).")
    else:
        text = "No branches this step (the run ended, or the draft lane did not answer)."
    out.append(Phase("Hit" if rec.hit else "Miss" if rec.hit is False else "End", text, end))
    return out, spans


def sd_beside(run: DecoderRun, rec: StepRecord, spans: list[SpanEvent], sd: DecoderRun | None,
              modelled: bool = False) -> str:
    """The same step's time under vanilla SD, from measured spans: SD verifies without an early exit, then drafts
    its next window serially (medians of the SD run's spans when one ran, else of this run's fresh rollouts)."""
    mirror_ms = (max(s.t1 for s in spans) - spans[0].t0) * 1e3
    pool = sd.spans if sd is not None and sd.spans else run.spans
    verify = stage_median(pool, (STAGE_TARGET_VERIFY,))                       # seconds, per step; None: no SD
    if verify is None:  # no SD run: this step's own pass, prefix + readout + suffix
        verify = sum(_ms(spans, st) for st in (STAGE_TARGET_PREFIX, STAGE_EXIT_READOUT, STAGE_TARGET_SUFFIX)) / 1e3
    draft = stage_median(pool, (STAGE_DRAFT_ROLLOUT,))                         # steps ≥ 1: not the first window's
    if draft is None:
        return ("<p class='mirror-def'>Vanilla SD beside it: run SD too (or a Mirror-SD run with a miss) to have a "
                "measured serial rollout to compare with.</p>")
    source = ("the SD run's median spans" if pool is not run.spans else "this run's verification and fresh rollouts"
              + (", re-timed: modelled" if modelled else ""))
    verify, draft = verify * 1e3, draft * 1e3
    how = "re-timed (modelled)" if modelled else "as measured"
    sd_ms = verify + draft
    scale = 300 / max(sd_ms, mirror_ms)
    bar = lambda ms, colour: f"<span class='mirror-bar' style='display:inline-block;width:{ms * scale:.0f}px;background:{colour}'></span>"  # noqa: E731
    return (f"<p><b>Vanilla SD on the same step</b> ({source}): verify {verify:.1f} ms, then draft the next "
            f"{count(rec.drafted, 'token')} serially, {draft:.1f} ms: {sd_ms:.1f} ms "
            f"{bar(sd_ms, DECODER_COLORS['sd'])}<br>Mirror-SD, this step {how}: {mirror_ms:.1f} ms "
            f"{bar(mirror_ms, DECODER_COLORS['mirror'])} (its draft works during the target's last layers).</p>")


def player_html(run: DecoderRun | None, step, phase, sd: DecoderRun | None = None, modelled: bool = False) -> str:
    """The step's phases on its time axis, the stages' legend, the phase's sentence and vanilla SD beside it;
    `modelled`: the run's spans are re-timed (ui/learn/retime.py), and the comparison says so."""
    if run is None or run.decoder != "mirror" or not run.steps:
        return "<p><i>Run Mirror-SD on the Run tab, then pick a step to play.</i></p>"
    rec = pick_step(run, step, run.steps[0].step)
    if isinstance(rec, str):
        return rec
    steps, spans = phases(run, rec)
    if not steps:
        return f"<p><i>Step {rec.step} has no timed spans.</i></p>"
    k = min(max(int(phase or 0), 0), len(steps) - 1)
    current = steps[k]
    t0, t1 = spans[0].t0, max(max(s.t1 for s in spans), spans[0].t0 + 1e-6)
    x = lambda t: LEFT + (t - t0) / (t1 - t0) * (WIDTH - LEFT - 10)  # noqa: E731
    rects = []
    for s in spans:
        if s.t0 > current.until + 1e-9:
            continue
        y = 8 if s.lane == LANE_TARGET else 8 + LANE_H + 6
        w = max(x(s.t1) - x(s.t0), 1.0)
        name, colour = STAGE_STYLE.get(s.stage, (s.stage, "#9ca3af"))
        label = f"{name} {1e3 * (s.t1 - s.t0):.1f} ms"
        text = (f"<text x='{x(s.t0) + 3:.1f}' y='{y + 19}' font-size='11' fill='{_ink(colour)}'>"
                f"{html.escape(label)}</text>" if w > 6.5 * len(label) else "")
        rects.append(f"<g><title>{html.escape(label)}</title><rect x='{x(s.t0):.1f}' y='{y}' width='{w:.1f}' "
                     f"height='{LANE_H}' fill='{colour}' rx='3'/>{text}</g>")
    cursor = x(min(current.until, t1))
    svg = (f"<svg viewBox='0 0 {WIDTH} {2 * LANE_H + 40}' width='100%' style='max-width:{WIDTH}px;height:auto' "
           "role='img' aria-label='step timeline'>"
           f"<text x='4' y='{8 + LANE_H // 2 + 4}' font-size='12'>target</text>"
           f"<text x='4' y='{14 + LANE_H + LANE_H // 2 + 4}' font-size='12'>draft</text>" + "".join(rects)
           + f"<line x1='{cursor:.1f}' x2='{cursor:.1f}' y1='2' y2='{2 * LANE_H + 18}' stroke='#111' "
             f"stroke-dasharray='3,2'/><text x='{LEFT}' y='{2 * LANE_H + 34}' font-size='11' fill='#6b7280'>"
             f"0 ms</text><text x='{WIDTH - 70}' y='{2 * LANE_H + 34}' font-size='11' fill='#6b7280'>"
             f"{1e3 * (t1 - t0):.1f} ms</text></svg>")
    trail = " → ".join(f"<b>{html.escape(p.title)}</b>" if i == k else html.escape(p.title)
                       for i, p in enumerate(steps))
    return (f"<p class='mirror-def'>Step {rec.step}, phase {k + 1} of {len(steps)}: {trail}</p>{svg}"
            + legend(spans) + f"<p id='mirror-player-text'>{current.text}</p>" + sd_beside(run, rec, spans, sd, modelled))


def legend(spans: list[SpanEvent]) -> str:
    """The stages this step's timeline draws, each as a swatch and its name (readable at any width)."""
    seen = dict.fromkeys(s.stage for s in spans)
    items = "".join(f"<span><i style='--c:{colour}'></i>{html.escape(name)}</span>"
                    for name, colour in (STAGE_STYLE.get(st, (st, "#9ca3af")) for st in seen))
    return f"<div class='mirror-plot-legend' id='mirror-player-legend'>{items}</div>"


def _ink(colour: str) -> str:
    """Black or white text, whichever reads on a bar of this colour (#rrggbb)."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#111" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def phase_count(run: DecoderRun | None, step) -> int:
    if run is None or run.decoder != "mirror" or not run.steps:
        return 0
    rec = pick_step(run, step, run.steps[0].step)
    return 0 if isinstance(rec, str) else len(phases(run, rec)[0])
