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
import itertools
import os
import shutil
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training import loop
from training.draft.answers import (
    AnswerSet,
    coverage,
    draft_vocabulary,
    epochs,
    load_sequences,
    read_json,
)
from training.draft.chat_sources import TOPK
from training.draft.exit_heads import ExitHeadTask, load_target, save_exit_head, train_exit_head
from training.draft.runs import prepare_run, run_record, write_record
from training.precision import autocast, resolve, torch_dtype

WARMUP_STEPS = 50
LOG_EVERY, EVAL_EVERY = 50, 400  # steps between a printed loss and a held-out agreement


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
@torch.inference_mode()
def teacher_pass(cfg: DistillConfig, seqs, target_dir: str) -> dict:
    """Per answer position (the position before each answer token): top-k ids/logits of the target's next token,
    and its hidden state after each exit layer. Flat over all sequences; `start[s]` indexes sequence s's rows."""
    path = os.path.join(cfg.work, "teacher.pt")
    if os.path.exists(path):
        return torch.load(path)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype(cfg.dtype)).eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    n_rows = sum(len(a) for _, a in seqs)
    result = {"top_ids": torch.empty(n_rows, cfg.topk, dtype=torch.int32),
              "top_logits": torch.empty(n_rows, cfg.topk, dtype=torch.float16),
              "hidden": {layer: torch.empty(n_rows, model.config.hidden_size, dtype=torch.bfloat16)
                         for layer in cfg.exit_layers},
              "start": [0, *itertools.accumulate(len(a) for _, a in seqs)][:-1]}
    t0 = time.time()
    for b in range(0, len(order), cfg.batch_sequences):
        batch = order[b: b + cfg.batch_sequences]
        _teacher_batch(model, seqs, batch, cfg, result)
        if b // cfg.batch_sequences % 20 == 0:
            print(f"teacher pass: {b + len(batch)}/{len(seqs)} sequences, {time.time() - t0:.0f} s", flush=True)
    result["seconds"] = time.time() - t0
    torch.save(result, path)
    return result


def _teacher_batch(model, seqs, batch: list[int], cfg: DistillConfig, result: dict) -> None:
    """One padded forward over sequences `batch`, its figures written into place in `result`."""
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
        top = out.logits[r, rows].float().topk(cfg.topk, dim=-1)                          # [A, k]
        dst = slice(result["start"][i], result["start"][i] + len(a))
        result["top_ids"][dst], result["top_logits"][dst] = top.indices.int(), top.values.half()
        for layer in cfg.exit_layers:
            result["hidden"][layer][dst] = out.hidden_states[layer][r, rows]


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


def draft_batches(answers: AnswerSet, order: list[int], batch: int):
    """Padded batches of whole sequences (draft ids) with the teacher's targets (soft_targets) at answer positions:
    (x [B, T], positions [N, 2], soft ids [N, k], soft probabilities [N, k], the target's greedy token [N])."""
    seqs, start = answers.seqs, answers.teacher["start"]
    for b in range(0, len(order), batch):
        chunk = order[b: b + batch]
        width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in chunk)
        x = torch.full((len(chunk), width), answers.other, dtype=torch.long)
        pos, rows = [], []
        for r, i in enumerate(chunk):
            p, a = seqs[i]
            x[r, : len(p) + len(a)] = answers.to_draft[torch.tensor(p + a)]
            pos += [(r, len(p) - 1 + j) for j in range(len(a))]
            rows.append(torch.arange(start[i], start[i] + len(a)))
        rows = torch.cat(rows)
        yield x, torch.tensor(pos), answers.soft[0][rows], answers.soft[1][rows], answers.teacher["top_ids"][rows, 0].long()


def draft_loss(draft, batch, answers: AnswerSet, hard_weight: float) -> tuple[torch.Tensor, float]:
    """Forward KL to the teacher's top-k plus hard_weight × CE on its greedy token, at answer positions; and the
    share of them where the draft's top-1 is that token."""
    x, pos, sid, sprob, label = batch
    label_draft, other = answers.to_draft[label], answers.other
    logits = draft(input_ids=x).logits                                                      # [B, T, V_d+1]
    z = logits[pos[:, 0], pos[:, 1]].float()                                                # [N, V_d+1]
    z[:, other] = -1e4                                                                      # never proposed
    logp = F.log_softmax(z, -1)
    kl = -(sprob * logp.gather(1, sid)).sum(-1).mean()
    inside = label_draft != other
    hard = F.nll_loss(logp[inside], label_draft[inside]) if inside.any() else logp.new_zeros(())
    agree = (z.argmax(-1) == label_draft).float().mean()
    return kl + hard_weight * hard, float(agree)


@torch.no_grad()
def held_out_agreement(cfg: DistillConfig, draft, answers: AnswerSet, val_idx: list[int]) -> float:
    """The draft's top-1 agreement with the target's greedy token over the held-out sequences' answer positions."""
    draft.eval()
    agree, n = 0.0, 0
    with autocast(cfg.dtype):
        for batch in draft_batches(answers, val_idx, cfg.batch_sequences):
            _, a = draft_loss(draft, batch, answers, cfg.hard_weight)
            agree, n = agree + a * len(batch[1]), n + len(batch[1])
    draft.train()
    return agree / max(n, 1)


