"""An accelerator-shaped Mirror-SD run for the step player, modelled from a measured one: each step's spans laid out
as the latency model lays a step (docs/ALGORITHM.md §4: T_pre + T_rv^ee + max(Δ, T_branch) + T_rv^fv, plus a fresh
rollout on a miss), with the target's verification pass scaled to cost one AR step (T_AR from the AR run), as a
window of γ+1 rows does where reading the weights is the whole cost. Every other span keeps its measured length.
Modelled, not measured: the page says so wherever it shows one.
"""
from __future__ import annotations

from mirror_core import events as ev
from mirror_core.events import SpanEvent
from mirror_core.latency import ar_step_time

from ..session import DecoderRun


def _lengths(spans: list[SpanEvent]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in spans:
        out[s.stage] = out.get(s.stage, 0.0) + (s.t1 - s.t0)
    return out


def retime_step(spans: list[SpanEvent], t_ar: float, steps: float = 1.0) -> list[SpanEvent]:
    """One step's spans, laid out as the latency model lays a step, its verification pass costing `steps` AR steps."""
    if not spans:
        return []
    n, step, t0 = _lengths(spans), spans[0].step, min(s.t0 for s in spans)
    verify = n.get(ev.STAGE_TARGET_PREFIX, 0.0) + n.get(ev.STAGE_EXIT_READOUT, 0.0) + n.get(ev.STAGE_TARGET_SUFFIX, 0.0)
    scale = steps * t_ar / verify if verify else 1.0
    out, t = [], t0
    for stage in (ev.STAGE_TARGET_PREFIX, ev.STAGE_EXIT_READOUT, ev.STAGE_TARGET_SUFFIX):
        if stage in n:
            out.append(SpanEvent(ev.LANE_TARGET, stage, t, t + scale * n[stage], step))
            t += scale * n[stage]
            if stage == ev.STAGE_EXIT_READOUT:
                sent = t  # M_t reaches the draft lane: its branch batch starts
    branch_end = t
    if ev.STAGE_DRAFT_BRANCHES in n:
        start = sent if ev.STAGE_EXIT_READOUT in n else t0
        branch_end = start + n[ev.STAGE_DRAFT_BRANCHES]
        out.append(SpanEvent(ev.LANE_DRAFT, ev.STAGE_DRAFT_BRANCHES, start, branch_end, step))
    if ev.STAGE_ACCEPT in n:
        out.append(SpanEvent(ev.LANE_TARGET, ev.STAGE_ACCEPT, t, t + n[ev.STAGE_ACCEPT], step))
        t += n[ev.STAGE_ACCEPT]
    ready = max(t, branch_end)  # the draft lane answers once its branches are done: then adopt, or roll out afresh
    for stage in (ev.STAGE_SELECT_BRANCH, ev.STAGE_DRAFT_ROLLOUT):
        if stage in n:
            out.append(SpanEvent(ev.LANE_DRAFT, stage, ready, ready + n[stage], step))
            ready += n[stage]
    if ready > t:
        out.append(SpanEvent(ev.LANE_TARGET, ev.STAGE_WAIT, t, ready, step))
    return sorted(out, key=lambda s: s.t0)


def accelerator_shaped(run: DecoderRun, ar: DecoderRun | None) -> DecoderRun | None:
    """The run with every step ≥ 1 re-timed by retime_step (None without an AR run to take T_AR from)."""
    t_ar = ar_step_time(ar.spans) if ar is not None else None
    if not t_ar or run is None:
        return None
    shaped = DecoderRun(run.decoder, run.namer, start=run.start, steps=run.steps, end=run.end)
    by_step: dict[int, list[SpanEvent]] = {}
    for s in run.spans:
        by_step.setdefault(s.step, []).append(s)
    shaped.spans = [r for step, spans in sorted(by_step.items())
                    for r in (retime_step(sorted(spans, key=lambda s: s.t0), t_ar) if step >= 1 else spans)]
    return shaped
