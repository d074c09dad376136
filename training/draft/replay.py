"""The rollouts greedy speculative decoding drafts, replayed on teacher-forced answers: the batches of the training-time
test, the draft's tokens at every depth, and from them the held-out figures that predict decoding (agreement by
depth, τ by γ, a_d, Mirror-SD's hit rate by γ and κ).

A rollout starts where the target has committed the next token; the next one starts after its accepted tokens and
the correction. Teacher-forced depth d reads exactly what the rollout reads when depths 1..d−1 were right, so
these are decoding's own rollouts (while a whole one fits in the answer).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from training.draft.answers import AnswerSet
from training.precision import autocast

HIT_KAPPAS = 4  # κ = 1..4: the hit rates a profile keeps per γ


def make_batch(answers: AnswerSet, chunk: list[int], depths: int):
    """The training-time test's batch of sequences `chunk`: ids [B, T] (x_{p+1} in draft ids), features [B, T, H]
    (f_p), and per depth d the loss rows: (batch row, position p) with the teacher's answer row for position p+d,
    and the true feature f_{p+d}."""
    seqs, teacher, (sid, sprob) = answers.seqs, answers.teacher, answers.soft
    to_draft, other = answers.to_draft, answers.other
    lens = [len(seqs[i][0]) + len(seqs[i][1]) for i in chunk]
    t = max(lens) - 1
    ids = torch.full((len(chunk), t), other, dtype=torch.long)
    feats = torch.zeros(len(chunk), t, teacher["feat"].shape[1], dtype=torch.float32)
    per_depth = []
    for r, i in enumerate(chunk):
        p, a = seqs[i]
        s = torch.tensor(p + a)
        ids[r, : lens[r] - 1] = to_draft[s[1:]]
        f0 = teacher["fstart"][i]
        feats[r, : lens[r] - 1] = teacher["feat"][f0: f0 + lens[r] - 1].float()
    for d in range(1, depths + 1):
        rows, pos, arow, frow = [], [], [], []
        for r, i in enumerate(chunk):
            p, a = seqs[i]
            first = max(0, len(p) - 1 - d)                # p + d ≥ len(prompt) − 1: predicts an answer token
            last = lens[r] - 2 - d                        # p + d ≤ L − 2
            if last < first:
                continue
            ps = torch.arange(first, last + 1)
            rows.append(torch.full_like(ps, r))
            pos.append(ps)
            arow.append(teacher["astart"][i] + ps + d - (len(p) - 1))
            frow.append(teacher["fstart"][i] + ps + d)
        rows, pos, arow, frow = (torch.cat(x) for x in (rows, pos, arow, frow))
        per_depth.append((rows, pos, sid[arow], sprob[arow], teacher["top_ids"][arow, 0].long(),
                          teacher["feat"][frow].float(), arow))
    return ids, feats, per_depth


def depth_logits(model, batch, other: int, linear=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The training-time test's outputs at each depth's rows (make_batch's): features g [N_d, H] and logits
    [N_d, V_d+1] with the "other" id masked, so that argmax is the draft's token. `linear`: the products' maths
    (None: torch's matmul; a kernel format's packed maps, runners/feature_kernel.py: PackedMaps)."""
    from mirror_core.models.feature_draft import plain_linear, train_step_outputs

    linear = linear or plain_linear
    ids, feats, per_depth = batch
    outs = train_step_outputs(model, ids, feats, len(per_depth), linear)
    gs = [g[rows, pos] for g, (rows, pos, *_) in zip(outs, per_depth)]                    # [N_d, H] per depth
    return gs, [model.logits(gd, linear).float().index_fill_(1, torch.tensor([other]), -1e4) for gd in gs]


def rollout_weights(batch, preds, to_draft, prompt_lens: list[int], extra: float) -> list[torch.Tensor]:
    """Per depth, each row's loss weight: 1 + `extra` where greedy decoding at γ = depths evaluates it (the depths
    1..k+1 of each rollout `chains` replays, k its accepted length: the positions that decide τ), else 1."""
    ids, _, per_depth = batch
    ro = chains(batch, preds, agreed(batch, preds, to_draft), prompt_lens, len(per_depth))
    grid = torch.zeros(*ids.shape, len(per_depth))                                       # [B, T, γ]
    grid[ro.row, ro.start] = (torch.arange(len(per_depth)) <= ro.accepted.unsqueeze(1)).float()
    return [1 + extra * grid[rows, pos, d] for d, (rows, pos, *_) in enumerate(per_depth)]


