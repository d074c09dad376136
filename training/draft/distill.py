"""Distil a draft and train an early-exit head for a pretrained target (the SmolLM2 pair in assets/smollm2_pair).

    python -m training.draft.chat_data --new-tokens 160 --out WORK/answers     # the target's chat answers
    python -m training.draft.distill --answers WORK/answers --work WORK --out assets/smollm2_pair

Stages (each cached in WORK, so a run can be resumed or re-run with other draft settings):
1. teacher pass: the target (in `--dtype`: auto takes bfloat16 only where precision.py measures it faster, as it
   does for the training's autocast) reads every prompt + answer once; for each answer position it keeps the
   next-token top-k logits and the hidden state after each candidate exit layer.
2. draft vocabulary: the V_d most frequent tokens of the answers and prompts (FR-Spec: a small draft's cost is
   mostly its head), mapped to target ids (models/vocab.py).
3. exit heads, one per candidate layer (exit_head.py), trained to put the target's next token in their top-κ;
   the one kept is `--exit-layer` (its top-k coverage for every candidate is in the card).
4. the draft: a Llama of the target's width whose layers start as copies of chosen target layers (`--init-layers`),
   embedding and head the target's rows of the subset, trained with forward KL to the target's top-k plus CE on
   the target's greedy token, at answer positions only (the draft's job is to predict the target's answers).

Every stage prints its wall time; the summary (model_card.json) records them with the machine's CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from mirror_core.models.ops import rms_norm
from training.draft.chat_sources import TOPK
from training.precision import autocast, resolve, torch_dtype


@dataclass(frozen=True)
class DistillConfig:
    answers: str                                  # chat_data shards
    work: str                                     # cache of the teacher pass
    out: str                                      # the pair folder: draft/ (with its exit head) and the card
    target: str = "smollm2-135m-instruct"
    draft_vocab: int = 8192                       # V_d
    init_layers: tuple[int, ...] = (0, 1, 29)     # target layers the draft's layers start from (its depth)
    exit_layers: tuple[int, ...] = (15, 20)       # candidate ℓ_e, one head each
    exit_layer: int = 20                          # the head shipped
    topk: int = TOPK                              # teacher logits kept per position
    draft_minutes: float = 60.0
    exit_epochs: float = 2.0
    batch_sequences: int = 16
    lr: float = 3e-4
    exit_lr: float = 1e-3
    val_share: float = 0.05
    hard_weight: float = 0.5                      # CE on the target's greedy token, beside the KL
    seed: int = 0
    threads: int = 0
    init_draft: str = ""                          # continue training this saved draft folder (its vocabulary kept)
    dtype: str = "auto"                           # the teacher pass and the training's autocast: precision.PRECISIONS

    def __post_init__(self):
        if self.exit_layer not in self.exit_layers:
            raise ValueError(f"exit_layer {self.exit_layer} must be one of exit_layers {self.exit_layers}")


# -- 1. teacher pass ------------------------------------------------------------------------------
def shard_paths(folder: str) -> list[str]:
    """chat_data's shards in a folder, in the one order every reader uses."""
    paths = sorted(glob.glob(os.path.join(folder, "answers_*.pt")))
    if not paths:
        raise SystemExit(f"no answers_*.pt in {folder}: run python -m training.draft.chat_data first")
    return paths


def load_sequences(folder: str) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) of every record, in shard_paths' order (memory-mapped: recorded features are not read)."""
    return [(r["prompt"], r["answer"]) for path in shard_paths(folder) for r in torch.load(path, mmap=True)]


