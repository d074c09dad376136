"""Which branches to precompute when the draft lane can afford only B of the κ(γ+1) candidates.

A branch (j, v) is used next step iff the target accepts exactly j draft tokens and its token
at slot j is v. The planner scores every candidate by an estimate of that probability,

    P(A = j, c = v) ≈ Π_{i<j} a(d_{i+1}) · (1 − a(d_{j+1})) · r(rank of v),   (the bonus slot γ has no
                                                                               (1 − a) factor)

and keeps the B best. a(d) is the probability that the target accepts a draft token, estimated
separately for tokens the early exit ranks first and for the rest; r(k) is the probability that
the target's token is the exit's k-th candidate. Both are counted on this run's own steps, with a
uniform prior (the exit's raw probabilities are too flat on small targets to use directly; measured:
BENCHMARKS.md's history, "Figures behind design choices").
Only efficiency depends on this: the output never does.

The budget is fixed, or automatic (AUTO_BRANCH_BUDGET): the allowance starts at every candidate
and after each step moves halfway towards the row count whose batch would have taken HEADROOM of
the target's suffix (the time the draft lane has before the target needs the next window), assuming
the batch time scales with its rows. With a fixed per-batch overhead this still converges, from
above, to the rows that fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import AUTO_BRANCH_BUDGET
from .messages import ExitReadout

HEADROOM = 0.9  # auto budget: aim the branch batch at this share of the target's suffix


@dataclass
class BranchPlanner:
    budget: int            # rows per step; 0 = every candidate; AUTO_BRANCH_BUDGET = fit to the suffix
    kappa: int
    parallel: bool = True   # the draft lane runs beside the target; auto mode adapts only then
    allowance: float = 0.0  # auto mode: the current row allowance (0 = not measured yet: every candidate)
    # [n, accepted] for draft tokens the exit ranked first / not first; prior: 1 of 2
    accepts_top1: list[int] = field(default_factory=lambda: [2, 1])
    accepts_other: list[int] = field(default_factory=lambda: [2, 1])
    rank_counts: list[int] = field(default_factory=list)   # target token at exit rank k (index κ: below top-κ)

    def __post_init__(self) -> None:
        if not self.rank_counts:
            self.rank_counts = [1] * (self.kappa + 1)

    def select(self, ids: torch.Tensor, draft_is_top1: list[bool]) -> torch.Tensor:
        """ids [γ+1, κ] exit candidates by rank (−1 = none), draft_is_top1 [γ] → ids with all but the
        budget's likeliest (slot, candidate) pairs set to −1."""
        limit = round(self.allowance) if self.budget == AUTO_BRANCH_BUDGET else self.budget
        if not limit or limit >= int((ids >= 0).sum()):
            return ids
        accept = [self._rate(self.accepts_top1 if top1 else self.accepts_other) for top1 in draft_is_top1]
        total = sum(self.rank_counts)
        scores = []
        reach = 1.0
        for j in range(ids.shape[0]):
            stop_here = 1.0 - accept[j] if j < len(accept) else 1.0
            for k in range(ids.shape[1]):
                if ids[j, k] >= 0:
                    scores.append((reach * stop_here * self.rank_counts[k] / total, j, k))
            if j < len(accept):
                reach *= accept[j]
        keep = torch.full_like(ids, -1)
        for _, j, k in sorted(scores, key=lambda s: (-s[0], s[1], s[2]))[:limit]:  # ties: earlier slot, rank
            keep[j, k] = ids[j, k]
        return keep

    def after_step(self, readout: ExitReadout, accepted: int, token: int, rows: int, branch_s: float) -> None:
        """Learn from one step: which draft tokens the target judged, the exit rank of its token c, and (auto
        budget) how long the branch batch of `rows` rows took against the target's suffix."""
        for i, top1 in enumerate(readout.draft_is_top1[: accepted + 1]):
            counts = self.accepts_top1 if top1 else self.accepts_other
            counts[0] += 1
            counts[1] += i < accepted
        cands = readout.ranked[accepted]
        self.rank_counts[cands.index(token) if token in cands else self.kappa] += 1
        suffix_s = readout.t_verified - readout.t_sent
        if self.budget != AUTO_BRANCH_BUDGET or not self.parallel or rows <= 0 or branch_s <= 0:
            return
        fit = rows * HEADROOM * suffix_s / branch_s  # the rows whose batch would have taken HEADROOM of the suffix
        self.allowance = min(max(1.0, 0.5 * (rows + fit)), float(len(readout.ranked) * self.kappa))

    @staticmethod
    def _rate(counts: list[int]) -> float:
        return counts[1] / counts[0]
