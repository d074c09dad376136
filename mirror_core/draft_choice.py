"""The draft lane's choice of each step's window: its source and length, or none at all (a window of zero).

At every ResolveRequest the draft lane values each window it could propose next by the latency model, with this
run's own measured costs and acceptance (docs/ALGORITHM.md §2.13), and proposes the best:

    value = E[tokens the verification commits] / (the verification + the target lane's wait for the window)

Candidates: the draft model's rollout of each length 1..γ; a branch already rolled out for the target's c (Mirror-SD
on a hit: no draft work left) of each length 1..γ; the context draft's window of each length 1..L (context_draft.py);
and a plain target step, a window of zero tokens (the target verifies [w0] alone and commits its own token: 1 token
for a one-row verification). With SpecConfig.zero_windows off the plain step is not on offer and a model or branch
window is always γ long (raw speculation); the context window's length is still chosen.

Acceptance  a model or branch window of g tokens commits E(g) = 1 + Σ_{i≤g} Π_{j≤i} a_j, a_j this run's acceptance
            at position j given 1..j−1 accepted, each new observation weighing most (DECAY); a_1 also learns from the
            draft's agreement with the tokens the target committed without it (the rows its catch-up forward computes
            anyway); a context window of L tokens 1 + Σ_{i≤L} q^i (context_draft.py). Both are capped at the budget.
Costs       each the median of this run's last RECENT samples: the verification of r rows (the run's at r rows once
            timed MIN_TIMED times, else the load's figure: a plain step's where plain steps run, more rows' at the
            run's scale); the wait for a window from its source
            beyond the draft's own work; for the model, that work: a draft step per token, and each row its catch-up
            feeds beyond the first (a draft that sat out is fed the tokens committed meanwhile in one forward when it
            next drafts; the prompt's rows, which the first draft pays whenever it comes, are not a window's cost).
Probes      while plain steps win nothing shows whether the draft has started to agree: after `probe_gap` committed
            tokens without news of the model's acceptance a 1-token model window is proposed anyway; the gap starts at
            PROBE_GAP and doubles, up to PROBE_GAP_MAX, after each probe that leaves the model losing.
Only efficiency depends on this: the target verifies every window, so the output never does.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from .config import MAX_GAMMA, SpecConfig
from .context_draft import ContextDrafter, ContextOffer, ContextPlan, ContextProposal
from .metrics import SOURCES

# where a window came from (metrics.SOURCES, whose order the per-source counters keep): a fresh rollout of the draft
# model, a precomputed branch adopted on a hit (Mirror-SD), a copy from the prompt and the output (context_draft.py),
# or none: a window of zero tokens, a plain target step
SOURCE_MODEL, SOURCE_BRANCH, SOURCE_CONTEXT, SOURCE_ZERO = SOURCES

DECAY = 0.9                  # an observation of a position's acceptance weighs this much less after each newer one
PRIOR = (0.5, 2.0)           # (acceptance, weight in observations) each position starts from: τ(1) = 1.5
ASSUMED_ROW_STEPS = 0.25     # cost of a row beyond the first where the load timed no forward by rows
ASSUMED_STEP_S = 0.005       # a target step (s) where the load timed none, until the run times its own
ASSUMED_DRAFT_STEPS = 0.15   # a draft step in target steps until the run times one (the default pair: 0.76 of 5 ms)
ASSUMED_FEED_ROW = 0.1       # a catch-up row beyond the first, in draft steps, until the run times one
RECENT = 8                   # a cost is the median of its last this many samples ...
MIN_TIMED = 3                # ... and a row count's own once it has this many (else the load's shape at the run's scale)
PROBE_GAP = 8                # committed tokens without news of the model's acceptance before a probe window ...
PROBE_GAP_MAX = 64           # ... doubling up to this while probes keep losing


@dataclass(frozen=True)
class ChoicePlan:
    """What the draft lane needs to choose one request's windows (sent with DraftStart)."""
    zero_windows: bool                # SpecConfig.zero_windows: a plain step is on offer, and γ a per-step choice
    max_new_tokens: int               # the request's budget: a window never proposes past it
    window_steps: tuple[float, ...]   # the target's forward of r = 1, 2, .. rows in one-row steps (measured at load);
    #                                   () = not timed on this runner: 1 + ASSUMED_ROW_STEPS per extra row
    step_s: float = 0.0               # the load's one-row step (s); 0 = not timed (ASSUMED_STEP_S)
    context: ContextPlan | None = None  # the context draft's settings (None: off)
    plain_s: float = 0.0              # the load's plain step where plain steps run (s; every core where ar runs
    #                                   there); 0 = not timed (the one-row step at the run's scale)

    def steps(self, rows: int) -> float:
        """The forward of `rows` rows in one-row steps; past the timed rows, extended along the last timed slope."""
        w = self.window_steps
        if not w:
            return 1.0 + ASSUMED_ROW_STEPS * (rows - 1)
        if rows <= len(w):
            return w[rows - 1]
        slope = (w[-1] - w[-3]) / 2 if len(w) >= 3 else ASSUMED_ROW_STEPS
        return w[-1] + max(slope, 0.0) * (rows - len(w))