@torch.inference_mode()
def teacher_pass(cfg: DistillConfig, seqs: list[tuple[list[int], list[int]]], target_dir: str) -> dict:
    """Per answer position (the position before each answer token): top-k ids/logits of the target's next token,
    and its hidden state after each exit layer. Flat over all sequences; `start[s]` indexes sequence s's rows."""
    path = os.path.join(cfg.work, "teacher.pt")
    if os.path.exists(path):
        return torch.load(path)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype(cfg.dtype)).eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    n_rows = sum(len(a) for _, a in seqs)
    top_ids = torch.empty(n_rows, cfg.topk, dtype=torch.int32)
    top_logits = torch.empty(n_rows, cfg.topk, dtype=torch.float16)
    hidden = {layer: torch.empty(n_rows, model.config.hidden_size, dtype=torch.bfloat16) for layer in cfg.exit_layers}
    start = [0] * len(seqs)
    at = 0
    for i in range(len(seqs)):
        start[i] = at
        at += len(seqs[i][1])
    t0 = time.time()
    for b in range(0, len(order), cfg.batch_sequences):
        batch = order[b: b + cfg.batch_sequences]
        width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, i in enumerate(batch):
            p, a = seqs[i]
            ids[r, : len(p) + len(a)] = torch.tensor(p + a)
            mask[r, : len(p) + len(a)] = 1
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        for r, i in enumerate(batch):
            p, a = seqs[i]
            rows = slice(len(p) - 1, len(p) + len(a) - 1)  # positions predicting the answer's tokens
            top = out.logits[r, rows].float().topk(cfg.topk, dim=-1)                      # [A, k]
            dst = slice(start[i], start[i] + len(a))
            top_ids[dst], top_logits[dst] = top.indices.int(), top.values.half()
            for layer in cfg.exit_layers:
                hidden[layer][dst] = out.hidden_states[layer][r, rows]
        if b // cfg.batch_sequences % 20 == 0:
            print(f"teacher pass: {b + len(batch)}/{len(seqs)} sequences, {time.time() - t0:.0f} s", flush=True)
    result = {"top_ids": top_ids, "top_logits": top_logits, "hidden": hidden, "start": start,
              "seconds": time.time() - t0}
    torch.save(result, path)
    return result


# -- 2. draft vocabulary --------------------------------------------------------------------------
def draft_vocabulary(seqs, size: int, always: list[int]) -> list[int]:
    """The `size` most frequent target ids in prompts and answers (ties by id), `always` included."""
    counts = Counter(t for p, a in seqs for t in p + a)
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    keep = list(dict.fromkeys(always + ranked))[:size]
    return keep


def soft_targets(top_ids: torch.Tensor, top_logits: torch.Tensor, to_draft: torch.Tensor, other: int):
    """The teacher's top-k distribution in draft ids: (ids [N, k], probs [N, k]); ids outside the subset get
    probability 0 (the rest renormalised), their id set to `other` (masked out of the draft's softmax anyway)."""
    ids = to_draft[top_ids.long()]                                                          # [N, k]
    probs = torch.softmax(top_logits.float(), -1) * (ids != other)                          # [N, k]
    return ids, probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)


# -- 3. exit heads --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Readout:
    """The frozen target's final norm and LM head: what an exit head's readout reuses and the logit lens is."""

    lm_head: torch.Tensor                         # [V, H]
    norm: torch.Tensor                            # [H] the final norm's gain
    eps: float


@dataclass(frozen=True, eq=False)
class ExitHeadTask:
    """One exit head to train (train_exit_head): what it reads, the rows it learns from and holds out, its targets.

    Candidates where they matter (feature_distill.py): `exclude` [n_rows] gives per row a draft-vocabulary id that
    the readout never proposes there (the draft's own token d_j: M_t excludes it), and `row_weight` [n_rows] weighs
    the rows (more where the draft was wrong, the only slots whose candidates can hit); `init` continues a head."""

    layer: int                                    # ℓ_e
    hidden: torch.Tensor                          # [n_rows, H] h^(ℓ_e) of every teacher row
    top_ids: torch.Tensor                         # [n_rows, k] the teacher's top-k next-token ids per row
    train_rows: torch.Tensor
    val_rows: torch.Tensor
    readout: Readout
    ids: torch.Tensor                             # [V_e] the target ids the head ranks (the draft vocabulary)
    soft: tuple[torch.Tensor, torch.Tensor]       # soft_targets: the teacher's top-k in draft ids, and its probabilities
    epochs: float
    lr: float
    init: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    exclude: torch.Tensor | None = None
    row_weight: torch.Tensor | None = None


