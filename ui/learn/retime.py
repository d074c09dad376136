"""An accelerator-shaped Mirror-SD run for the step player, modelled from a measured one: each step's spans laid out
as the latency model lays a step (docs/ALGORITHM.md §4: T_pre + T_rv^ee + max(Δ, T_branch) + T_rv^fv, plus a fresh
rollout on a miss), re-timed as the accelerator view models them (ui/whatif.py, ACCELERATOR_MODELLED): the
window (prefix + suffix) scaled to cost one AR step (T_AR from the AR run), the readout, acceptance and adopting a
branch scaled by the same factor, and the branch batch capped at the run's mean fresh rollout (its own device's rows
are cheap). A fresh rollout keeps its measured length (the draft's time per token is kept). Modelled, not measured:
the page says so wherever it shows one.
"""
from __future__ import annotations

from statistics import fmean

from mirror_core import events as ev
from mirror_core.events import SpanEvent
from mirror_core.latency import ar_step_time, per_step_totals

from ..session import DecoderRun

SCALED = (ev.STAGE_EXIT_READOUT, ev.STAGE_ACCEPT, ev.STAGE_SELECT_BRANCH)  # shrink with the window


def _lengths(spans: list[SpanEvent]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in spans:
        out[s.stage] = out.get(s.stage, 0.0) + (s.t1 - s.t0)
    return out


def retime_step(spans: list[SpanEvent], t_ar: float, fresh: float | None = None) -> list[SpanEvent]:
    """One step's spans, laid out as the latency model lays a step, re-timed as the accelerator view models them:
    the window costing one AR step (`t_ar`; never more than measured), the readout, acceptance and adopting a
    branch by the same factor, the branch batch at most `fresh` (a fresh rollout's length; None: as measured)."""
    if not spans:
        return []
    n, step, t0 = _lengths(spans), spans[0].step, min(s.t0 for s in spans)
    window = n.get(ev.STAGE_TARGET_PREFIX, 0.0) + n.get(ev.STAGE_TARGET_SUFFIX, 0.0)
    scale = min(t_ar / window, 1.0) if window else 1.0
    n = {k: v * scale if k in SCALED or k in (ev.STAGE_TARGET_PREFIX, ev.STAGE_TARGET_SUFFIX) else v
         for k, v in n.items()}
    if fresh is not None and ev.STAGE_DRAFT_BRANCHES in n:
        n[ev.STAGE_DRAFT_BRANCHES] = min(n[ev.STAGE_DRAFT_BRANCHES], fresh)
    out, t = [], t0
    for stage in (ev.STAGE_TARGET_PREFIX, ev.STAGE_EXIT_READOUT, ev.STAGE_TARGET_SUFFIX):
        if stage in n:
            out.append(SpanEvent(ev.LANE_TARGET, stage, t, t + n[stage], step))
            t += n[stage]
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
    rollouts = per_step_totals(run.spans, (ev.STAGE_DRAFT_ROLLOUT,), first_step=0)
    fresh = fmean(rollouts.values()) if rollouts else None
    shaped.spans = [r for step, spans in sorted(by_step.items())
                    for r in (retime_step(sorted(spans, key=lambda s: s.t0), t_ar, fresh) if step >= 1 else spans)]
    return shaped