def choice_plan(spec: SpecConfig, max_new_tokens: int, window_steps: tuple[float, ...], step_s: float,
                plain_s: float = 0.0) -> ChoicePlan:
    """The plan for a request's settings and the load's row costs."""
    context = spec.context
    return ChoicePlan(spec.zero_windows, max_new_tokens, window_steps, step_s,
                      ContextPlan(context.min_match, context.max_window) if context.enabled else None, plain_s)


@dataclass(frozen=True)
class Candidate:
    """One window the draft lane could propose, as the latency model values it."""
    source: str        # SOURCES: model, branch, context, or zero (a plain target step)
    size: int          # tokens proposed (0: the target verifies [w0] alone)
    expected: float    # tokens its verification is modelled to commit
    ms: float          # its modelled cost: the verification of size + 1 rows and the wait for the window (ms)

    @property
    def per_ms(self) -> float:
        """Modelled tokens committed per millisecond: what the choice maximises."""
        return self.expected / self.ms if self.ms > 0 else math.inf


@dataclass(frozen=True)
class WindowChoice:
    """Why a step's window is what it is (it travels with DraftWindow into the step record)."""
    chosen: Candidate             # the window proposed (a window of zero: the plain step)
    other: Candidate | None       # the best candidate of another source (None: none was on offer)
    probe: bool = False           # a model window proposed though modelled to lose, to measure the draft again
    measured: bool = False        # the costs are this run's own timings (False: the load's, before any)
    promised: bool = False        # a plain step promised at the step before (the target lane had started it)


def _recent() -> deque:
    return deque(maxlen=RECENT)


def _median(samples) -> float | None:
    return statistics.median(samples) if samples else None