def train_exit_head(task: ExitHeadTask, g: torch.Generator):
    """A, b, g for one exit layer (exit_head.py), and its top-1/2/4/8 coverage of the target's next token on the
    held-out rows (raw: the logit lens over the whole vocabulary, for comparison)."""
    layer, ids, train_rows, val_rows, exclude, row_weight = (task.layer, task.ids, task.train_rows, task.val_rows,
                                                            task.exclude, task.row_weight)
    lm_head, norm, eps = task.readout.lm_head, task.readout.norm, task.readout.eps
    h_all = task.hidden
    hsz = h_all.shape[1]
    if task.init is None:
        adapter, bias, gain = torch.eye(hsz), torch.zeros(hsz), norm.clone().float()
    else:
        adapter, bias, gain = (t.clone().float() for t in task.init)
    adapter, bias, gain = adapter.requires_grad_(), bias.requires_grad_(), gain.requires_grad_()
    w = lm_head[ids].t().float()                                                            # [H, V_e]
    opt = torch.optim.Adam([adapter, bias, gain], lr=task.lr)
    sid, sprob = task.soft
    batch = 2048
    steps = int(task.epochs * len(train_rows) / batch)
    t0 = time.time()

    def readout(h):  # exit_head.ExitHead.readout's maths, trainable
        return rms_norm(h.float() @ adapter + bias, gain, eps) @ w                          # [n, V_e]

    for step in range(steps):
        lr = task.lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = train_rows[torch.randint(len(train_rows), (batch,), generator=g)]
        z = readout(h_all[rows])
        z = torch.cat([z, z.new_full((batch, 1), -1e4)], 1)  # an "other" column for soft_targets' padding
        if exclude is not None:
            z = z.scatter(1, exclude[rows].unsqueeze(1), -1e4)
        logp = F.log_softmax(z, -1)
        p_soft = sprob[rows]
        if exclude is not None:  # the excluded id carries no target mass: renormalise the rest
            p_soft = p_soft * (sid[rows] != exclude[rows].unsqueeze(1))
            p_soft = p_soft / p_soft.sum(-1, keepdim=True).clamp(min=1e-9)
        per_row = -(p_soft * logp.gather(1, sid[rows])).sum(-1)
        loss = per_row.mean() if row_weight is None else (per_row * row_weight[rows]).sum() / row_weight[rows].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        label = task.top_ids[val_rows, 0].long()
        trained = ids[readout(h_all[val_rows]).topk(8, -1).indices]                         # [n, 8] target ids
        raw_logits = rms_norm(h_all[val_rows].float(), norm.float(), eps) @ lm_head.t().float()  # the logit lens
        raw = raw_logits.topk(8, -1).indices
    cov = {k: {"trained": float((trained[:, :k] == label[:, None]).any(1).float().mean()),
               "logit_lens": float((raw[:, :k] == label[:, None]).any(1).float().mean())} for k in (1, 2, 4, 8)}
    print(f"exit head at layer {layer}: {steps} steps, {time.time() - t0:.0f} s, coverage {cov}", flush=True)
    return (adapter.detach(), bias.detach(), gain.detach()), cov


