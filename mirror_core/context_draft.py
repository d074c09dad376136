"""The context draft: windows copied from the prompt and the output so far, beside the model draft.

When an answer copies (an edited function, a corrected paragraph, a converted table, a repeated name), its next
tokens are already on the page. The draft lane keeps an index of every committed token (prompt included). At each
step it looks up the longest suffix of the committed tokens that occurred before (an n-gram of 1..CONTEXT_NGRAM
tokens, its latest occurrence, then extended backwards to measure the match) and reads what followed it there: the
offer (ContextOffer), with q, this run's acceptance of context tokens at this match length, counted, starting from
Laplace's rule of succession (after m tokens that matched, the next matches with probability (m+1)/(m+2)).

Whether a context window is proposed, and how long, is the window chooser's decision (draft_choice.py), which values
it against the model draft's windows and a plain target step:

    value(L) = (1 + Σ_{i=1..L} q^i) / cost(L)     tokens the verification commits ÷ its verification and the wait for it

Only efficiency depends on this: the target verifies every window, and a context window is a point mass for Rule R
(p_draft one-hot).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import CONTEXT_NGRAM

MATCH_CAP = 64                     # a match is measured back to at most this many tokens
MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)  # acceptance is counted per match length bucket: 1, 2, 3, 4-7, 8-15, 16+
PRIOR_WEIGHT = 2.0                 # the rule of succession's q counts as this many tokens reached in a bucket


@dataclass(frozen=True)
class ContextPlan:
    """The context draft's settings for one request (config.ContextConfig, sent with DraftStart)."""
    min_match: int
    max_window: int


@dataclass(frozen=True)
class ContextProposal:
    """One context window and why it was chosen (it travels with DraftWindow into the step record)."""
    tokens: tuple[int, ...]   # the window proposed: what followed the match, L tokens
    match: int                # tokens of the suffix match (up to MATCH_CAP)
    available: int            # tokens that followed the match (up to max_window): L is chosen among 1..available
    q: float                  # estimated acceptance of each context token at this match length
    expected: float           # modelled tokens the verification commits: 1 + Σ q^i


@dataclass(frozen=True)
class ContextOffer:
    """What the context holds for the next step: the continuation of the longest match, and its q."""
    tokens: tuple[int, ...]   # what followed the match (the longest window on offer)
    match: int                # tokens of the suffix match
    q: float                  # estimated acceptance of each of its tokens

    def proposal(self, size: int) -> ContextProposal:
        """The window of its first `size` tokens."""
        expected = 1.0 + sum(self.q ** i for i in range(1, size + 1))
        return ContextProposal(self.tokens[:size], self.match, len(self.tokens), round(self.q, 4),
                               round(expected, 4))


class ContextIndex:
    """Every committed token, and for each n-gram of 1..ngram tokens the end of its latest occurrence that is not the
    current suffix (so a match always has at least one token after it)."""

    def __init__(self, ngram: int = CONTEXT_NGRAM):
        self.ngram = ngram
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}   # n-gram → index just past its latest occurrence
        self.followers: dict[int, set[int]] = {}     # token → the tokens after it in the bigrams of `ends`

    def extend(self, tokens) -> None:
        for t in tokens:
            end = len(self.tokens)     # index the n-grams ending at the current last token, then append
            for n in range(1, min(self.ngram, end) + 1):
                self.ends[tuple(self.tokens[end - n:end])] = end
            if end >= 2:
                self.followers.setdefault(self.tokens[end - 2], set()).add(self.tokens[end - 1])
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
    """The draft lane's context draft for one request: the index and this run's acceptance counts per match length."""
    plan: ContextPlan
    index: ContextIndex = field(default_factory=ContextIndex)
    counts: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0] for _ in MATCH_BUCKETS])

    def learn(self, proposal: ContextProposal, accepted: int) -> None:
        """Count a context window's outcome: its tokens the target judged (min(A_t + 1, L)) and accepted."""
        c = self.counts[bucket(proposal.match)]
        c[0] += accepted
        c[1] += min(accepted + 1, len(proposal.tokens))

    def offer(self, room: int) -> ContextOffer | None:
        """The continuation of the longest match (at most `room` tokens, the run's budget less c), or None where no
        match of min_match tokens exists."""
        match, start = self.index.match()
        if match < self.plan.min_match:
            return None
        available = self.index.continuation(start, min(self.plan.max_window, max(1, room)))
        accepted, reached = self.counts[bucket(match)]
        q = (accepted + PRIOR_WEIGHT * (match + 1) / (match + 2)) / (reached + PRIOR_WEIGHT)
        return ContextOffer(available, match, q)
