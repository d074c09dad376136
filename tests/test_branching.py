"""The branch planner: which (slot, candidate) pairs to precompute under a row budget."""
import torch

from mirror_core.messages import ExitReadout
from mirror_core.planner import BranchPlanner

TOKEN = 7  # the target's token c in these steps: the exit's top candidate at every slot


def _readout(draft_is_top1: list[bool], kappa: int, suffix_s: float = 0.0) -> ExitReadout:
    """What a step sent: TOKEN ranked first at each of the γ+1 slots; the suffix took suffix_s."""
    ranked = tuple((TOKEN,) + (-1,) * (kappa - 1) for _ in range(len(draft_is_top1) + 1))
    return ExitReadout(ranked, (), ranked, tuple(draft_is_top1), True, t_readout=0.0, t_sent=0.0, t_verified=suffix_s)


def _ids(gamma: int, kappa: int) -> torch.Tensor:
    return torch.arange((gamma + 1) * kappa).view(gamma + 1, kappa)  # [γ+1, κ] distinct candidate ids


def test_no_budget_keeps_every_candidate():
    ids = _ids(4, 3)
    assert torch.equal(BranchPlanner(0, 3).select(ids, [True] * 4), ids)
    assert torch.equal(BranchPlanner(15, 3).select(ids, [True] * 4), ids)


def test_budget_keeps_exactly_that_many_and_prefers_top_ranks():
    kept = BranchPlanner(5, 3).select(_ids(4, 3), [True] * 4)
    assert int((kept >= 0).sum()) == 5
    # uniform priors (acceptance 1/2, every rank alike): slot 0 first, then slot 1 by rank
    assert kept[0].tolist() == [0, 1, 2] and kept[1].tolist() == [3, 4, -1]


def test_learns_where_rejections_happen():
    """After many steps that accept everything, the bonus slot's candidates win the budget."""
    planner = BranchPlanner(3, 3)
    for _ in range(50):
        planner.after_step(_readout([True] * 4, 3), accepted=4, token=TOKEN, rows=0, branch_s=0.0)
    kept = planner.select(_ids(4, 3), [True] * 4)
    assert kept[4].tolist() == _ids(4, 3)[4].tolist() and int((kept[:4] >= 0).sum()) == 0


def test_draft_tokens_the_exit_disputes_pull_the_budget_to_their_slot():
    planner = BranchPlanner(2, 2)
    for _ in range(50):  # top-1 draft tokens always pass, others always fail
        planner.after_step(_readout([True, False, True], 2), accepted=1, token=TOKEN, rows=0, branch_s=0.0)
    kept = planner.select(_ids(3, 2), [True, False, True])
    assert kept[1, 0] >= 0 and int((kept[2:] >= 0).sum()) == 0  # the budget goes where d_2 is disputed


def test_pruned_candidates_are_minus_one_and_empty_ones_stay_empty():
    ids = _ids(2, 2).clone()
    ids[2, 1] = -1
    kept = BranchPlanner(2, 2).select(ids, [False, False])
    assert int((kept >= 0).sum()) == 2 and kept[2, 1] == -1


def test_auto_budget_shrinks_to_what_fits_the_suffix_and_grows_back():
    """Batch time = 1 ms + 1 ms per row against a 9 ms suffix: the allowance settles where it fits."""
    from mirror_core.config import AUTO_BRANCH_BUDGET

    planner = BranchPlanner(AUTO_BRANCH_BUDGET, 4)
    ids = _ids(4, 4)
    rows = int((planner.select(ids, [True] * 4) >= 0).sum())
    assert rows == 20  # nothing measured yet: every candidate
    for _ in range(30):
        planner.after_step(_readout([True] * 4, 4, 9e-3), 0, TOKEN, rows, (1 + rows) * 1e-3)
        rows = int((planner.select(ids, [True] * 4) >= 0).sum())
    assert (1 + rows) * 1e-3 <= 9e-3 * 1.05 and rows >= 6
    for _ in range(30):  # the suffix got slower (or the draft faster): the allowance grows back
        planner.after_step(_readout([True] * 4, 4, 30e-3), 0, TOKEN, rows, (1 + rows) * 1e-3)
        rows = int((planner.select(ids, [True] * 4) >= 0).sum())
    assert rows == 20