@dataclass
class RunCosts:
    """What this run measured, in seconds: the target's verifications by rows, the waits for windows by source, and
    the draft's steps; each the median of its last RECENT samples (a busy machine's outliers and its drift), before
    any the load's timings and the stated assumptions."""
    plan: ChoicePlan
    verified: dict[int, deque] = field(default_factory=dict)            # rows → recent verifications (s)
    scale: deque = field(default_factory=_recent)                       # recent verifications per load step (s)
    waits: dict[str, deque] = field(default_factory=lambda: {s: _recent() for s in SOURCES})  # beyond the work (s)
    draft_step: deque = field(default_factory=_recent)                  # the draft's one-row forwards (s)
    feed_row: deque = field(default_factory=_recent)                    # a catch-up row beyond the first (s)
    known: dict[int, float] = field(default_factory=dict)               # verify(rows), and step_s at 0, since the
    #                                                                     last sample

    @property
    def step_s(self) -> float:
        """Seconds per one-row step of the load: the run's own once it timed a verification (kept as `known[0]`)."""
        step = self.known.get(0)
        if step is None:
            step = self.known[0] = _median(self.scale) or self.plan.step_s or ASSUMED_STEP_S
        return step

    def verify(self, rows: int) -> float:
        """The verification of `rows` rows: the run's at that row count once timed MIN_TIMED times, else the load's
        figure: one row (a plain step) as the load timed it where plain steps run, more at the run's scale (kept until
        the next sample: a choice asks for many row counts)."""
        known = self.known.get(rows)
        if known is None:
            timed = self.verified.get(rows, ())
            known = self.known[rows] = _median(timed) if len(timed) >= MIN_TIMED else \
                self.plan.plain_s if rows == 1 and self.plan.plain_s else self.plan.steps(rows) * self.step_s
        return known

    def wait(self, source: str) -> float:
        """The wait for a window from `source` beyond the draft's own work (any source's before one)."""
        mine = self.waits[source]
        return _median(mine) if mine else _median([w for waits in self.waits.values() for w in waits]) or 0.0

    def draft_work(self, size: int, fed: int) -> float:
        """A model rollout of `size` tokens whose first forward feeds `fed` rows."""
        step = _median(self.draft_step) or ASSUMED_DRAFT_STEPS * self.step_s
        row = _median(self.feed_row) or ASSUMED_FEED_ROW * step
        return size * step + max(0, fed - 1) * row

    def learn(self, rows: int, verify_s: float, source: str, wait_s: float) -> None:
        """One verification of `rows` rows and the wait (beyond the draft's work) for its window."""
        self.verified.setdefault(rows, _recent()).append(verify_s)
        self.scale.append(verify_s / self.plan.steps(rows))
        self.known.clear()
        self.waits[source].append(max(0.0, wait_s))

    def learn_rollout(self, fed: int, first_s: float, steps: int, rest_s: float) -> None:
        """A rollout: its first forward over `fed` rows, then `steps` one-row forwards."""
        if steps:
            self.draft_step.append(rest_s / steps)
        if fed == 1:
            self.draft_step.append(first_s)
        elif self.draft_step:
            self.feed_row.append(max(0.0, first_s - _median(self.draft_step)) / (fed - 1))


@dataclass
class ModelAcceptance:
    """This run's acceptance of the draft model's tokens by window position, each new observation weighing most."""
    counts: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0] for _ in range(MAX_GAMMA)])

    def see(self, position: int, accepted: float) -> None:
        c = self.counts[position - 1]
        c[0], c[1] = DECAY * c[0] + accepted, DECAY * c[1] + 1.0

    def window(self, drafted: int, accepted: int) -> None:
        """A window's outcome: positions 1..min(A_t + 1, D_t) were judged, 1..A_t accepted."""
        for i in range(1, min(accepted + 1, drafted) + 1):
            self.see(i, float(i <= accepted))

    def rate(self, position: int) -> float:
        accepted, seen = self.counts[position - 1]
        return (accepted + PRIOR[0] * PRIOR[1]) / (seen + PRIOR[1])

    def expected(self, size: int) -> float:
        """E(size) = 1 + Σ_{i≤size} Π_{j≤i} a_j."""
        total, reach = 1.0, 1.0
        for i in range(1, size + 1):
            reach *= self.rate(i)
            total += reach
        return total