def agreed(batch, preds: list[torch.Tensor], to_draft: torch.Tensor) -> list[torch.Tensor]:
    """Per depth, where the draft's top-1 is the target's greedy token: bool [N_d]."""
    return [p == to_draft[label] for p, (_, _, _, _, label, *_) in zip(preds, batch[2])]


@dataclass(frozen=True)
class Rollouts:
    """Greedy speculative decoding's rollouts at one γ on a batch (`chains`): where each starts, what it drafted, and
    which of its depths were right."""
    row: torch.Tensor      # [n] the batch row
    start: torch.Tensor    # [n] p: the rollout drafts after the committed x_{p+1}, reading f_p
    draft: torch.Tensor    # [n, γ] the draft's token at each depth (draft ids)
    right: torch.Tensor    # [n, γ] bool

    @property
    def accepted(self) -> torch.Tensor:
        """[n] each rollout's accepted length: its run of leading right depths."""
        return self.right.int().cumprod(1).sum(1)


def chains(batch, preds: list[torch.Tensor], hits: list[torch.Tensor], prompt_lens: list[int], gamma: int) -> Rollouts:
    """The rollouts greedy speculative decoding at `gamma` drafts on these answers. Decoding drafts from p = prompt − 1
    (the target has committed x_{p+1}); a rollout's accepted length k is its run of right depths, and the next one
    starts at p + k + 1, after the correction or bonus token. Teacher-forced depth d reads exactly what the rollout
    reads when depths 1..d−1 were right, so these are decoding's own rollouts (while a whole one fits in the answer):
    a draft's mistakes cluster, and a rollout after a rejection starts where the draft was just wrong, which an
    average over every position would not weigh."""
    ids, _, per_depth = batch
    b, t = ids.shape
    right = torch.zeros(b, t, gamma, dtype=torch.bool)
    drafted = torch.zeros(b, t, gamma, dtype=torch.long)
    defined = torch.zeros(b, t, gamma, dtype=torch.bool)
    for d, ((rows, pos, *_), pred, hit) in enumerate(zip(per_depth[:gamma], preds, hits)):
        right[rows, pos, d], drafted[rows, pos, d], defined[rows, pos, d] = hit, pred, True
    whole, runs = defined.all(-1).tolist(), right.int().cumprod(-1).sum(-1).tolist()          # [B][T] each
    at = []
    for r, plen in enumerate(prompt_lens):
        p = plen - 1
        while p < t and whole[r][p]:
            at.append((r, p))
            p += runs[r][p] + 1
    row, start = (torch.tensor([x[k] for x in at], dtype=torch.long) for k in (0, 1))
    return Rollouts(row, start, drafted[row, start], right[row, start])


def rollout_hits(ro: Rollouts, chunk: list[int], answers: AnswerSet, exit_readout) -> torch.Tensor:
    """For each rollout whose correction or bonus token lies in the answer: is that token among the exit's top-κ
    candidates at its slot (κ = 1..4, the draft's token there excluded; none at the bonus slot)? Bool [m, 4], what
    Mirror-SD's hit counts. Slot s = k + 1 is the verification row at position p + s (its exit feature f_{p+s}),
    which predicts x_{p+s+1}. `exit_readout` maps features [m, H] to logits over the draft vocabulary [m, V_d]."""
    seqs, teacher = answers.seqs, answers.teacher
    gamma = ro.right.shape[1]
    k = ro.accepted
    q = ro.start + k + 1                                                               # the slot's position
    plen = torch.tensor([len(seqs[chunk[r]][0]) for r in ro.row.tolist()])
    alen = torch.tensor([len(seqs[chunk[r]][1]) for r in ro.row.tolist()])
    arow = q - (plen - 1)                                                              # its answer row
    keep = arow < alen
    if not bool(keep.any()):
        return torch.zeros(0, HIT_KAPPAS, dtype=torch.bool)
    rows = ro.row[keep].tolist()
    f = torch.tensor([teacher["fstart"][chunk[r]] for r in rows]) + q[keep]
    a = torch.tensor([teacher["astart"][chunk[r]] for r in rows]) + arow[keep]
    z = exit_readout(teacher["feat"][f].float())                                        # [m, V_d]
    kk = k[keep]
    excluded = ro.draft[keep].gather(1, kk.clamp(max=gamma - 1).unsqueeze(1)).squeeze(1)  # d_s (bonus: none)
    inside = (kk < gamma) & (excluded < z.shape[1])
    z[inside.nonzero().squeeze(1), excluded[inside]] = float("-inf")
    top = z.topk(HIT_KAPPAS, -1).indices                                               # [m, κ]
    label = answers.to_draft[teacher["top_ids"][a, 0].long()].unsqueeze(1)              # [m, 1]
    return (top == label).cumsum(1) > 0


