"""The Learn tab's branch tree (ui/learn/tree.py): roots per slot, chains per rolled-out candidate, the hit highlighted,
pruned candidates greyed, unreachable slots dimmed; bad step numbers get a line, not an exception."""
from __future__ import annotations

import math

from mirror_core import StepRecord
from ui.session import DecoderRun, TokenNamer
from ui.learn.tree import first_steps, tree_html


def _run() -> DecoderRun:
    lp = math.log
    run = DecoderRun("mirror", TokenNamer(None))
    # step 1: γ = 2, A_t = 1, c = 50 at slot 1 is a candidate → hit, row 1 reused; (slot 2, 61) was pruned
    run.steps.append(StepRecord(1, (10, 11, 12), 2, 1, 50, 2, False, True,
                                topk_ids=((40, 41), (50, 51), (60, 61)),
                                topk_logprobs=((lp(.5), lp(.2)), (lp(.6), lp(.1)), (lp(.3), lp(.2))),
                                branches=((1, 2), (3, 4), (5, 6), (7, 8), (9, 13)),
                                branch_rows=((0, 40), (1, 50), (0, 41), (1, 51), (2, 60)), branch_row=1))
    # step 2: A_t = 0, c = 99 not among slot 0's candidates → miss
    run.steps.append(StepRecord(2, (50, 3, 4), 2, 0, 99, 1, True, False, topk_ids=((70, -1), (71, -1), (72, -1)),
                                topk_logprobs=((lp(.9), 0.0), (lp(.9), 0.0), (lp(.9), 0.0)),
                                branches=((1, 1), (2, 2), (3, 3)), branch_rows=((0, 70), (1, 71), (2, 72))))
    return run


def test_the_tree_shows_the_hit_its_reused_branch_and_the_pruned_candidate():
    run = _run()
    assert first_steps(run) == (1, 2)
    page = tree_html(run, None)  # default: the first hit
    assert "Step 1" in page and "hit" in page and "slot s_t = A_t + 1 = 2 decides" in page  # slots 1..γ+1
    assert "slot 1 <span" in page and "slot 3 <span" in page and "slot 0 <span" not in page
    assert page.count("mirror-tree-slot") == 3 and page.count("mirror-tree-dim") == 1  # slot 2 unreachable
    assert page.count("mirror-node-hit") == 1 and "<code>#50</code> 0.600" in page
    assert page.count("mirror-node-reused") == 2  # row 1's γ = 2 tokens: #3 → #4
    assert page.count("pruned (budget)") == 1 and "#61" in page
    miss = tree_html(run, 2)
    assert "miss" in miss and "#99" in miss and "mirror-node-hit" not in miss and "-1" not in miss


def test_bad_steps_and_no_run_get_one_line():
    run = _run()
    assert "Run Mirror-SD" in tree_html(None, 1)
    assert "not in this run" in tree_html(run, 9)
    assert "whole number" in tree_html(run, "x")
    assert "Run Mirror-SD" in tree_html(DecoderRun("sd", TokenNamer(None)), 1)
