"""The context draft: windows copied from the prompt and the output so far, beside the model draft.

When an answer copies (an edited function, a corrected paragraph, a converted table, a repeated name), its next
tokens are already on the page. The draft lane keeps an index of every committed token (prompt included). At each
step it looks up the longest suffix of the committed tokens that occurred before (an n-gram of 1..CONTEXT_NGRAM
tokens, its latest occurrence, then extended backwards to measure the match) and reads what followed it there.

Whether to use it, and how many tokens to propose, is the latency model's choice at every step:

    value(L) = (1 + Σ_{i=1..L} q^i) / cost(L + 1)      tokens a verification commits ÷ its cost in target steps

where q is this run's acceptance of context tokens at this match length, counted, starting from Laplace's rule of
succession (after m tokens that matched, the next matches with probability (m+1)/(m+2)), and cost(r) the
target's forward of r rows over its one-row step, measured at load (pair.PairInfo.window_steps). The context
window of the best L is proposed when its value beats the model draft's, τ_model / cost(γ + 1) with τ_model the
tokens this run's model windows committed per step; otherwise the model drafts. Once the run has timed its own
steps, a cost is what they measured where the decoder runs (the target lane reports each verification and each
wait for a window): a window's verification at its row count (else the load's figure, rescaled to the run's), plus
the mean wait for a window from that source (the model's rollouts where they are not hidden), in load steps. Only
efficiency depends on this: the target verifies every window, and a context window is a point mass for Rule R
(p_draft one-hot).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import CONTEXT_NGRAM, ContextConfig

MATCH_CAP = 64                     # a match is measured back to at most this many tokens
MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)  # acceptance is counted per match length bucket: 1, 2, 3, 4-7, 8-15, 16+
PRIOR_WEIGHT = 2.0                 # the rule of succession's q counts as this many tokens reached in a bucket
MODEL_PRIOR = (3.0, 2.0)           # (committed, steps) the model draft starts with: τ_model = 1.5
ASSUMED_ROW_STEPS = 0.25           # cost of a row beyond the first where the load timed no forward by rows


@dataclass(frozen=True)
class ContextPlan:
    """What the draft lane needs to run the context draft (sent with DraftStart)."""
    min_match: int
    max_window: int
    max_new_tokens: int               # the request's budget: a window never proposes past it
    window_steps: tuple[float, ...]   # cost(r): the forward of r = 1, 2, .. rows in one-row steps (measured at load);
    #                                   () = not timed on this runner: 1 + ASSUMED_ROW_STEPS per extra row

    def cost(self, rows: int) -> float:
        """cost(rows) in one-row steps; past the timed rows, extended along the last timed slope."""
        w = self.window_steps
        if not w:
            return 1.0 + ASSUMED_ROW_STEPS * (rows - 1)
        if rows <= len(w):
            return w[rows - 1]
        slope = (w[-1] - w[-3]) / 2 if len(w) >= 3 else ASSUMED_ROW_STEPS
        return w[-1] + max(slope, 0.0) * (rows - len(w))


def context_plan(config: ContextConfig, max_new_tokens: int, window_steps: tuple[float, ...]) -> ContextPlan | None:
    """The plan for a request's ContextConfig (None: the context draft is off)."""
    return ContextPlan(config.min_match, config.max_window, max_new_tokens, window_steps) if config.enabled else None


@dataclass(frozen=True)
class ContextProposal:
    """One context window and why it was chosen (it travels with DraftWindow into the step record)."""
    tokens: tuple[int, ...]   # the window proposed: what followed the match, L tokens
    match: int                # tokens of the suffix match (up to MATCH_CAP)
    available: int            # tokens that followed the match (up to max_window): L is chosen among 1..available
    q: float                  # estimated acceptance of each context token at this match length
    expected: float           # modelled tokens the verification commits: 1 + Σ q^i
    cost: float               # modelled verification cost of L + 1 rows, in one-row target steps
    model_value: float        # the model draft's modelled tokens per step that this window beat


