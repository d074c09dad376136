"""The held-out figures that predict decoding (training/draft/replay.py: chains, rollout_hits, evaluate): the rollouts
greedy speculative decoding drafts, replayed on teacher-forced answers. A rollout starts where the target has
committed the next token, the next one after its accepted tokens and the correction; Mirror-SD's hit asks whether
that correction (or the bonus token) was among the exit's top-κ at its slot, the draft's own token excluded."""
from __future__ import annotations

import torch

from training.draft.answers import AnswerSet
from training.draft.replay import agreed, chains, make_batch, rollout_hits, rollout_weights

V = 16  # draft vocabulary = target vocabulary here (to_draft is the identity; id 15 is "other")


def _batch(prompt: int, answer: int, depths: int, labels: list[int] | None = None):
    """make_batch over one sequence of `prompt` + `answer` tokens; the teacher's greedy token before answer token i is
    labels[i] (default 0), and its feature f_q at position q is the one-hot of q mod V (what rollout_hits reads)."""
    seqs = [(list(range(1, prompt + 1)), [5] * answer)]
    n = prompt + answer
    top = torch.tensor(labels or [0] * answer, dtype=torch.int32).unsqueeze(1).repeat(1, 2)   # [answer, 2]
    teacher = {"feat": torch.eye(V)[torch.arange(n) % V], "fstart": [0], "astart": [0], "top_ids": top}
    soft = (torch.zeros(answer, 2, dtype=torch.long), torch.zeros(answer, 2))
    answers = AnswerSet(seqs, teacher, soft, torch.arange(V), V - 1)
    return answers, make_batch(answers, [0], depths)


def _preds(batch, right: dict[int, set[int]], wrong_token: int = 9) -> list[torch.Tensor]:
    """The draft's tokens per depth: the teacher's label where `right[d]` holds the position, else `wrong_token`."""
    out = []
    for d, (rows, pos, _, _, label, *_) in enumerate(batch[2], 1):
        out.append(torch.tensor([int(lab) if int(p) in right[d] else wrong_token for p, lab in zip(pos, label)]))
    return out


def test_chains_replay_the_rollouts_greedy_decoding_drafts():
    _, batch = _batch(prompt=3, answer=7, depths=2)    # L = 10: depth 1 rows p = 1..7, depth 2 rows p = 0..6
    per_depth = batch[2]
    assert per_depth[0][1].tolist() == list(range(1, 8)) and per_depth[1][1].tolist() == list(range(0, 7))
    preds = _preds(batch, {1: {2, 3, 6}, 2: {3, 4, 6}})
    hits = agreed(batch, preds, torch.arange(V))
    # γ 2 from p = prompt − 1 = 2: [T, F] accepts 1 → p 4: [F, T] accepts 0 → p 5: [F, F] → p 6: [T, T] accepts 2 →
    # p 9: no whole rollout left. Every position's rollout (p = 2..6) would have averaged 1 + 5/5 = 2.0, not 1.75.
    ro = chains(batch, preds, hits, [3], 2)
    assert ro.start.tolist() == [2, 4, 5, 6] and ro.accepted.tolist() == [1, 0, 0, 2]
    assert ro.right.tolist() == [[True, False], [False, True], [False, False], [True, True]]
    assert ro.draft[0].tolist() == [0, 9]                  # what it drafted: the label, then the wrong token
    assert 1 + ro.accepted.float().mean().item() == 1.75   # τ at γ 2
    reached = ro.right.int().cumprod(1).sum(0).tolist()
    assert [reached[0] / 4, reached[1] / reached[0]] == [0.5, 0.5]  # a_1, a_2 given depth 1 right
    # γ 1 reads depth 1 only: p 2 [T] → p 4 [F] → p 5 [F] → p 6 [T] → p 8: none
    assert chains(batch, preds, hits, [3], 1).start.tolist() == [2, 4, 5, 6]


def test_the_rows_decoding_evaluates_can_weigh_more_in_the_loss():
    _, batch = _batch(prompt=3, answer=7, depths=2)
    preds = _preds(batch, {1: {2, 3, 6}, 2: {3, 4, 6}})
    w1, w2 = rollout_weights(batch, preds, torch.arange(V), [3], 2.0)
    # rollouts at p 2, 4, 5, 6 accept 1, 0, 0, 2: decoding evaluates depth 1 of each, depth 2 of p 2 and p 6
    assert {int(p): float(w) for p, w in zip(batch[2][0][1], w1)} == {1: 1, 2: 3, 3: 1, 4: 3, 5: 3, 6: 3, 7: 1}
    assert {int(p): float(w) for p, w in zip(batch[2][1][1], w2)} == {0: 1, 1: 1, 2: 3, 3: 1, 4: 1, 5: 1, 6: 3}


def test_a_hit_is_the_correction_or_bonus_token_among_the_exit_candidates_at_its_slot():
    # answer labels: x_{q+1} predicted from position q has label labels[q − (prompt − 1)]
    labels = [0, 7, 3, 3, 3, 3, 3, 3, 3]
    answers, batch = _batch(prompt=3, answer=9, depths=2, labels=labels)
    preds = _preds(batch, {1: {2, 5}, 2: {2}}, wrong_token=4)
    ro = chains(batch, preds, agreed(batch, preds, torch.arange(V)), [3], 2)
    assert ro.start.tolist() == [2, 5, 7, 8] and ro.accepted.tolist() == [2, 1, 0, 0]

    def readout(f):  # the exit's logits at a slot: its position q (one-hot f_q) ranks 3, then 7, then 4, then q
        q = f.argmax(-1)
        z = torch.zeros(len(f), V)
        z[:, 3], z[:, 7], z[:, 4] = 3.0, 2.0, 1.0
        z[torch.arange(len(f)), q] = 5.0
        return z

    got = rollout_hits(ro, [0], answers, readout)
    # rollout p 2, k 2 (bonus): slot position 5 ranks [5, 3, 7, 4]; the target's token there, labels[3] = 3: κ ≥ 2
    # rollout p 5, k 1: slot position 7 ranks [7, 3, 4, …] with the draft's d_2 = 4 excluded → [7, 3, 0, …];
    #   labels[5] = 3 → from κ 2
    # rollouts p 7 and 8, k 0: slot positions 8, 9 rank [q, 3, 7, …] with d_1 = 4 excluded; labels[6], [7] = 3
    assert got.tolist() == [[False, True, True, True]] * 4
    labels[3] = 5                                           # the bonus slot's own top-1 is its target token
    answers, _ = _batch(prompt=3, answer=9, depths=2, labels=labels)
    assert rollout_hits(ro, [0], answers, readout)[0].tolist() == [True] * 4


def test_a_sequence_too_short_for_a_whole_chain_gives_none():
    _, batch = _batch(prompt=8, answer=2, depths=4)    # rows at every depth, but no chain reaches depth 4
    preds = [torch.zeros(len(rows), dtype=torch.long) for rows, *_ in batch[2]]
    ro = chains(batch, preds, agreed(batch, preds, torch.arange(V)), [8], 4)
    assert ro.right.shape == (0, 4) and ro.accepted.tolist() == []
