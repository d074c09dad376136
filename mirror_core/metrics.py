"""Run summary: raw counters from the event stream, and the metrics derived from them (docs/ALGORITHM.md §8).

RunSummary holds only counters and summed times; every metric is a property that states its
definition, so the CLI, the bench, the trainer's evaluation and the UI read the same numbers, and
summaries of several runs pool by adding their counters (`RunSummary.pool`). The prefill token is
excluded from every ratio.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


KINDS = ("tau1", "deeper", "bonus")  # where the correction landed: slot 1, a deeper draft slot, the bonus slot
# where a window came from (draft_choice.SOURCE_*, in this order): a fresh rollout of the draft model, an adopted branch,
# a copy from the context, or none: a window of zero tokens (a plain target step, where no window was modelled to win)
SOURCES = ("model", "branch", "context", "zero")


def _ratio_of(num: str, den: str, definition: str) -> property:
    """A metric defined as counter `num` / counter `den` (None when `den` is 0)."""
    return property(lambda self: _ratio(getattr(self, num), getattr(self, den)), doc=definition)


@dataclass(frozen=True)
class RunSummary:
    """Raw counters of one run (or of several, pooled); metrics are the documented properties below."""

    gamma: int                                   # γ of the run (sizes the histogram and per-position counts)
    new_tokens: int = 0                          # committed new tokens, the prefill token included
    steps: int = 0                               # verification passes after the prefill
    single_steps: int = 0                        # one-token target passes after the prefill (ar; after a lane failure)
    committed: int = 0                           # Σ n_t over steps
    drafted: int = 0                             # Σ D_t
    accepted: int = 0                            # Σ A_t
    hist: tuple[int, ...] = ()                   # counts of A_t over 0..γ of the steps that proposed a window (a
    #                                              longer context window's A_t ≥ γ: last)
    pos_accepted: tuple[int, ...] = ()           # #(A_t ≥ i), i = 1..γ
    pos_drafted: tuple[int, ...] = ()            # #(D_t ≥ i), i = 1..γ
    branched_steps: int = 0                      # steps that had precomputed branches
    hits: int = 0                                # ... whose c was among that slot's candidates
    branched_by_kind: tuple[int, int, int] = (0, 0, 0)  # branched steps per KINDS
    hits_by_kind: tuple[int, int, int] = (0, 0, 0)      # hits per KINDS
    overlap_slots: int = 0                       # slots counted for Ω̂_κ
    overlap_in_topk: int = 0                     # ... whose target token was in the slot's TopK
    draft_forwards: int = 0                      # draft row-forwards (a batched pass over R rows counts R)
    draft_produced: int = 0                      # draft tokens those row-forwards produced
    draft_busy_s: float = 0.0                    # union of the draft lane's busy spans
    target_busy_s: float = 0.0                   # union of the target lane's busy spans (waits excluded)
    hidden_s: float = 0.0                        # |draft busy ∩ target busy| on one clock
    wall_s: float = 0.0                          # prefill start → last commit
    ttft_s: float | None = None                  # prefill start → first new token (None: no token)
    source_steps: tuple[int, ...] = (0,) * len(SOURCES)     # verification steps whose window came from each SOURCES
    source_drafted: tuple[int, ...] = (0,) * len(SOURCES)   # Σ D_t of those steps (tokens proposed)
    source_accepted: tuple[int, ...] = (0,) * len(SOURCES)  # Σ A_t of those steps (tokens accepted)

    def __post_init__(self) -> None:
        g = self.gamma
        if not self.hist:  # an empty run: zero counts of the right lengths
            object.__setattr__(self, "hist", (0,) * (g + 1))
            object.__setattr__(self, "pos_accepted", (0,) * g)
            object.__setattr__(self, "pos_drafted", (0,) * g)

    # -- metrics (docs/ALGORITHM.md §8): each is a ratio of counters, None when its denominator is 0 -----
    tau = _ratio_of("committed", "steps",
                    "τ = Σ n_t / #steps: tokens committed per verification, counting the correction or bonus token "
                    "(a window of zero verifies [w0] alone and commits 1).")
    acceptance_rate = _ratio_of("accepted", "drafted", "α = Σ A_t / Σ D_t: the share of presented draft tokens accepted.")
    hit_rate = _ratio_of("hits", "branched_steps",
                         "#hit steps / #steps that had branches (the first step has none): c was among the "
                         "candidates of its slot s_t = A_t + 1.")
    exit_overlap = _ratio_of("overlap_in_topk", "overlap_slots",
                             "Ω̂_κ = share of slots whose target token y_j = argmax p_target lies in the slot's sent "
                             "TopK, over the slots where y_j ≠ d_j (d_j is excluded from TopK_j) plus every bonus slot.")
    draft_hidden_fraction = _ratio_of("hidden_s", "draft_busy_s",
                                      "Σ|draft busy ∩ target busy| / Σ|draft busy| on one clock; fallback rollouts "
                                      "count as draft busy time.")
    tokens_per_s = _ratio_of("new_tokens", "wall_s", "New tokens / decode wall time (prefill start → last commit).")
    draft_tokens_per_forward = _ratio_of("draft_produced", "draft_forwards",
                                         "η̄ = draft tokens produced / draft row-forwards (1 for an AR draft).")

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """α_i = #(A_t ≥ i) / #(D_t ≥ i), i = 1..γ (unconditional, as in vLLM)."""
        return [_ratio(a, d) for a, d in zip(self.pos_accepted, self.pos_drafted)]

    @property
    def tau_from_positions(self) -> float | None:
        """τ(γ) = 1 + α_1 + … + α_γ: the tokens a step of γ draft tokens commits at these per-position acceptances
        (E[A_t] = Σ_i P(A_t ≥ i)); τ itself where every window had γ tokens. None without steps."""
        if not self.steps:
            return None
        return 1.0 + sum(a for a in self.per_position_acceptance if a is not None)

    @property
    def hit_rate_by_kind(self) -> dict[str, float | None]:
        """The hit rate split by where c landed: slot s_t = A_t + 1 = 1, deeper (1 < s_t ≤ γ), bonus (s_t = γ + 1)."""
        return {k: _ratio(h, b) for k, h, b in zip(KINDS, self.hits_by_kind, self.branched_by_kind)}

    @property
    def by_source(self) -> dict[str, dict[str, float | int | None]]:
        """Per window source (model rollout, adopted branch, context copy): steps, tokens proposed (Σ D_t), tokens
        accepted (Σ A_t), acceptance = accepted / proposed, mean accepted run = accepted / steps."""
        return {name: source_entry(n, d, a)
                for name, n, d, a in zip(SOURCES, self.source_steps, self.source_drafted, self.source_accepted)}

    @property
    def zero_windows(self) -> int:
        """Steps that took a window of zero: no window was modelled to commit more tokens per millisecond than a plain
        target step, so the target verified [w0] alone and committed its own token."""
        return self.source_steps[SOURCES.index("zero")]

    @property
    def target_passes(self) -> int:
        """Target forward passes after the prefill: verification passes plus one-token steps."""
        return self.steps + self.single_steps

    @property
    def fallback_frequency(self) -> float | None:
        """FF = 1 − hit rate, over the same steps: windows the draft had to roll out afresh."""
        rate = self.hit_rate
        return None if rate is None else 1.0 - rate

    # -- pooling and export ------------------------------------------------------------------
    @classmethod
    def pool(cls, summaries: list[RunSummary]) -> RunSummary:
        """Several runs as one: counters and times add (ttft_s is the mean); γ must agree."""
        if not summaries:
            raise ValueError("nothing to pool")
        gammas = {s.gamma for s in summaries}
        if len(gammas) != 1:
            raise ValueError(f"cannot pool runs with different γ ({sorted(gammas)})")
        out = {}
        for f in fields(cls):
            values = [getattr(s, f.name) for s in summaries]
            if f.name == "gamma":
                out[f.name] = values[0]
            elif f.name == "ttft_s":
                known = [v for v in values if v is not None]
                out[f.name] = sum(known) / len(known) if known else None
            elif isinstance(values[0], tuple):
                out[f.name] = tuple(map(sum, zip(*values)))
            else:
                out[f.name] = sum(values)
        return cls(**out)

    def to_dict(self) -> dict:
        """JSON-ready: every metric by name, plus the raw counters under "counters"."""
        return {
            "new_tokens": self.new_tokens, "steps": self.steps, "target_passes": self.target_passes,
            "gamma": self.gamma, "tau": self.tau,
            "acceptance_rate": self.acceptance_rate, "per_position_acceptance": self.per_position_acceptance,
            "tau_from_positions": self.tau_from_positions,
            "acceptance_histogram": list(self.hist), "hit_rate": self.hit_rate,
            "hit_rate_by_kind": self.hit_rate_by_kind, "fallback_frequency": self.fallback_frequency,
            "exit_overlap": self.exit_overlap, "draft_hidden_fraction": self.draft_hidden_fraction,
            "draft_busy_s": self.draft_busy_s, "target_busy_s": self.target_busy_s, "wall_s": self.wall_s,
            "ttft_s": self.ttft_s, "tokens_per_s": self.tokens_per_s, "draft_forwards": self.draft_forwards,
            "draft_tokens_per_forward": self.draft_tokens_per_forward, "by_source": self.by_source,
            "zero_windows": self.zero_windows,
            "counters": {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                         for f in fields(self)},
        }


def source_entry(steps: int, proposed: int, accepted: int) -> dict[str, float | int | None]:
    """One window source's counters and ratios (RunSummary.by_source)."""
    return {"steps": steps, "proposed": proposed, "accepted": accepted, "acceptance": _ratio(accepted, proposed),
            "mean_accepted_run": _ratio(accepted, steps)}


def interval_overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sets of intervals (each set may self-overlap)."""
    a, b = _union(a), _union(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(iv):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def interval_length(iv: list[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in _union(iv))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None
