"""Distil the feature-reading draft (models/feature_draft.py) and its pair's exit head from the target's answers.

    python -m training.draft.chat_data --more --out WORK/answers                     # training answers
    python -m training.draft.chat_data --held-out --more --limit 96 --out WORK/heldout  # new-topic answers
    python -m training.draft.feature_distill --answers WORK/answers --heldout WORK/heldout --work WORK \\
        --out assets/smollm2_pair --minutes 60

Stages (the teacher pass is cached in WORK):
1. teacher pass: the hidden state after layer ℓ_e at every position of every prompt + answer (the draft's input
   features) and the target's top-k next-token logits at answer positions, copied from the records where chat_data
   recorded them while generating, computed by the target for the rest (in `--dtype`: auto takes bfloat16 only
   where precision.py measures it faster, as for the training's autocast); `--train-tokens N` trains on a
   seeded random subset of about N answer tokens (the data-volume probe).
2. the draft vocabulary (distill.draft_vocabulary over these answers) and the exit head at ℓ_e (distill.train_exit_head).
3. the draft, trained with EAGLE-3's training-time test: unrolled to `depths` tokens on its own predicted features
   (feature_draft.train_step_outputs), loss = KL to the target's top-k + hard_weight × CE on its greedy token +
   feature_weight × smooth-L1 to the true next feature, depth d weighted decay^(d−1), answer positions only;
   `--rollout-weight λ` weighs the KL and CE of the rows greedy decoding evaluates 1 + λ (rollout_weights).
   `--init FOLDER` continues a saved feature draft instead (its weights, its vocabulary, its exit head as the start
   of stage 2's): more data for a draft that has already seen the first, without paying for its first passes again;
   with a larger `--num-layers` it grows the draft first (feature_draft.grown: the new layers start as identities).
4. held-out (new topics, never in training prompts): teacher-forced top-1 agreement per depth; τ replayed from the
   rollouts greedy speculative decoding drafts on those answers (evaluate, chains), logged along the way at γ =
   depths and, with Mirror-SD's hit rate at each slot (rollout_hits), at γ 1..8 into the draft's profile for the
   latency model; the vocabulary's coverage, and the pair's previous token-only draft (`--compare`) on the same answers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mirror_core.latency import GAMMAS
from mirror_core.models.feature_draft import FeatureDraft, from_target, grown
from mirror_core.models.vocab import VocabMap
from training.draft.chat_sources import FEATURE_LAYER, TOPK
from training.draft.distill import (
    ExitHeadTask,
    draft_vocabulary,
    length_chunks,
    load_sequences,
    load_target,
    prepare_run,
    read_json,
    run_record,
    save_exit_head,
    scheduled_lr,
    shard_paths,
    soft_targets,
    train_exit_head,
)
from training.precision import autocast, resolve, torch_dtype


@dataclass(frozen=True)
class FeatureDistillConfig:
    answers: str                                  # chat_data shard folders (training), comma-separated
    heldout: str                                  # chat_data shards of held-out topics (evaluation only)
    work: str                                     # teacher-pass cache
    out: str                                      # the pair folder: the draft goes to out/feature_draft/
    target: str = "smollm2-135m-instruct"
    feature_layer: int = FEATURE_LAYER            # ℓ_e: the exit layer whose output the draft reads
    num_layers: int = 1
    draft_vocab: int = 8192
    topk: int = TOPK
    depths: int = 4                               # training-time test: tokens unrolled on own features (γ)
    depth_decay: float = 0.8
    minutes: float = 60.0
    exit_epochs: float = 2.0
    batch_sequences: int = 16
    lr: float = 5e-4
    exit_lr: float = 1e-3
    hard_weight: float = 0.5
    wrong_weight: float = 4.0                     # exit head, second pass: weight of rows where the draft was wrong
    candidate_epochs: float = 1.0                 # exit head, second pass (0: keep the first head)
    feature_weight: float = 0.2
    seed: int = 0
    threads: int = 0
    compare: str = "assets/smollm2_pair/draft"    # the token-only draft to compare against ("" = none)
    eval_every: int = 500                         # steps between held-out evaluations (the agreement curve)
    train_tokens: int = 0                         # train on a seeded random subset of about this many answer tokens
                                                  # (0: all): the data-volume probe
    init: str = ""                                # a feature_draft folder to continue from: its vocabulary, exit
                                                  # head and weights ("": a new draft from the target's layers)
    dtype: str = "auto"                           # the teacher pass and the training's autocast: precision.PRECISIONS
    rollout_weight: float = 0.0                   # λ: rows greedy decoding evaluates weigh 1 + λ (rollout_weights)


# -- 1. teacher pass ------------------------------------------------------------------------------
@torch.inference_mode()
def teacher_pass(folders: list[str], keep: list[int], seqs, target_dir: str, layer: int, topk: int, path: str,
                 dtype: str, batch: int = 16) -> dict:
    """For `seqs`, the records of `folders` at indices `keep` (in shard_paths' order, counted across the folders):
    feat [Σ L_i, H] bf16 (h^(ℓ_e) at every position), fstart[i]; top_ids/top_logits [Σ A_i, k] at the positions
    predicting answer tokens, astart[i]. Copied from the records where chat_data recorded them at this layer with
    ≥ k logits (their last position's feature, never read, stays 0); a pass of the target in `dtype` computes the rest.
    Cached at `path` (teacher_path: named by the sequences, the layer and k)."""
    if os.path.exists(path):
        return torch.load(path)
    from transformers import AutoConfig

    lens = [len(p) + len(a) for p, a in seqs]
    fstart, astart, f_at, a_at = [], [], 0, 0
    for (p, a), n in zip(seqs, lens):
        fstart.append(f_at)
        astart.append(a_at)
        f_at, a_at = f_at + n, a_at + len(a)
    hidden = AutoConfig.from_pretrained(target_dir).hidden_size
    feat = torch.zeros(f_at, hidden, dtype=torch.bfloat16)
    top_ids = torch.empty(a_at, topk, dtype=torch.int32)
    top_logits = torch.empty(a_at, topk, dtype=torch.float16)
    t0 = time.time()
    local, missing, at = {g: i for i, g in enumerate(keep)}, [], 0
    for path_ in [p for folder in folders for p in shard_paths(folder)]:
        for r in torch.load(path_, mmap=True):
            i, at = local.get(at), at + 1
            if i is None:
                continue
            if (r["prompt"], r["answer"]) != seqs[i]:
                raise SystemExit(f"{path_} changed since its sequences were read (is chat_data still writing there?)")
            if r.get("feat_layer") != layer or r["top_ids"].shape[1] < topk:
                missing.append(i)
                continue
            a = len(seqs[i][1])
            feat[fstart[i]: fstart[i] + lens[i] - 1] = r["feat"]
            top_ids[astart[i]: astart[i] + a] = r["top_ids"][:, :topk]
            top_logits[astart[i]: astart[i] + a] = r["top_logits"][:, :topk]
    print(f"teacher pass: {len(seqs) - len(missing)}/{len(seqs)} sequences recorded at generation, "
          f"{time.time() - t0:.0f} s", flush=True)
    result = {"feat": feat, "fstart": fstart, "top_ids": top_ids, "top_logits": top_logits, "astart": astart,
              "recorded": len(seqs) - len(missing)}
    if missing:
        _forward_pass(seqs, missing, target_dir, layer, result, dtype, batch)
    result["seconds"] = round(time.time() - t0, 1)
    torch.save(result, path)
    return result


def _forward_pass(seqs, which: list[int], target_dir: str, layer: int, teacher: dict, dtype: str, batch: int) -> None:
    """The teacher's figures for sequences `which`, by full forwards of the target in `dtype`, written into place in
    `teacher` (teacher_pass's tensors and offsets)."""
    from transformers import AutoModelForCausalLM

    feat, fstart, top_ids, top_logits, astart = (teacher[k] for k in ("feat", "fstart", "top_ids", "top_logits",
                                                                      "astart"))
    topk = top_ids.shape[1]
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype(dtype)).eval()
    lens = [len(p) + len(a) for p, a in seqs]
    order = sorted(which, key=lambda i: lens[i])
    t0 = time.time()
    for b in range(0, len(order), batch):
        chunk = order[b: b + batch]
        width = max(lens[i] for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, i in enumerate(chunk):
            ids[r, : lens[i]] = torch.tensor(seqs[i][0] + seqs[i][1])
            mask[r, : lens[i]] = 1
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        for r, i in enumerate(chunk):
            p, a = seqs[i]
            feat[fstart[i]: fstart[i] + lens[i]] = out.hidden_states[layer][r, : lens[i]]
            top = out.logits[r, len(p) - 1: lens[i] - 1].float().topk(topk, dim=-1)            # [A, k]
            top_ids[astart[i]: astart[i] + len(a)] = top.indices.int()
            top_logits[astart[i]: astart[i] + len(a)] = top.values.half()
        if b // batch % 40 == 0:
            print(f"teacher pass: {b + len(chunk)}/{len(order)} sequences computed, {time.time() - t0:.0f} s",
                  flush=True)


def teacher_path(work: str, name: str, seqs, layer: int, topk: int, target: str, dtype: str) -> str:
    """The teacher cache's file, named by what it holds: a stale cache (other data, layer, k, target or the dtype its
    forward passes ran in) is never read."""
    key = zlib.crc32(f"{os.path.abspath(target)}/{layer}/{topk}/{len(seqs)}/{dtype}".encode())
    for p, a in seqs:
        key = zlib.crc32(torch.tensor(p + [-1] + a, dtype=torch.int32).numpy().tobytes(), key)
    return os.path.join(work, f"{name}_{key:08x}.pt")


def data_subset(seqs, answer_tokens: int, g: torch.Generator) -> list[int]:
    """A seeded random choice of records holding at least `answer_tokens` answer tokens (all: 0), in their order:
    the data-volume probe trains on 1×, 2×, 4× of a volume from one pool."""
    if not answer_tokens:
        return list(range(len(seqs)))
    keep, total = [], 0
    for i in torch.randperm(len(seqs), generator=g).tolist():
        if total >= answer_tokens:
            break
        keep.append(i)
        total += len(seqs[i][1])
    return sorted(keep)


# -- 3. the draft ---------------------------------------------------------------------------------
def make_batch(seqs, chunk: list[int], teacher: dict, soft, to_draft: torch.Tensor, other: int, depths: int):
    """ids [B, T] (x_{p+1} in draft ids), features [B, T, H] (f_p), and per depth d the loss rows: (batch row,
    position p) with the teacher's answer row for position p+d, and the true feature f_{p+d}."""
    sid, sprob = soft
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


def draft_loss(model, batch, cfg: FeatureDistillConfig, other: int, to_draft: torch.Tensor,
               prompt_lens: list[int] | None = None):
    """The training-time test's loss over every depth, and per depth the draft's top-1 token (draft ids [N_d], in
    make_batch's row order; `agreed` compares them with the target's). With cfg.rollout_weight λ > 0 and the batch's
    prompt lengths, the KL and CE of a row that greedy decoding evaluates (rollout_weights) count 1 + λ, the rest 1."""
    gs, zs = depth_logits(model, batch, other)
    preds = [z.argmax(-1) for z in zs]                                                     # [N_d] draft ids
    weights = rollout_weights(batch, preds, to_draft, prompt_lens, cfg.rollout_weight) \
        if cfg.rollout_weight and prompt_lens else [None] * len(zs)

    def mean(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return x.mean() if w is None else (x * w).sum() / w.sum()

    loss = 0.0
    for d, (gd, z, w, (rows, pos, sid, sprob, label, f_next, _)) in enumerate(zip(gs, zs, weights, batch[2])):
        logp = F.log_softmax(z, -1)
        kl = mean(-(sprob * logp.gather(1, sid)).sum(-1), w)
        lab = to_draft[label]
        inside = lab != other
        hard = mean(F.nll_loss(logp[inside], lab[inside], reduction="none"), None if w is None else w[inside]) \
            if inside.any() else logp.new_zeros(())
        reg = F.smooth_l1_loss(gd.float(), f_next)
        loss = loss + cfg.depth_decay ** d * (kl + cfg.hard_weight * hard + cfg.feature_weight * reg)
    return loss, preds


def depth_logits(model, batch, other: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The training-time test's outputs at each depth's rows (make_batch's): features g [N_d, H] and logits
    [N_d, V_d+1] with the "other" id masked, so that argmax is the draft's token."""
    from mirror_core.models.feature_draft import train_step_outputs

    ids, feats, per_depth = batch
    outs = train_step_outputs(model, ids, feats, len(per_depth))
    gs = [g[rows, pos] for g, (rows, pos, *_) in zip(outs, per_depth)]                    # [N_d, H] per depth
    return gs, [model.logits(gd).float().index_fill_(1, torch.tensor([other]), -1e4) for gd in gs]


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


def rollout_hits(ro: Rollouts, chunk: list[int], seqs, teacher: dict, to_draft, exit_readout) -> torch.Tensor:
    """For each rollout whose correction or bonus token lies in the answer: is that token among the exit's top-κ
    candidates at its slot (κ = 1..4, the draft's token there excluded; none at the bonus slot)? Bool [m, 4], what
    Mirror-SD's hit counts. Slot s = k + 1 is the verification row at position p + s (its exit feature f_{p+s}),
    which predicts x_{p+s+1}. `exit_readout` maps features [m, H] to logits over the draft vocabulary [m, V_d]."""
    gamma = ro.right.shape[1]
    k = ro.accepted
    q = ro.start + k + 1                                                               # the slot's position
    plen = torch.tensor([len(seqs[chunk[r]][0]) for r in ro.row.tolist()])
    alen = torch.tensor([len(seqs[chunk[r]][1]) for r in ro.row.tolist()])
    arow = q - (plen - 1)                                                              # its answer row
    keep = arow < alen
    if not bool(keep.any()):
        return torch.zeros(0, 4, dtype=torch.bool)
    rows = ro.row[keep].tolist()
    f = torch.tensor([teacher["fstart"][chunk[r]] for r in rows]) + q[keep]
    a = torch.tensor([teacher["astart"][chunk[r]] for r in rows]) + arow[keep]
    z = exit_readout(teacher["feat"][f].float())                                        # [m, V_d]
    kk = k[keep]
    excluded = ro.draft[keep].gather(1, kk.clamp(max=gamma - 1).unsqueeze(1)).squeeze(1)  # d_s (bonus: none)
    inside = (kk < gamma) & (excluded < z.shape[1])
    z[inside.nonzero().squeeze(1), excluded[inside]] = float("-inf")
    top = z.topk(4, -1).indices                                                        # [m, 4]
    label = to_draft[teacher["top_ids"][a, 0].long()].unsqueeze(1)                      # [m, 1]
    return (top == label).cumsum(1) > 0


@torch.no_grad()
def evaluate(model, seqs, idx, teacher, soft, to_draft, other, cfg, exit_readout=None) -> dict:
    """Held-out figures of the draft, teacher-forced (depth d reads d−1 of its own features), γ up to cfg.depths:
    - agreement[d]: top-1 agreement with the target's greedy token at depth d, over every answer position;
    - tau_by_gamma[γ − 1]: 1 + the mean accepted length of the rollouts greedy speculative decoding drafts at γ
      (`chains`): its τ (tokens committed per target pass, the correction or bonus token included), replayed on the
      held-out answers; tau: the one at γ = depths;
    - accept[d]: the agreement at depth d given 1..d−1 were right, over those rollouts at γ = depths (the a_d of
      latency.DraftProfile, which continues τ past the measured γ);
    - with `exit_readout` (features → logits over the draft vocabulary, as rollout_hits takes it): hit_by_gamma[γ − 1]
      [κ − 1], the share of those rollouts whose correction or bonus token was among the exit's top-κ at its slot:
      Mirror-SD's hit rate, replayed."""
    model.eval()
    hits, n = [0] * cfg.depths, [0] * cfg.depths
    runs: list[list[torch.Tensor]] = [[] for _ in range(cfg.depths)]      # per γ: [rollouts, γ] leading runs
    slots: list[list[torch.Tensor]] = [[] for _ in range(cfg.depths)]     # per γ: [rollouts, 4] hit by κ
    for b in range(0, len(idx), cfg.batch_sequences):
        chunk = idx[b: b + cfg.batch_sequences]
        batch = make_batch(seqs, chunk, teacher, soft, to_draft, other, cfg.depths)
        with autocast(cfg.dtype):
            preds = [z.argmax(-1) for z in depth_logits(model, batch, other)[1]]           # [N_d] draft ids
        right = agreed(batch, preds, to_draft)
        for d, r in enumerate(right):
            hits[d] += int(r.sum())
            n[d] += len(r)
        for g in range(1, cfg.depths + 1):
            ro = chains(batch, preds, right, [len(seqs[i][0]) for i in chunk], g)
            runs[g - 1].append(ro.right.int().cumprod(1))
            if exit_readout is not None:
                slots[g - 1].append(rollout_hits(ro, chunk, seqs, teacher, to_draft, exit_readout))
    model.train()
    done = [torch.cat(r) if r else torch.zeros(0, g, dtype=torch.int) for g, r in enumerate(runs, 1)]
    measured = next((g for g, r in enumerate(done) if len(r) == 0), len(done))  # γ past it: no whole rollout fits
    reached = done[-1].sum(0).tolist()                               # γ = depths: rollouts right through depth d
    figures = {"agreement": [round(h / max(k, 1), 4) for h, k in zip(hits, n)],
               "accept": [round(reached[d] / max(reached[d - 1] if d else len(done[-1]), 1), 4)
                          for d in range(cfg.depths)],
               "tau_by_gamma": [round(1 + float(r.sum()) / len(r), 4) for r in done[:measured]],
               "chains": len(done[-1])}
    figures["tau"] = figures["tau_by_gamma"][-1] if measured == cfg.depths else None
    if exit_readout is not None:
        hit = [torch.cat(x) for x in slots[:measured]]
        figures["hit_by_gamma"] = [[round(float(h[:, k].float().mean()), 4) if len(h) else 0.0 for k in range(4)]
                                   for h in hit]
    return figures


@torch.no_grad()
def token_draft_agreement(folder: str, seqs) -> float:
    """The token-only draft's teacher-forced top-1 agreement with the target's answers (answer positions)."""
    from transformers import AutoModelForCausalLM

    from mirror_core.models.vocab import load_vocab_map

    draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vmap = load_vocab_map(folder)
    hits = n = 0
    for p, a in seqs:
        s = torch.tensor(p + a)
        logits = draft(input_ids=vmap.to_draft[s].unsqueeze(0)).logits[0, len(p) - 1: len(s) - 1]   # [A, V_d+1]
        logits[:, vmap.size] = -1e4
        hits += int((vmap.target_ids[logits.argmax(-1)] == s[len(p):]).sum())
        n += len(a)
    return round(hits / max(n, 1), 4)


@torch.no_grad()
def first_predictions(model, seqs, teacher, soft, to_draft, other, cfg) -> torch.Tensor:
    """The draft's depth-1 greedy token (draft ids) at every answer row, teacher-forced: the d_j that M_t excludes."""
    model.eval()
    pred = torch.full((teacher["top_ids"].shape[0],), other, dtype=torch.long)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    for b in range(0, len(order), 32):
        batch = make_batch(seqs, order[b: b + 32], teacher, soft, to_draft, other, 1)
        with autocast(cfg.dtype):
            pred[batch[2][0][-1]] = depth_logits(model, batch, other)[1][0].argmax(-1)      # at its answer rows
    model.train()
    return pred


def exit_readout(head, readout, ids: torch.Tensor):
    """The exit head (adapter, bias, gain) read out as the engine does (exit_head.py) through the target's Readout
    over the target ids `ids` (the draft vocabulary): features [n, H] → logits [n, V_d]."""
    from mirror_core.models.ops import rms_norm

    adapter, bias, gain = (t.float() for t in head)
    lm_rows, eps = readout.lm_head[ids].float(), readout.eps                                  # [V_d, H]
    return lambda h: rms_norm(h.float() @ adapter + bias, gain, eps) @ lm_rows.t()


def hit_coverage(readout, h: torch.Tensor, label: torch.Tensor, pred: torch.Tensor) -> dict:
    """Where the draft's token was wrong: the share whose target token is in the readout's top-κ with the draft's
    token excluded (what M_t sends), κ = 1, 2, 4: the hit rate this head can give at those slots."""
    wrong = pred != label
    z = readout(h[wrong])                                                                       # [n, V_d]
    z.scatter_(1, pred[wrong].clamp(max=z.shape[1] - 1).unsqueeze(1), float("-inf"))
    top = z.topk(4, -1).indices
    lab = label[wrong].unsqueeze(1)
    return {"draft_wrong_share": round(float(wrong.float().mean()), 4),
            **{f"top{k}": round(float((top[:, :k] == lab).any(1).float().mean()), 4) for k in (1, 2, 4)}}


def train(cfg: FeatureDistillConfig, model, seqs, train_idx, teacher, soft, to_draft, other, held, g) -> list[dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget, warmup = cfg.minutes * 60, 50
    t0, step, log = time.time(), 0, []

    def point(minutes: float) -> None:  # one point of the held-out curve (evaluate's figures)
        f = held()
        log.append({"step": step, "minutes": round(minutes, 2), "heldout_agreement": f["agreement"],
                    "heldout_accept": f["accept"], "heldout_tau": f["tau"]})
        print(f"held-out after {step} steps: top-1 by depth {f['agreement']}, given the earlier depths right "
              f"{f['accept']}, predicted greedy τ at γ {cfg.depths}: {f['tau']}", flush=True)

    point(0.0)
    while time.time() - t0 < budget:
        for chunk in length_chunks(seqs, train_idx, cfg.batch_sequences, g):
            elapsed = time.time() - t0
            if elapsed >= budget:
                break
            for group in opt.param_groups:
                group["lr"] = scheduled_lr(cfg.lr, step, elapsed, budget, warmup)
            batch = make_batch(seqs, chunk, teacher, soft, to_draft, other, cfg.depths)
            with autocast(cfg.dtype):
                loss, preds = draft_loss(model, batch, cfg, other, to_draft, [len(seqs[i][0]) for i in chunk])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step}: loss {float(loss.detach()):.3f}, batch top-1 by depth "
                      f"{[round(float(r.float().mean()), 3) for r in agreed(batch, preds, to_draft)]}, "
                      f"{elapsed / 60:.1f} min", flush=True)
            if step % cfg.eval_every == 0:
                point(elapsed / 60)
    point((time.time() - t0) / 60)
    return log


def distill(cfg: FeatureDistillConfig) -> dict:
    """Teacher passes, vocabulary, exit head, draft, candidates where they matter, saved draft (this module's
    docstring's stages)."""
    target_dir, g = prepare_run(cfg.threads, cfg.work, cfg.seed, cfg.target)
    cfg = dataclasses.replace(cfg, dtype=resolve(cfg.dtype))  # measured at the run's threads; the record names it
    start = continued_draft(cfg, target_dir) if cfg.init else None
    folders = cfg.answers.split(",")
    pool = [s for folder in folders for s in load_sequences(folder)]
    keep = data_subset(pool, cfg.train_tokens, g)
    seqs = [pool[i] for i in keep]
    held_seqs = load_sequences(cfg.heldout)
    timings = {}
    t = time.time()
    layer, k = cfg.feature_layer, cfg.topk
    teacher = teacher_pass(folders, keep, seqs, target_dir, layer, k,
                           teacher_path(cfg.work, "teacher_f", seqs, layer, k, target_dir, cfg.dtype), cfg.dtype)
    held_teacher = teacher_pass([cfg.heldout], list(range(len(held_seqs))), held_seqs, target_dir, layer, k,
                                teacher_path(cfg.work, "teacher_f_heldout", held_seqs, layer, k, target_dir, cfg.dtype),
                                cfg.dtype)
    timings["teacher_pass_s"] = round(time.time() - t, 1)
    target, readout, always = load_target(target_dir)
    vmap = start.vmap if start else VocabMap.from_ids(draft_vocabulary(seqs, cfg.draft_vocab, always),
                                                       int(target.config.vocab_size))
    to_draft, other = vmap.to_draft, vmap.size
    coverage = {"train": _coverage(seqs, vmap), "heldout": _coverage(held_seqs, vmap)}
    print(f"draft vocabulary: {vmap.size} tokens cover {coverage['train']} of training answer tokens, "
          f"{coverage['heldout']} of held-out ones", flush=True)
    soft = soft_targets(teacher["top_ids"], teacher["top_logits"], to_draft, other)
    held_soft = soft_targets(held_teacher["top_ids"], held_teacher["top_logits"], to_draft, other)
    t = time.time()
    task = _exit_head_task(cfg, teacher, seqs, readout, vmap.target_ids, soft, g)
    head, exit_cov = train_exit_head(dataclasses.replace(task, init=start.head) if start else task, g)
    timings["exit_head_s"] = round(time.time() - t, 1)
    model = grown(start.model, target, cfg.num_layers) if start else \
        from_target(target, vmap.target_ids, cfg.num_layers, cfg.feature_layer, head)
    model = model.float().train().requires_grad_(True)
    held_idx = list(range(len(held_seqs)))

    def held():
        return evaluate(model, held_seqs, held_idx, held_teacher, held_soft, to_draft, other, cfg)

    t = time.time()
    log = train(cfg, model, seqs, list(range(len(seqs))), teacher, soft, to_draft, other, held, g)
    timings["draft_s"] = round(time.time() - t, 1)
    compare = token_draft_agreement(cfg.compare, held_seqs) if cfg.compare else None
    t = time.time()
    head, candidates = candidate_pass(cfg, model, task, head, (seqs, teacher, soft), (held_seqs, held_teacher, held_soft),
                                      to_draft, other, g)
    timings["candidate_head_s"] = round(time.time() - t, 1)
    profile = evaluate(model, held_seqs, held_idx, held_teacher, held_soft, to_draft, other,  # at every γ that
                       dataclasses.replace(cfg, depths=max(GAMMAS)), exit_readout(head, task.readout, task.ids))  # is tried
    _save_feature_draft(cfg, model, vmap, target, head, candidates, profile, len(held_seqs))
    summary = {**run_record(cfg), "sequences": len(seqs), "answer_tokens": sum(len(a) for _, a in seqs),
               "pool_sequences": len(pool), "teacher_recorded": teacher["recorded"],
               "sources": {f: _generated(f) for f in folders},
               "continued_from": start.record if start else None, "draft_vocab_size": vmap.size,
               "heldout_sequences": len(held_seqs), "heldout_answer_tokens": sum(len(a) for _, a in held_seqs),
               "vocab_coverage": coverage, "exit_coverage": exit_cov, "candidate_coverage": candidates,
               "draft_log": log, "profile": profile, "token_draft_heldout_agreement": compare, "timings": timings,
               "draft_params": sum(p.numel() for p in model.parameters())}
    with open(os.path.join(cfg.out, "feature_distill.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary


@dataclass(frozen=True)
class ContinuedDraft:
    """Where `--init` starts: a saved feature draft's weights, vocabulary and exit head (adapter, bias, gain), and the
    record of the run that wrote it (None when none was found beside it)."""
    model: FeatureDraft
    vmap: VocabMap
    head: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    record: dict | None


def continued_draft(cfg: FeatureDistillConfig, target_dir: str) -> ContinuedDraft:
    """The draft in cfg.init, checked against this run's target and settings before any teacher pass (SystemExit
    saying what differs)."""
    from transformers import AutoConfig

    from mirror_core.config import MirrorError
    from mirror_core.engine import check_feature_draft
    from mirror_core.models.exit_head import find_exit_head
    from mirror_core.models.feature_draft import load_feature_draft
    from mirror_core.models.vocab import load_vocab_map

    try:
        model, vmap, head = load_feature_draft(cfg.init), load_vocab_map(cfg.init), find_exit_head(cfg.init)
        target_cfg = AutoConfig.from_pretrained(target_dir)
        check_feature_draft(model.cfg, target_cfg, vmap)
    except MirrorError as exc:
        raise SystemExit(f"--init {cfg.init} cannot continue here: {exc}") from None
    dc = model.cfg
    if head is None or head.matches(target_cfg) or head.layer != cfg.feature_layer \
            or not torch.equal(head.ids, vmap.target_ids):
        raise SystemExit(f"--init {cfg.init} cannot continue here: it needs its exit head for this target at layer "
                         f"{cfg.feature_layer} over its own vocabulary beside it")
    if dc.feature_layer != cfg.feature_layer or dc.num_layers > cfg.num_layers:
        raise SystemExit(f"--init {cfg.init} cannot continue here: it reads layer {dc.feature_layer} with "
                         f"{dc.num_layers} layer(s), not --feature-layer {cfg.feature_layer} --num-layers {cfg.num_layers} "
                         "(a draft can grow layers, never drop them)")
    record = earlier_record(cfg.init)
    grow = f", grown to {cfg.num_layers}" if cfg.num_layers > dc.num_layers else ""
    print(f"continuing the draft in {cfg.init} ({vmap.size} tokens, {dc.num_layers} layer(s){grow}; "
          f"{'its run record found' if record else 'no record of its run found beside it'})", flush=True)
    return ContinuedDraft(model, vmap, (head.adapter, head.bias, head.gain), record)


def _generated(folder: str) -> dict | None:
    """A folder's totals from chat_data's generation.json (None for answers made otherwise)."""
    g = read_json(os.path.join(folder, "generation.json"))
    return {k: g.get(k) for k in ("records", "answer_tokens", "seconds", "threads")} if g else None


def earlier_record(init: str) -> dict | None:
    """The record (feature_distill.json) of the run that wrote the draft in `init`: in the pair folder holding it, or
    in the draft's own folder; only when the draft's profile keeps that run's exit hit rates (`kappa_hits` of its
    candidate pass: scripts/draft_profile.py --write re-measures the rest of a profile, never these)."""
    from mirror_core.models.profile import load_profile

    profile = load_profile(init)
    for folder in (os.path.dirname(os.path.normpath(init)), init):
        record = read_json(os.path.join(folder, "feature_distill.json"))
        coverage = (record or {}).get("candidate_coverage")
        if coverage and profile and [round(h, 4) for h in kappa_hits(coverage)] == [round(h, 4) for h in profile.hit]:
            return record
    return None


def kappa_hits(candidates: dict) -> list[float]:
    """The profile's hit_by_kappa from candidate_pass's coverage: κ = 1, 2, 3 (between the measured 2 and 4), 4."""
    cov = candidates.get("after", candidates["before"])
    return [cov["top1"], cov["top2"], (cov["top2"] + cov["top4"]) / 2, cov["top4"]]


def _coverage(seqs, vmap) -> float:
    """The share of the answers' tokens the draft vocabulary holds."""
    toks = [t for _, a in seqs for t in a]
    return round(sum(1 for t in toks if int(vmap.to_draft[t]) < vmap.size) / len(toks), 4)


def _answer_rows(teacher: dict, seqs) -> torch.Tensor:
    """The teacher's feature rows at the positions predicting an answer token, in the order of its answer rows."""
    return torch.cat([torch.arange(f + len(p) - 1, f + len(p) - 1 + len(a)) for f, (p, a) in zip(teacher["fstart"], seqs)])


def _exit_head_task(cfg: FeatureDistillConfig, teacher: dict, seqs, readout, ids, soft, g) -> ExitHeadTask:
    """The exit head at ℓ_e over the draft vocabulary, on the answer rows (a random 2 % held out)."""
    hidden = teacher["feat"][_answer_rows(teacher, seqs)]
    n = len(hidden)
    perm = torch.randperm(n, generator=g)
    return ExitHeadTask(cfg.feature_layer, hidden, teacher["top_ids"], perm[n // 50:], perm[: n // 50], readout, ids,
                        soft, cfg.exit_epochs, cfg.exit_lr)


def candidate_pass(cfg: FeatureDistillConfig, model, task: ExitHeadTask, head, train_set, held_set, to_draft, other,
                   g) -> tuple[tuple, dict]:
    """Candidates where they matter: the exit head again, from where it is, weighted to the draft's mistakes with
    the draft's own token excluded (M_t never sends it); its held-out hit coverage before and after."""
    (seqs, teacher, soft), (held_seqs, held_teacher, held_soft) = train_set, held_set
    pred = first_predictions(model, seqs, teacher, soft, to_draft, other, cfg)
    held_pred = first_predictions(model, held_seqs, held_teacher, held_soft, to_draft, other, cfg)
    label = to_draft[teacher["top_ids"][:, 0].long()]
    held_label = to_draft[held_teacher["top_ids"][:, 0].long()]
    held_h = held_teacher["feat"][_answer_rows(held_teacher, held_seqs)]
    candidates = {"before": hit_coverage(exit_readout(head, task.readout, task.ids), held_h, held_label, held_pred)}
    if cfg.candidate_epochs > 0:
        wrong = pred != label
        exclude = torch.where(wrong, pred, torch.full_like(pred, other))
        weight = 1.0 + (cfg.wrong_weight - 1.0) * wrong.float()
        head, _ = train_exit_head(dataclasses.replace(task, epochs=cfg.candidate_epochs, init=head, exclude=exclude,
                                                      row_weight=weight), g)
        candidates["after"] = hit_coverage(exit_readout(head, task.readout, task.ids), held_h, held_label, held_pred)
    print(f"exit head where the draft is wrong (held-out): {candidates}", flush=True)
    return head, candidates


def _save_feature_draft(cfg: FeatureDistillConfig, model, vmap, target, head, candidates: dict, profile: dict,
                        n_held: int) -> None:
    """out/feature_draft/: the draft, its vocabulary map, its acceptance profile (draft_profile.json: evaluate's
    figures at every γ the latency model tries) and the exit head at its feature layer."""
    from mirror_core.models.profile import save_profile

    folder = os.path.join(cfg.out, "feature_draft")
    shutil.rmtree(folder, ignore_errors=True)
    model.save(folder)
    vmap.save(folder)
    save_profile(folder, profile["accept"], kappa_hits(candidates),
                 f"held-out answers to {n_held} new-topic prompts, teacher-forced: greedy decoding's rollouts replayed "
                 "(τ by γ; agreement by depth given the earlier depths agreed, own predicted features; the exit's top-κ "
                 "at each rollout's correction or bonus slot); hit_by_kappa: exit top-κ where the draft's first token "
                 "was wrong", profile["tau_by_gamma"], profile["hit_by_gamma"])
    save_exit_head(folder, cfg.feature_layer, target, head, vmap.target_ids)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m training.draft.feature_distill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, f in FeatureDistillConfig.__dataclass_fields__.items():
        flag = "--" + name.replace("_", "-")
        if f.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    return distill(FeatureDistillConfig(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