@torch.no_grad()
def evaluate(model, answers: AnswerSet, cfg, exit_readout=None, linear=None) -> dict:
    """Held-out figures of the draft, teacher-forced (depth d reads d−1 of its own features), γ up to cfg.depths:
    - agreement[d]: top-1 agreement with the target's greedy token at depth d, over every answer position;
    - tau_by_gamma[γ − 1]: 1 + the mean accepted length of the rollouts greedy speculative decoding drafts at γ
      (`chains`): its τ (tokens committed per target pass, the correction or bonus token included), replayed on the
      held-out answers; tau: the one at γ = depths;
    - accept[d]: the agreement at depth d given 1..d−1 were right, over those rollouts at γ = depths (the a_d of
      latency.DraftProfile, which continues τ past the measured γ);
    - with `exit_readout` (features → logits over the draft vocabulary, as rollout_hits takes it): hit_by_gamma[γ − 1]
      [κ − 1], the share of those rollouts whose correction or bonus token was among the exit's top-κ at its slot:
      Mirror-SD's hit rate, replayed.
    `linear`: the draft's products as a kernel format computes them (depth_logits; None: torch's, in cfg.dtype)."""
    model.eval()
    hits, n = [0] * cfg.depths, [0] * cfg.depths
    runs: list[list[torch.Tensor]] = [[] for _ in range(cfg.depths)]      # per γ: [rollouts, γ] leading runs
    slots: list[list[torch.Tensor]] = [[] for _ in range(cfg.depths)]     # per γ: [rollouts, 4] hit by κ
    idx = list(range(len(answers.seqs)))
    for b in range(0, len(idx), cfg.batch_sequences):
        chunk = idx[b: b + cfg.batch_sequences]
        batch = make_batch(answers, chunk, cfg.depths)
        with autocast(cfg.dtype):
            preds = [z.argmax(-1) for z in depth_logits(model, batch, answers.other, linear)[1]]  # [N_d] draft ids
        right = agreed(batch, preds, answers.to_draft)
        for d, r in enumerate(right):
            hits[d] += int(r.sum())
            n[d] += len(r)
        for g in range(1, cfg.depths + 1):
            ro = chains(batch, preds, right, answers.prompt_lens(chunk), g)
            runs[g - 1].append(ro.right.int().cumprod(1))
            if exit_readout is not None:
                slots[g - 1].append(rollout_hits(ro, chunk, answers, exit_readout))
    model.train()
    return _figures(hits, n, runs, slots if exit_readout is not None else None, cfg.depths)


def _figures(hits: list[int], n: list[int], runs: list[list[torch.Tensor]], slots: list[list[torch.Tensor]] | None,
             depths: int) -> dict:
    """evaluate's figures from its counts: agreement by depth, a_d, τ by γ (up to the largest γ whose rollouts fit),
    and with the slots the hit rates by γ and κ."""
    done = [torch.cat(r) if r else torch.zeros(0, g, dtype=torch.int) for g, r in enumerate(runs, 1)]
    measured = next((g for g, r in enumerate(done) if len(r) == 0), len(done))  # γ past it: no whole rollout fits
    reached = done[-1].sum(0).tolist()                               # γ = depths: rollouts right through depth d
    figures = {"agreement": [round(h / max(k, 1), 4) for h, k in zip(hits, n)],
               "accept": [round(reached[d] / max(reached[d - 1] if d else len(done[-1]), 1), 4)
                          for d in range(depths)],
               "tau_by_gamma": [round(1 + float(r.sum()) / len(r), 4) for r in done[:measured]],
               "chains": len(done[-1])}
    figures["tau"] = figures["tau_by_gamma"][-1] if measured == depths else None
    if slots is not None:
        hit = [torch.cat(x) for x in slots[:measured]]
        figures["hit_by_gamma"] = [[round(float(h[:, k].float().mean()), 4) if len(h) else 0.0
                                    for k in range(HIT_KAPPAS)] for h in hit]
    return figures


@torch.no_grad()
def first_predictions(model, answers: AnswerSet, cfg) -> torch.Tensor:
    """The draft's depth-1 greedy token (draft ids) at every answer row, teacher-forced: the d_j that M_t excludes."""
    model.eval()
    seqs = answers.seqs
    pred = torch.full((answers.teacher["top_ids"].shape[0],), answers.other, dtype=torch.long)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    for b in range(0, len(order), 32):
        batch = make_batch(answers, order[b: b + 32], 1)
        with autocast(cfg.dtype):
            pred[batch[2][0][-1]] = depth_logits(model, batch, answers.other)[1][0].argmax(-1)  # at its answer rows
    model.train()
    return pred