class ContextIndex:
    """Every committed token, and for each n-gram of 1..ngram tokens the end of its latest occurrence that is not the
    current suffix (so a match always has at least one token after it)."""

    def __init__(self, ngram: int = CONTEXT_NGRAM):
        self.ngram = ngram
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}   # n-gram → index just past its latest occurrence

    def extend(self, tokens) -> None:
        for t in tokens:
            end = len(self.tokens)     # index the n-grams ending at the current last token, then append
            for n in range(1, min(self.ngram, end) + 1):
                self.ends[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(int(t))

    def match(self) -> tuple[int, int]:
        """(match length, index where its continuation starts) of the longest suffix seen before; (0, -1) if none."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(self.ngram, size - 1), 0, -1):
            start = self.ends.get(tuple(toks[size - n:]))
            if start is not None:
                while n < MATCH_CAP and start - n - 1 >= 0 and toks[start - n - 1] == toks[size - n - 1]:
                    n += 1
                return n, start
        return 0, -1

    def continuation(self, start: int, limit: int) -> tuple[int, ...]:
        return tuple(self.tokens[start:start + limit])


def bucket(match: int) -> int:
    return sum(match >= b for b in MATCH_BUCKETS) - 1


@dataclass
class ContextDrafter:
    """The draft lane's context draft for one request: the index, this run's acceptance counts, the choice."""
    plan: ContextPlan
    gamma: int
    index: ContextIndex = field(default_factory=ContextIndex)
    counts: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0] for _ in MATCH_BUCKETS])
    model: list[float] = field(default_factory=lambda: list(MODEL_PRIOR))
    budget_end: int = 0   # committed tokens (prompt included) at which the run's budget ends (start)
    verified: dict[int, list[float]] = field(default_factory=dict)  # rows → [Σ verification s, count] of this run
    timed_s: float = 0.0       # Σ of those verifications (s) ...
    timed_steps: float = 0.0   # ... and Σ of the load's cost for them (one-row steps): their ratio is s per load step
    waits: list[list[float]] = field(default_factory=lambda: [[0.0, 0], [0.0, 0]])  # model, context: [Σ wait s, n]

    def start(self, prompt_ids) -> None:
        self.index.extend(prompt_ids)
        self.budget_end = len(prompt_ids) + self.plan.max_new_tokens

    def learn(self, proposal: ContextProposal | None, drafted: int, accepted: int, verify_s: float = 0.0,
              wait_s: float = 0.0) -> None:
        """Count the last window's outcome: a context window's tokens reached and accepted, or the model's yield;
        and what it cost (its verification, the wait for it), when the target lane timed them."""
        if drafted and verify_s > 0:
            timed = self.verified.setdefault(drafted + 1, [0.0, 0])
            timed[0], timed[1] = timed[0] + verify_s, timed[1] + 1
            self.timed_s += verify_s
            self.timed_steps += self.plan.cost(drafted + 1)
            wait = self.waits[proposal is not None]
            wait[0], wait[1] = wait[0] + wait_s, wait[1] + 1
        if proposal is not None:
            c = self.counts[bucket(proposal.match)]
            c[0] += accepted
            c[1] += min(accepted + 1, len(proposal.tokens))
        elif drafted:
            self.model[0] += accepted + 1
            self.model[1] += 1

    def propose(self) -> ContextProposal | None:
        """The context window for the next step, or None where the model draft is modelled to do better."""
        match, start = self.index.match()
        if match < self.plan.min_match:
            return None
        left = self.budget_end - len(self.index.tokens)   # tokens the run may still commit: L + c at most that
        available = self.index.continuation(start, min(self.plan.max_window, max(1, left - 1)))
        accepted, reached = self.counts[bucket(match)]
        q = (accepted + PRIOR_WEIGHT * (match + 1) / (match + 2)) / (reached + PRIOR_WEIGHT)
        model_value = (self.model[0] / self.model[1]) / self.cost(self.gamma + 1, context=False)
        best, expected = (0.0, 0, 0.0, 0.0), 1.0        # (value, L, expected, cost) of the best L so far
        for n in range(1, len(available) + 1):
            expected += q ** n                          # 1 + Σ_{i≤n} q^i
            cost = self.cost(n + 1, context=True)
            if expected / cost > best[0]:
                best = (expected / cost, n, expected, cost)
        value, size, expected, cost = best
        if value <= model_value:
            return None
        return ContextProposal(available[:size], match, len(available), round(q, 4), round(expected, 4),
                               round(cost, 4), round(model_value, 4))

    def cost(self, rows: int, context: bool) -> float:
        """A window of `rows` rows from the context or the model, in one-row steps as the load timed them: the
        load's figure until this run has timed a verification; then the run's own, plus its mean wait for such
        a window."""
        if not self.verified:
            return self.plan.cost(rows)
        per_step = self.timed_s / self.timed_steps                      # s per load step
        timed = self.verified.get(rows)
        verify = timed[0] / timed[1] if timed else self.plan.cost(rows) * per_step
        wait, n = self.waits[context]
        return (verify + (wait / n if n else 0.0)) / per_step
