"""The latency model (docs/ALGORITHM.md §4) and the timing bounds of one run, from its SpanEvents and StepRecords.

Pure functions: spans and step records in, seconds and ratios out. The UI's latency table and the
bench harness both use them, so "modelled" means the same thing everywhere.

- Latency model (means over verification steps ≥ 1, because it predicts an expected step time):
  T_Mirror = T_pre + T_rv^ee + max(Δ, T_draft^gen(γ)) + T_rv^fv;  E[T_step] = T_Mirror + FF · T_fresh;
  speedup vs AR ≈ τ · T_AR / E[T_step].  Vanilla SD: T_SD = T_pre + Δ + T_fresh (serial).
- Physical bound of any speculative decoder with a fully hidden draft: τ · T_AR / T_verify, with
  T_AR the median target-only step and T_verify the median verification pass (medians: robust to
  the VM's drift).
- Hidden-draft bound of one Mirror-SD step: the verification pass + acceptance + the fastest reply
  of the draft lane seen in the run (the message round trip plus adopting a branch); a measured
  step time near it means the draft is hidden.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean, median

from .events import (
    LANE_TARGET,
    STAGE_ACCEPT,
    STAGE_DRAFT_BRANCHES,
    STAGE_DRAFT_ROLLOUT,
    STAGE_EXIT_READOUT,
    STAGE_SELECT_BRANCH,
    STAGE_TARGET_PREFIX,
    STAGE_TARGET_STEP,
    STAGE_TARGET_SUFFIX,
    STAGE_TARGET_VERIFY,
    STAGE_WAIT,
    SpanEvent,
    StepRecord,
)
from .metrics import RunSummary

VERIFY_STAGES = (STAGE_TARGET_VERIFY, STAGE_TARGET_PREFIX, STAGE_EXIT_READOUT, STAGE_TARGET_SUFFIX)


@dataclass(frozen=True)
class LatencyModel:
    """docs/ALGORITHM.md §4 terms (seconds, means over steps ≥ 1 of the Mirror-SD run) and its predictions."""

    t_pre: float          # target layers 1..ℓ_e (target_prefix spans)
    t_rv_ee: float        # early-exit readout + sending top-κ (exit_readout spans)
    delta: float          # Δ: target layers ℓ_e+1..N (target_suffix spans)
    t_branch: float       # T_draft^gen(γ) for the branch batch (draft_branches spans)
    t_rv_fv: float        # final readout: acceptance + adopting a branch (accept + select_branch spans)
    t_fresh: float        # a fresh γ-token rollout (draft_rollout spans)
    ff: float             # fallback frequency
    tau: float
    t_ar: float | None    # one target-only step (target_step spans of an AR run)
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

    @property
    def t_sd(self) -> float:
        """Vanilla SD's step (App. C): the whole verification pass, then a serial fresh rollout."""
        return self.t_pre + self.delta + self.t_fresh

    @property
    def sd_speedup(self) -> float | None:
        return None if not self.t_ar else self.tau * self.t_ar / self.t_sd


def per_step_totals(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> dict[int, float]:
    """Time spent in `stages` per step (several spans of one step add up)."""
    out: dict[int, float] = {}
    for s in spans:
        if s.stage in stages and s.step >= first_step:
            out[s.step] = out.get(s.step, 0.0) + (s.t1 - s.t0)
    return out


def stage_mean(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> float:
    """Mean time per step spent in `stages` (0 when never seen)."""
    totals = per_step_totals(spans, stages, first_step)
    return fmean(totals.values()) if totals else 0.0


def stage_median(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> float | None:
    totals = per_step_totals(spans, stages, first_step)
    return median(totals.values()) if totals else None


def step_times(spans: list[SpanEvent], steps: list[StepRecord]) -> list[float]:
    """Per verification step: its first target span's start → its StepRecord (next window in hand)."""
    starts: dict[int, float] = {}
    for s in spans:
        if s.lane == LANE_TARGET and s.step >= 1:
            starts[s.step] = min(starts.get(s.step, s.t0), s.t0)
    return [r.t_end - starts[r.step] for r in steps if r.step in starts]


def ar_step_time(spans: list[SpanEvent]) -> float | None:
    """T_AR: the median target-only decode step of an ar run."""
    return stage_median(spans, (STAGE_TARGET_STEP,))


def verify_time(spans: list[SpanEvent]) -> float | None:
    """T_verify: the median verification pass (sd: one span; mirror: prefix + readout + suffix)."""
    return stage_median(spans, VERIFY_STAGES)


def physical_bound(tau: float | None, t_ar: float | None, t_verify: float | None) -> float | None:
    """τ · T_AR / T_verify: the speedup over AR with the draft entirely free."""
    return tau * t_ar / t_verify if tau and t_ar and t_verify else None


def hidden_draft_bound(spans: list[SpanEvent]) -> float | None:
    """A Mirror-SD step with the draft hidden: median(verification + acceptance) + the fastest draft reply."""
    verify = per_step_totals(spans, VERIFY_STAGES + (STAGE_ACCEPT,))
    waits = per_step_totals(spans, (STAGE_WAIT,))
    if not verify or not waits:
        return None
    return median(verify.values()) + min(waits.values())


def latency_model_from_events(spans: list[SpanEvent], steps: list[StepRecord], summary: RunSummary,
                              t_ar: float | None) -> LatencyModel | None:
    """The §4 model from one Mirror-SD run's spans (None without verification steps)."""
    times = step_times(spans, steps)
    if not times:
        return None
    return LatencyModel(
        t_pre=stage_mean(spans, (STAGE_TARGET_PREFIX,)), t_rv_ee=stage_mean(spans, (STAGE_EXIT_READOUT,)),
        delta=stage_mean(spans, (STAGE_TARGET_SUFFIX,)), t_branch=stage_mean(spans, (STAGE_DRAFT_BRANCHES,)),
        t_rv_fv=stage_mean(spans, (STAGE_ACCEPT,)) + stage_mean(spans, (STAGE_SELECT_BRANCH,)),
        t_fresh=stage_mean(spans, (STAGE_DRAFT_ROLLOUT,), first_step=0), ff=summary.fallback_frequency or 0.0,
        tau=summary.tau or 1.0, t_ar=t_ar, measured_step=fmean(times))