def train_draft(cfg: DistillConfig, draft, answers: AnswerSet, train_idx: list[int], val_idx: list[int],
                g: torch.Generator) -> list[dict]:
    """The draft trained for cfg.draft_minutes (training/loop.py); the held-out agreement before, every EVAL_EVERY
    steps and at the end."""
    log = [{"step": 0, "minutes": 0.0, "val_agreement": held_out_agreement(cfg, draft, answers, val_idx)}]
    print(f"draft: before training, held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)

    def on_step(s: loop.Step) -> None:
        if s.number % LOG_EVERY == 0:
            print(f"draft step {s.number}: loss {float(s.loss):.3f}, batch agreement {s.aside:.3f}, "
                  f"{s.elapsed / 60:.1f} min", flush=True)
        if s.number % EVAL_EVERY == 0:
            log.append({"step": s.number, "minutes": round(s.elapsed / 60, 2),
                        "val_agreement": held_out_agreement(cfg, draft, answers, val_idx)})
            print(f"draft: held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)

    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    stats = loop.run(draft, opt, epochs(answers.seqs, train_idx, cfg.batch_sequences, g),
                     lambda chunk: draft_loss(draft, next(draft_batches(answers, chunk, len(chunk))), answers,
                                              cfg.hard_weight),
                     loop.Budget(cfg.draft_minutes * 60, cfg.lr, WARMUP_STEPS), lambda: autocast(cfg.dtype), on_step)
    log.append({"step": stats.steps, "minutes": round(stats.seconds / 60, 2),
                "val_agreement": held_out_agreement(cfg, draft, answers, val_idx)})
    print(f"draft: {stats.steps} steps, held-out top-1 agreement {log[-1]['val_agreement']:.3f}", flush=True)
    return log


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
    vmap = _draft_vocab_map(cfg, seqs, train_idx, always, int(target.config.vocab_size))
    answers = AnswerSet.of(seqs, teacher, vmap)  # "other" = id V_d
    t = time.time()
    heads, exit_coverage = _exit_heads(cfg, answers, train_idx, val_idx, readout, vmap.target_ids, g)
    timings["exit_heads_s"] = round(time.time() - t, 1)
    draft = _starting_draft(cfg, target, vmap)
    t = time.time()
    log = train_draft(cfg, draft, answers, train_idx, val_idx, g)
    timings["draft_s"] = round(time.time() - t, 1)
    _save_draft(cfg, draft, vmap, target, target_dir, heads[cfg.exit_layer])
    return write_record(os.path.join(cfg.out, "distill.json"), {
        **run_record(cfg), "sequences": len(seqs), "answer_tokens": sum(len(a) for _, a in seqs),
        "held_out_sequences": n_val, "draft_vocab_coverage": round(coverage(seqs, vmap), 4),
        "exit_coverage": exit_coverage, "draft_log": log, "timings": timings,
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "generation": read_json(os.path.join(cfg.answers, "generation.json"))})


def _exit_heads(cfg: DistillConfig, answers: AnswerSet, train_idx: list[int], val_idx: list[int], readout,
                ids: torch.Tensor, g: torch.Generator) -> tuple[dict, dict]:
    """One exit head per candidate layer, on the training sequences' answer rows (held out: the others'); the heads
    and their coverage by layer."""
    start, seqs = answers.teacher["start"], answers.seqs
    train_rows, val_rows = (torch.cat([torch.arange(start[i], start[i] + len(seqs[i][1])) for i in idx])
                            for idx in (train_idx, val_idx))
    heads, cov = {}, {}
    for layer in cfg.exit_layers:
        heads[layer], cov[layer] = train_exit_head(ExitHeadTask(
            layer, answers.teacher["hidden"][layer], answers.teacher["top_ids"], train_rows, val_rows, readout, ids,
            answers.soft, cfg.exit_epochs, cfg.exit_lr), g)
    return heads, cov


def _starting_draft(cfg: DistillConfig, target, vmap):
    """The draft to train: the saved one to continue (in float32), or a new one from the target's layers."""
    if not cfg.init_draft:
        return build_draft(target, vmap.target_ids, cfg.init_layers)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(cfg.init_draft, dtype=torch.float32)


def _draft_vocab_map(cfg: DistillConfig, seqs, train_idx: list[int], always: list[int], target_vocab: int):
    """The draft's vocabulary (the saved draft's when continuing one)."""
    from mirror_core.models.vocab import VocabMap, load_vocab_map

    if cfg.init_draft:
        vmap = load_vocab_map(cfg.init_draft)
    else:
        vmap = VocabMap.from_ids(draft_vocabulary([seqs[i] for i in train_idx], cfg.draft_vocab, always), target_vocab)
    print(f"draft vocabulary: {vmap.size} tokens cover {coverage(seqs, vmap):.4f} of answer tokens", flush=True)
    return vmap


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
    parser = argparse.ArgumentParser(prog="python -m training.draft.distill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, f in DistillConfig.__dataclass_fields__.items():
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
