"""The held-out figures that predict decoding (train/feature_distill.py: chains, evaluate): a chain is a rollout
greedy decoding drafts, from a position where the target has committed the next token, all γ tokens inside the
answer; a_d counts depth d only where depths 1..d−1 were right."""
from __future__ import annotations

import torch

from mirror_core.train.feature_distill import chains, make_batch


def _batch(prompt: int, answer: int, depths: int):
    """make_batch over one sequence of `prompt` + `answer` tokens (features and teacher figures are zeros)."""
    seqs = [(list(range(1, prompt + 1)), list(range(10, 10 + answer)))]
    n = prompt + answer
    teacher = {"feat": torch.zeros(n, 4), "fstart": [0], "astart": [0], "top_ids": torch.zeros(answer, 2, dtype=torch.int32)}
    soft = (torch.zeros(answer, 2, dtype=torch.long), torch.zeros(answer, 2))
    return make_batch(seqs, [0], teacher, soft, torch.arange(64), 63, depths)


def test_chains_replay_the_rollouts_greedy_decoding_drafts():
    batch = _batch(prompt=3, answer=7, depths=2)          # L = 10: depth 1 rows p = 1..7, depth 2 rows p = 0..6
    per_depth = batch[2]
    assert per_depth[0][1].tolist() == list(range(1, 8)) and per_depth[1][1].tolist() == list(range(0, 7))
    right = {1: {2, 3, 6}, 2: {3, 4, 6}}                   # positions p where depth d was right
    hits = [torch.tensor([int(p) in right[d + 1] for p in per_depth[d][1]]) for d in range(2)]
    # γ 2 from p = prompt − 1 = 2: [T, F] accepts 1 → p 4: [F, T] accepts 0 → p 5: [F, F] → p 6: [T, T] accepts 2 →
    # p 9: no whole rollout left. Every position's rollout (p = 2..6) would have averaged 1 + 5/5 = 2.0, not 1.75.
    got = chains(batch, hits, [3], 2)
    assert got.tolist() == [[True, False], [False, True], [False, False], [True, True]]
    runs = got.int().cumprod(1)                            # leading run: what greedy decoding accepts
    assert 1 + runs.sum().item() / len(runs) == 1.75       # τ at γ 2
    reached = runs.sum(0).tolist()
    assert [reached[0] / len(runs), reached[1] / reached[0]] == [0.5, 0.5]  # a_1, a_2 given depth 1 right
    # γ 1 reads depth 1 only: p 2 [T] → p 4 [F] → p 5 [F] → p 6 [T] → p 8: none
    assert chains(batch, hits, [3], 1).tolist() == [[True], [False], [False], [True]]


def test_a_sequence_too_short_for_a_whole_chain_gives_none():
    batch = _batch(prompt=8, answer=2, depths=4)           # rows at every depth, but no chain reaches depth 4
    hits = [torch.ones(len(rows), dtype=torch.bool) for rows, *_ in batch[2]]
    assert chains(batch, hits, [8], 4).shape == (0, 4)