# -- 4. the draft ---------------------------------------------------------------------------------
def build_draft(target, ids: torch.Tensor, init_layers: tuple[int, ...]):
    """A Llama of the target's width: the target's layers `init_layers`, final norm, and its embedding rows of
    `ids` plus one "other" row (their mean), tied as the head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = target.config.to_dict()
    c.update(vocab_size=ids.numel() + 1, num_hidden_layers=len(init_layers), tie_word_embeddings=True,
             bos_token_id=None, pad_token_id=None)
    c.pop("quantization_config", None)
    draft = LlamaForCausalLM(LlamaConfig(**c))
    with torch.no_grad():
        emb = target.model.embed_tokens.weight.float()
        draft.model.embed_tokens.weight.copy_(torch.cat([emb[ids], emb.mean(0, keepdim=True)]))
        draft.model.norm.weight.copy_(target.model.norm.weight)
        for mine, theirs in zip(draft.model.layers, init_layers):
            mine.load_state_dict(target.model.layers[theirs].state_dict())
    draft.tie_weights()
    return draft.float()


def draft_batches(seqs, order: list[int], teacher: dict, soft: tuple[torch.Tensor, torch.Tensor],
                  to_draft: torch.Tensor, other: int, batch: int):
    """Padded batches of whole sequences (draft ids) with the teacher's targets (soft_targets) at answer positions."""
    sid, sprob = soft
    for b in range(0, len(order), batch):
        chunk = order[b: b + batch]
        width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in chunk)
        x = torch.full((len(chunk), width), other, dtype=torch.long)
        pos, rows = [], []
        for r, i in enumerate(chunk):
            p, a = seqs[i]
            x[r, : len(p) + len(a)] = to_draft[torch.tensor(p + a)]
            for j in range(len(a)):
                pos.append((r, len(p) - 1 + j))
            rows.append(torch.arange(teacher["start"][i], teacher["start"][i] + len(a)))
        rows = torch.cat(rows)
        yield x, torch.tensor(pos), sid[rows], sprob[rows], teacher["top_ids"][rows, 0].long()


def draft_loss(draft, x, pos, sid, sprob, label_draft, other: int, hard_weight: float):
    logits = draft(input_ids=x).logits                                                      # [B, T, V_d+1]
    z = logits[pos[:, 0], pos[:, 1]].float()                                                # [N, V_d+1]
    z[:, other] = -1e4                                                                      # never proposed
    logp = F.log_softmax(z, -1)
    kl = -(sprob * logp.gather(1, sid)).sum(-1).mean()
    inside = label_draft != other
    hard = F.nll_loss(logp[inside], label_draft[inside]) if inside.any() else logp.new_zeros(())
    agree = (z.argmax(-1) == label_draft).float().mean()
    return kl + hard_weight * hard, float(agree)


