"""Run summary: raw counters from the event stream, and the derivations of mirror_sd.md §8.

Definitions (the prefill token is excluded from every ratio):
- τ (tokens per step) = Σ n_t / #steps, counting the correction or bonus token.
- acceptance rate α = Σ A_t / Σ D_t.
- per-position acceptance α_i = #(A_t ≥ i) / #(D_t ≥ i) (unconditional, as in vLLM).
- acceptance histogram: counts of A_t over 0..γ.
- hit rate = #hit steps / #steps that had branches (the first step has none); split by τ = 1,
  deeper (1 < τ ≤ γ) and bonus (τ = γ + 1). Fallback frequency FF = 1 − hit rate.
- Ω̂_κ (exit overlap) = share of slots whose target token y_j = argmax p_target (greedy; the
  argmax is also used at T > 0) lies in that slot's early-exit top-κ, over the slots where
  y_j ≠ d_j (a draft token equal to y_j is excluded from TopK_j) plus every bonus slot. With a
  branch budget, TopK_j is the candidates actually sent (the pruned ones are −1), so Ω̂ then
  measures the sent set and bounds the hit rate the same way.
- draft-hidden fraction = Σ |draft busy ∩ target busy| / Σ |draft busy| on one clock; fallback
  rollouts count as draft busy time, waits do not count as target busy time.
- tokens/s = new tokens / decode wall time (prefill start to last commit); TTFT = time to the
  first new token.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .events import LANE_DRAFT, LANE_TARGET, TARGET_BUSY_STAGES, SpanEvent, StepRecord


@dataclass
class RunCounters:
    """Raw counters; everything in the summary is derived from these."""

    new_tokens: int = 0
    steps: int = 0
    committed: int = 0         # Σ n_t over steps
    drafted: int = 0           # Σ D_t
    accepted: int = 0          # Σ A_t
    hist: list | None = None   # A_t counts, length γ+1
    pos_accepted: list | None = None  # #(A_t ≥ i), i = 1..γ
    pos_drafted: list | None = None   # #(D_t ≥ i)
    branched_steps: int = 0
    hits: int = 0
    branched_by_kind: dict | None = None
    hits_by_kind: dict | None = None
    overlap_slots: int = 0
    overlap_in_topk: int = 0


def count_steps(records: list[StepRecord], gamma: int) -> RunCounters:
    c = RunCounters(hist=[0] * (gamma + 1), pos_accepted=[0] * gamma, pos_drafted=[0] * gamma,
                    branched_by_kind={"tau1": 0, "deeper": 0, "bonus": 0},
                    hits_by_kind={"tau1": 0, "deeper": 0, "bonus": 0})
    for r in records:
        c.steps += 1
        c.committed += r.committed
        c.drafted += r.drafted
        c.accepted += r.accepted
        c.hist[min(r.accepted, gamma)] += 1
        for i in range(1, gamma + 1):
            c.pos_drafted[i - 1] += r.drafted >= i
            c.pos_accepted[i - 1] += r.accepted >= i
        if r.hit is not None:
            kind = "bonus" if r.accepted == r.drafted else ("tau1" if r.accepted == 0 else "deeper")
            c.branched_steps += 1
            c.branched_by_kind[kind] += 1
            c.hits += bool(r.hit)
            c.hits_by_kind[kind] += bool(r.hit)
        _count_overlap(c, r)
    return c


def _count_overlap(c: RunCounters, r: StepRecord) -> None:
    if not r.topk_ids or not r.target_tokens:
        return
    drafts = r.window[1:]
    for j, (y, topk) in enumerate(zip(r.target_tokens, r.topk_ids)):
        if j < len(drafts) and drafts[j] == y:
            continue
        c.overlap_slots += 1
        c.overlap_in_topk += y in topk


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


def busy_intervals(spans: list[SpanEvent], lane: str) -> list[tuple[float, float]]:
    if lane == LANE_TARGET:
        return [(s.t0, s.t1) for s in spans if s.lane == LANE_TARGET and s.stage in TARGET_BUSY_STAGES]
    return [(s.t0, s.t1) for s in spans if s.lane == LANE_DRAFT]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def summarize(records: list[StepRecord], spans: list[SpanEvent], gamma: int, *, new_tokens: int,
              t_start: float, t_first: float | None, t_end: float, extra: dict | None = None) -> dict:
    """Derive the run summary (mirror_sd.md §8) from step records and spans."""
    c = count_steps(records, gamma)
    c.new_tokens = new_tokens
    draft_busy = busy_intervals(spans, LANE_DRAFT)
    draft_total = sum(hi - lo for lo, hi in _union(draft_busy))
    hidden = interval_overlap(draft_busy, busy_intervals(spans, LANE_TARGET))
    wall = max(0.0, t_end - t_start)
    hit_rate = _ratio(c.hits, c.branched_steps)
    summary = {
        "new_tokens": new_tokens,
        "steps": c.steps,
        "tau": _ratio(c.committed, c.steps),
        "acceptance_rate": _ratio(c.accepted, c.drafted),
        "per_position_acceptance": [_ratio(a, d) for a, d in zip(c.pos_accepted, c.pos_drafted)],
        "acceptance_histogram": c.hist,
        "hit_rate": hit_rate,
        "hit_rate_by_kind": {k: _ratio(c.hits_by_kind[k], c.branched_by_kind[k]) for k in c.branched_by_kind},
        "fallback_frequency": None if hit_rate is None else 1.0 - hit_rate,
        "exit_overlap": _ratio(c.overlap_in_topk, c.overlap_slots),
        "draft_hidden_fraction": _ratio(hidden, draft_total),
        "draft_busy_s": draft_total,
        "target_busy_s": sum(hi - lo for lo, hi in _union(busy_intervals(spans, LANE_TARGET))),
        "wall_s": wall,
        "ttft_s": None if t_first is None else t_first - t_start,
        "tokens_per_s": _ratio(new_tokens, wall),
        "counters": asdict(c),
    }
    summary.update(extra or {})
    return summary