class WindowChooser:
    """One request's window choice on the draft lane: the run's costs and acceptance, the context draft, and the last
    window proposed, whose outcome the next ResolveRequest reports."""

    def __init__(self, plan: ChoicePlan, gamma: int, prompt_ids):
        self.plan, self.gamma = plan, gamma
        self.costs, self.model = RunCosts(plan), ModelAcceptance()
        self.context = None if plan.context is None else ContextDrafter(plan.context)
        if self.context is not None:
            self.context.index.extend(prompt_ids)
        self.room = plan.max_new_tokens          # tokens the run may still commit
        self.last: WindowChoice | None = None    # the window proposed last ...
        self.proposal: ContextProposal | None = None  # ... its context proposal, if it was one
        self.work_s = 0.0                        # ... and the draft's work to make it (s)
        self.since_news = 0                      # committed tokens since the model's acceptance was last seen
        self.probe_gap = PROBE_GAP
        self.token = prompt_ids[-1] if len(prompt_ids) else -1  # the last token committed
        self.promise: frozenset[int] | None = None  # a plain step promised next, unless c is one of these

    def learn(self, accepted: int, verify_s: float, wait_s: float, new: list[int]) -> None:
        """The last window's outcome and costs (from ResolveRequest), then the tokens this step committed."""
        last = self.last.chosen if self.last is not None else None
        self.room -= len(new)
        self.since_news += len(new)
        self.token = new[-1] if new else self.token
        if self.context is not None:
            self.context.index.extend(new)
        if last is None:
            return
        if verify_s > 0:
            self.costs.learn(last.size + 1, verify_s, last.source, wait_s - self.work_s)
        if last.source in (SOURCE_MODEL, SOURCE_BRANCH):
            self.model.window(last.size, accepted)
            self.since_news = 0
        elif last.source == SOURCE_CONTEXT:
            self.context.learn(self.proposal, accepted)
        if self.last.probe:
            beats = self._model(SOURCE_MODEL, 1, 1).per_ms > self._plain().per_ms
            self.probe_gap = PROBE_GAP if beats else min(2 * self.probe_gap, PROBE_GAP_MAX)

    def agree(self, samples: list[float]) -> None:
        """The draft's agreement with tokens the target committed without it (p_draft of each; 0/1 at T = 0)."""
        for s in samples:
            self.model.see(1, s)
        if samples:
            self.since_news = 0

    def choose(self, hit: bool, fed: int) -> WindowChoice:
        """The next window: the best candidate (a branch only on a hit; `fed`: rows a model rollout would feed)."""
        sizes = range(1, self.gamma + 1) if self.plan.zero_windows else (self.gamma,)
        candidates = [self._plain()] if self.plan.zero_windows else []
        candidates += [self._model(SOURCE_BRANCH, g, 0) for g in sizes] if hit else []
        candidates += [self._model(SOURCE_MODEL, g, fed) for g in sizes]
        offer = self.context.offer(self.room - 1) if self.context is not None else None
        candidates += self._context(offer) if offer is not None else []
        best = max(candidates, key=lambda c: c.per_ms)  # ties: the first, so a plain step wins a tie
        promised = self.promise is not None and not hit and self.token not in self.promise
        plain = best.source == SOURCE_ZERO
        probe = plain and not promised and self.since_news >= self.probe_gap
        chosen = candidates[0] if promised else self._model(SOURCE_MODEL, 1, fed) if probe else best
        other = max((c for c in candidates if c.source != chosen.source), key=lambda c: c.per_ms, default=None)
        self.last = WindowChoice(chosen, other, probe, bool(self.costs.scale), promised)
        self.proposal = offer.proposal(chosen.size) if chosen.source == SOURCE_CONTEXT else None
        self.promise = self._promise() if plain and not probe else None
        self.work_s = 0.0
        return self.last

    def _promise(self) -> frozenset[int] | None:
        """After a plain step chosen on the merits, the step after it is plain too unless the token it commits makes
        the context offer a window (a bigram seen before: with a match of min_match ≥ 2 tokens only those can) or a
        probe falls due; None where a match of one token would do (every token seen before could break it)."""
        if self.since_news + 1 >= self.probe_gap or self.room <= 2:
            return None
        if self.context is None:
            return frozenset()
        if self.plan.context.min_match < 2:
            return None
        return frozenset(self.context.index.followers.get(self.token, ()))

    def _plain(self) -> Candidate:
        return _candidate(SOURCE_ZERO, 0, 1.0, self.costs.verify(1) + self.costs.wait(SOURCE_ZERO))

    def _model(self, source: str, size: int, fed: int) -> Candidate:
        cost = self.costs.verify(size + 1) + self.costs.wait(source)
        if source == SOURCE_MODEL:
            cost += self.costs.draft_work(size, fed)
        return _candidate(source, size, min(self.model.expected(size), max(1, self.room)), cost)

    def _context(self, offer: ContextOffer) -> list[Candidate]:
        """The context copy of each length 1..L: 1 + Σ_{i≤n} q^i tokens for a verification of n + 1 rows."""
        out, expected, reach, wait = [], 1.0, 1.0, self.costs.wait(SOURCE_CONTEXT)
        for n in range(1, len(offer.tokens) + 1):
            reach *= offer.q
            expected += reach
            out.append(_candidate(SOURCE_CONTEXT, n, min(expected, max(1, self.room)), self.costs.verify(n + 1) + wait))
        return out


def _candidate(source: str, size: int, expected: float, cost_s: float) -> Candidate:
    return Candidate(source, size, round(expected, 4), round(1e3 * cost_s, 4))