def length_chunks(seqs, idx: list[int], batch: int, g: torch.Generator) -> list[list[int]]:
    """One epoch's batches of sequence indices: similar lengths together (less padding), batches in random order."""
    perm = torch.randperm(len(idx), generator=g).tolist()
    order = sorted([idx[i] for i in perm], key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    chunks = [order[b: b + batch] for b in range(0, len(order), batch)]
    return [chunks[i] for i in torch.randperm(len(chunks), generator=g).tolist()]


def scheduled_lr(lr: float, step: int, elapsed: float, budget: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine over the time budget down to 10 % of lr."""
    return lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * elapsed / budget)))


def train_draft(cfg: DistillConfig, draft, seqs, train_idx, val_idx, teacher, to_draft, soft, g):
    other = draft.config.vocab_size - 1
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget = cfg.draft_minutes * 60
    t0, step, log = time.time(), 0, []

    def evaluate() -> float:
        draft.eval()
        agree, n = 0.0, 0
        with torch.no_grad(), autocast(cfg.dtype):
            for x, pos, sid, sprob, label in draft_batches(seqs, val_idx, teacher, soft, to_draft, other,
                                                                      cfg.batch_sequences):
                _, a = draft_loss(draft, x, pos, sid, sprob, to_draft[label], other, cfg.hard_weight)
                agree, n = agree + a * len(pos), n + len(pos)
        draft.train()
        return agree / max(n, 1)

    log.append({"step": 0, "minutes": 0.0, "val_agreement": evaluate()})
    print(f"draft: before training, held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)
    draft.train()
    warmup = 50
    while time.time() - t0 < budget:
        for chunk in length_chunks(seqs, train_idx, cfg.batch_sequences, g):
            elapsed = time.time() - t0
            if elapsed >= budget:
                break
            for group in opt.param_groups:
                group["lr"] = scheduled_lr(cfg.lr, step, elapsed, budget, warmup)
            x, pos, sid, sprob, label = next(draft_batches(seqs, chunk, teacher, soft, to_draft, other, len(chunk)))
            with autocast(cfg.dtype):
                loss, agree = draft_loss(draft, x, pos, sid, sprob, to_draft[label], other, cfg.hard_weight)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 50 == 0:
                print(f"draft step {step}: loss {float(loss.detach()):.3f}, batch agreement {agree:.3f}, "
                      f"{elapsed / 60:.1f} min", flush=True)
            if step % 400 == 0:
                log.append({"step": step, "minutes": round(elapsed / 60, 2), "val_agreement": evaluate()})
                print(f"draft: held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)
    log.append({"step": step, "minutes": round((time.time() - t0) / 60, 2), "val_agreement": evaluate()})
    print(f"draft: {step} steps, held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)
    return log


def read_json(path: str) -> dict | None:
    """A small JSON record (chat_data's generation.json), or None when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# -- the run's preparation and record, shared with feature_distill.py -----------------------------------
def prepare_run(threads: int, work: str, seed: int, target: str) -> tuple[str, torch.Generator]:
    """The opening of a distillation: its threads, its work folder, the target's folder and the run's generator."""
    from mirror_core.models.prepared import resolve_source

    if threads:
        torch.set_num_threads(threads)
    os.makedirs(work, exist_ok=True)
    return resolve_source(target), torch.Generator().manual_seed(seed)


def load_target(target_dir: str):
    """The target in float32, frozen, for the readout and the draft's initialisation: (model, its Readout, the ids a
    draft vocabulary always keeps: the end of an answer is always proposable)."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    eos = target.config.eos_token_id
    readout = Readout(target.lm_head.weight.detach(), target.model.norm.weight.detach(),
                      float(target.config.rms_norm_eps))
    return target, readout, [eos] if isinstance(eos, int) else list(eos or [])


def save_exit_head(folder: str, layer: int, target, head, ids: torch.Tensor) -> None:
    """A trained head (adapter, bias, gain) beside a draft, where the engine's "auto" finds it (exit_head.py)."""
    from mirror_core.models.exit_head import ExitHeadWeights

    a, b, gain = head
    c = target.config
    ExitHeadWeights(layer, int(c.hidden_size), int(c.num_hidden_layers), int(c.vocab_size), a, b, gain, ids).save(folder)


def run_record(cfg) -> dict:
    """The opening of a run's summary: its configuration and the machine it ran on."""
    from mirror_core.machine import cpu_flags, cpu_model

    return {"config": asdict(cfg), "cpu": cpu_model(), "cpu_flags": " ".join(sorted(cpu_flags())),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


# -- the whole run --------------------------------------------------------------------------------
def distill(cfg: DistillConfig) -> dict:
    """Teacher pass, draft vocabulary, exit heads, draft, saved pair (the stages of this module's docstring)."""
    target_dir, g = prepare_run(cfg.threads, cfg.work, cfg.seed, cfg.target)
    cfg = dataclasses.replace(cfg, dtype=resolve(cfg.dtype))  # measured at the run's threads; the record names it
    seqs = load_sequences(cfg.answers)
    timings = {}
    t = time.time()
    teacher = teacher_pass(cfg, seqs, target_dir)
    timings["teacher_pass_s"] = round(teacher.get("seconds", time.time() - t), 1)
    n_val = max(1, int(len(seqs) * cfg.val_share))
    perm = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    val_idx, train_idx = sorted(perm[:n_val]), sorted(perm[n_val:])
    target, readout, always = load_target(target_dir)
    vmap, covered = _draft_vocab_map(cfg, seqs, train_idx, always, int(target.config.vocab_size))
    soft = soft_targets(teacher["top_ids"], teacher["top_logits"], vmap.to_draft, vmap.size)  # "other" = id V_d
    heads, coverage = {}, {}
    t = time.time()
    train_rows, val_rows = (torch.cat([torch.arange(teacher["start"][i], teacher["start"][i] + len(seqs[i][1]))
                                       for i in idx]) for idx in (train_idx, val_idx))
    for layer in cfg.exit_layers:
        heads[layer], coverage[layer] = train_exit_head(ExitHeadTask(
            layer, teacher["hidden"][layer], teacher["top_ids"], train_rows, val_rows, readout, vmap.target_ids, soft,
            cfg.exit_epochs, cfg.exit_lr), g)
    timings["exit_heads_s"] = round(time.time() - t, 1)
    if cfg.init_draft:  # resume: the saved weights, in float32 for training
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(cfg.init_draft, dtype=torch.float32)
    else:
        draft = build_draft(target, vmap.target_ids, cfg.init_layers)
    t = time.time()
    log = train_draft(cfg, draft, seqs, train_idx, val_idx, teacher, vmap.to_draft, soft, g)
    timings["draft_s"] = round(time.time() - t, 1)
    _save_draft(cfg, draft, vmap, target, target_dir, heads[cfg.exit_layer])
    summary = {**run_record(cfg), "sequences": len(seqs), "answer_tokens": sum(len(a) for _, a in seqs),
               "held_out_sequences": n_val, "draft_vocab_coverage": round(covered, 4), "exit_coverage": coverage,
               "draft_log": log, "timings": timings, "draft_params": sum(p.numel() for p in draft.parameters()),
               "generation": read_json(os.path.join(cfg.answers, "generation.json"))}
    with open(os.path.join(cfg.out, "distill.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary


def _draft_vocab_map(cfg: DistillConfig, seqs, train_idx: list[int], always: list[int], target_vocab: int):
    """The draft's vocabulary (the saved draft's when continuing one) and the share of answer tokens it covers."""
    from mirror_core.models.vocab import VocabMap, load_vocab_map

    if cfg.init_draft:
        vmap = load_vocab_map(cfg.init_draft)
    else:
        vmap = VocabMap.from_ids(draft_vocabulary([seqs[i] for i in train_idx], cfg.draft_vocab, always), target_vocab)
    answer_tokens = [t for _, a in seqs for t in a]
    covered = sum(1 for t in answer_tokens if int(vmap.to_draft[t]) < vmap.size) / len(answer_tokens)
    print(f"draft vocabulary: {vmap.size} tokens cover {covered:.4f} of answer tokens", flush=True)
    return vmap, covered


def _save_draft(cfg: DistillConfig, draft, vmap, target, target_dir: str, head) -> None:
    """out/draft/: the draft (bfloat16 safetensors, loaded as float32 on a CPU), its vocabulary map, the target's
    tokenizer and the exit head shipped (`--exit-layer`)."""
    from transformers import AutoTokenizer, GenerationConfig

    folder = os.path.join(cfg.out, "draft")
    shutil.rmtree(folder, ignore_errors=True)
    draft.generation_config = GenerationConfig(eos_token_id=target.config.eos_token_id)
    draft.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    vmap.save(folder)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(folder)
    save_exit_head(folder, cfg.exit_layer, target, head, vmap.target_ids)


def main(argv: list[str] | None = None) -> dict:
    fields = DistillConfig.__dataclass_fields__
    parser = argparse.ArgumentParser(prog="python -m training.draft.distill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, f in fields.items():
        flag = "--" + name.replace("_", "-")
        if f.default is dataclasses.MISSING:  # required
            parser.add_argument(flag, required=True)
        elif isinstance(f.default, tuple):
            parser.add_argument(flag, type=lambda s: tuple(int(v) for v in s.split(",")), default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    return distill(DistillConfig(**vars(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
