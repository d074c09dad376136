"""Every millisecond of a step, accounted for: one decoder's mean step split into named phases by the engine's spans.

A step is measured from its first target span to its StepRecord (latency.step_times: the next window in hand). Its
phases are the target lane's spans of that step, summed per phase and averaged over the steps; what no span covers
is "the rest" (the loop's bookkeeping between spans: sampling, commits, records, queueing the events), so the phases
add up to the measured step exactly. Inside the wait for the draft, the draft lane's own rollouts (its spans that
overlap the wait) are told apart from the rest of the wait: messages between the lanes and the draft lane's own
overhead. The bench (bench/rows.py: BenchRow.phases_ms) and the page's step bars (ui/costs.py) read the same split.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from .events import (
    LANE_DRAFT,
    STAGE_ACCEPT,
    STAGE_DRAFT_BRANCHES,
    STAGE_DRAFT_ROLLOUT,
    STAGE_EXIT_READOUT,
    STAGE_TARGET_PREFIX,
    STAGE_TARGET_STEP,
    STAGE_TARGET_SUFFIX,
    STAGE_TARGET_VERIFY,
    STAGE_WAIT,
    SpanEvent,
    StepRecord,
)
from .latency import per_step_totals, step_times
from .metrics import interval_overlap

WAIT = "wait for the draft"
# One step's phases per decoder: (phase, the target lane's stages it sums, its one-line definition).
PHASES = {
    "ar": (("step", (STAGE_TARGET_STEP,), "the target's one-token forward"),),
    "sd": (("verify", (STAGE_TARGET_VERIFY,), "the target's pass over the window, no early exit"),
           ("accept", (STAGE_ACCEPT,), "the acceptance rule"),
           (WAIT, (STAGE_WAIT,), "the next window's serial rollout on the draft lane")),
    "mirror": (("prefix", (STAGE_TARGET_PREFIX,), "layers 1..ℓ_e over the window (T_pre)"),
               ("readout", (STAGE_EXIT_READOUT,), "the early-exit readout at ℓ_e and sending top-κ (T_rv^ee)"),
               ("suffix", (STAGE_TARGET_SUFFIX,), "layers ℓ_e+1..N and the LM head (Δ)"),
               ("verify", (STAGE_TARGET_VERIFY,), "the plain steps' passes (a window of zero: no draft tokens, so no "
                "early exit; on ar's cores)"),
               ("accept", (STAGE_ACCEPT,), "the acceptance rule (part of T_rv^fv)"),
               (WAIT, (STAGE_WAIT,), "the draft lane's answer: a branch adopted, or a fresh rollout on a miss")),
}
WAIT_SPLIT = ("draft rollouts in the wait", "messages and draft overhead in the wait")
REST = ("the rest", "between the spans: the step's bookkeeping (sampling, commits, records) and its events")
DRAFT_WORK = (STAGE_DRAFT_ROLLOUT, STAGE_DRAFT_BRANCHES)


@dataclass(frozen=True)
class StepPhases:
    """One decoder's mean step (AR: one-token step) on the target lane, by phase (ms)."""

    decoder: str
    parts: tuple[tuple[str, float], ...]  # (phase, mean ms a step), the rest last: they add up to step_ms
    step_ms: float                        # measured: first target span → the step's record (AR: T_AR)
    tau: float                            # tokens committed per step (1 for AR)
    draft_in_wait_ms: float = 0.0         # of the wait, the draft lane's own rollouts (the rest: messages, overhead)

    @property
    def overhead_ms(self) -> float:
        """What the step spends beyond the target's passes, the readout and the draft's own work: acceptance, the
        rest, and the wait for the draft beyond its rollouts (messages, the draft lane's overhead)."""
        parts = dict(self.parts)
        wait = max(parts.get(WAIT, 0.0) - self.draft_in_wait_ms, 0.0)
        return parts.get("accept", 0.0) + parts.get(REST[0], 0.0) + wait

    def to_dict(self) -> dict:
        """{phase: ms} with the whole step ("total"), τ and the wait's split: the bench's phases_ms."""
        out = {name: round(ms, 4) for name, ms in self.parts}
        wait = dict(self.parts).get(WAIT)
        if wait is not None:
            out[WAIT_SPLIT[0]] = round(self.draft_in_wait_ms, 4)
            out[WAIT_SPLIT[1]] = round(max(wait - self.draft_in_wait_ms, 0.0), 4)
        return {**out, "total": round(self.step_ms, 4), "tau": round(self.tau, 4)}


def step_phases(decoder: str, spans: list[SpanEvent], steps: list[StepRecord], tau: float | None
                ) -> StepPhases | None:
    """The run's mean step by phase (None for a decoder without phases, or a run with no timed steps)."""
    if decoder not in PHASES:
        return None
    if decoder == "ar":
        totals = per_step_totals(spans, (STAGE_TARGET_STEP,))
        if not totals:
            return None
        mean = 1e3 * fmean(totals.values())
        return StepPhases("ar", (("step", mean),), mean, 1.0)
    times = step_times(spans, steps)
    if not times:
        return None
    n, step = len(times), 1e3 * fmean(times)
    parts = [(name, 1e3 * sum(per_step_totals(spans, stages).values()) / n) for name, stages, _ in PHASES[decoder]]
    parts.append((REST[0], max(step - sum(ms for _, ms in parts), 0.0)))
    waits = [(s.t0, s.t1) for s in spans if s.stage == STAGE_WAIT and s.step >= 1]
    work = [(s.t0, s.t1) for s in spans if s.lane == LANE_DRAFT and s.stage in DRAFT_WORK]
    return StepPhases(decoder, tuple(parts), step, tau or 1.0, 1e3 * interval_overlap(waits, work) / n)


def versus_sd(mirror: dict[str, float], sd: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Mirror-SD's mean step against vanilla SD's by the terms that separate them (ms, from each decoder's phases:
    StepPhases.parts or to_dict): the target's passes (Mirror-SD's window, its plain steps' passes included, against
    SD's verify), the readout SD does not have, each one's wait for the draft, and acceptance with the rest."""
    return {"passes": (mirror["prefix"] + mirror["suffix"] + mirror.get("verify", 0.0), sd["verify"]),
            "readout": (mirror["readout"], 0.0), "wait": (mirror[WAIT], sd[WAIT]),
            "accept": (mirror["accept"] + mirror[REST[0]], sd["accept"] + sd[REST[0]])}


# Every key a StepPhases.to_dict can hold, in one order (the CSV's phase columns, the same whatever ran).
PHASE_KEYS = tuple(dict.fromkeys([name for parts in PHASES.values() for name, _, _ in parts] + [REST[0], *WAIT_SPLIT,
                                                                                                  "total", "tau"]))
