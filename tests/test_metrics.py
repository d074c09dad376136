"""Metric derivations (docs/ALGORITHM.md §8) on hand-built step records and spans."""
from __future__ import annotations

import pytest

from mirror_core.events import SpanEvent, StepRecord
from mirror_core.decode_state import summarize
from mirror_core.metrics import interval_overlap


def rec(step, accepted, committed=None, hit=None, drafted=4, window=(0, 1, 2, 3, 4), topk=(), target=()):
    return StepRecord(step=step, window=window, drafted=drafted, accepted=accepted, token=9,
                      committed=accepted + 1 if committed is None else committed, from_branch=False, hit=hit,
                      topk_ids=topk, target_tokens=target)


def test_tau_alpha_histogram_and_per_position():
    records = [rec(1, 4), rec(2, 0, hit=False), rec(3, 2, hit=True), rec(4, 4, hit=True, committed=3)]
    s = summarize(records, [], 4, new_tokens=12, t_start=0.0, t_first=0.5, t_end=2.0)
    assert s.tau == pytest.approx((5 + 1 + 3 + 3) / 4)           # counts the correction/bonus, cut steps too
    assert s.acceptance_rate == pytest.approx(10 / 16)
    assert list(s.hist) == [1, 0, 1, 0, 2]
    assert s.per_position_acceptance == pytest.approx([3 / 4, 3 / 4, 2 / 4, 2 / 4])
    assert list(s.pos_drafted) == [4, 4, 4, 4]                    # n: the windows each α_i is counted over
    # τ(γ) the curve implies, 1 + Σ α_i, is 1 + mean A_t: the measured τ but for the step the run's end cut short
    assert s.tau_from_positions == pytest.approx(1 + 10 / 4) and s.tau == pytest.approx(1 + 10 / 4 - 2 / 4)
    assert s.hit_rate == pytest.approx(2 / 3)                     # the first step had no branches
    assert s.fallback_frequency == pytest.approx(1 / 3)
    assert s.hit_rate_by_kind == {"tau1": 0.0, "deeper": 1.0, "bonus": 1.0}
    assert s.tokens_per_s == pytest.approx(12 / 2.0)
    assert s.ttft_s == pytest.approx(0.5)


def test_exit_overlap_skips_slots_where_the_draft_was_right():
    # slots: d1=1 matches y=1 (skipped), d2=2 vs y=7 (7 in topk), d3=3 vs y=8 (not), d4=4 vs y=4 (skipped), bonus y=5 (in)
    r = rec(1, 1, window=(0, 1, 2, 3, 4), topk=((6,), (7, 1), (9,), (2,), (5,)), target=(1, 7, 8, 4, 5))
    s = summarize([r], [], 4, new_tokens=2, t_start=0, t_first=0, t_end=1)
    assert s.exit_overlap == pytest.approx(2 / 3)


def test_draft_hidden_fraction_counts_only_target_busy_time():
    spans = [SpanEvent("target", "target_prefix", 0.0, 1.0, 1), SpanEvent("target", "target_suffix", 1.0, 2.0, 1),
             SpanEvent("target", "wait", 2.0, 3.0, 1),
             SpanEvent("draft", "draft_branches", 1.5, 2.5, 1), SpanEvent("draft", "draft_rollout", 2.5, 3.0, 1)]
    s = summarize([], spans, 4, new_tokens=0, t_start=0, t_first=None, t_end=3)
    assert s.draft_hidden_fraction == pytest.approx(0.5 / 1.5)
    assert s.tau is None and s.hit_rate is None


def test_interval_overlap_merges_self_overlaps():
    assert interval_overlap([(0, 2), (1, 3)], [(2, 4)]) == pytest.approx(1.0)
    assert interval_overlap([(0, 1)], [(1, 2)]) == 0.0
