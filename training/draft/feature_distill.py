"""Distil the feature-reading draft (models/feature_draft.py) and its pair's exit head from the target's answers.

    python -m training.draft.chat_data --more --out WORK/answers                     # training answers
    python -m training.draft.chat_data --held-out --more --limit 96 --out WORK/heldout  # new-topic answers
    python -m training.draft.feature_distill --answers WORK/answers --heldout WORK/heldout --work WORK \\
        --out assets/smollm2_pair --minutes 60

Stages, each in its own module (the teacher pass is cached in WORK):
1. teacher.py: the hidden state after layer ℓ_e at every position of every prompt + answer (the draft's input
   features) and the target's top-k next-token logits at answer positions, copied from the records where chat_data
   recorded them while generating, computed by the target for the rest (in `--dtype`: auto takes bfloat16 only
   where precision.py measures it faster, as for the training's autocast); `--train-tokens N` trains on a
   seeded random subset of about N answer tokens (the data-volume probe).
2. the draft vocabulary (answers.draft_vocabulary over these answers) and the exit head at ℓ_e (exit_heads.py).
3. feature_loop.py: the draft, trained with EAGLE-3's training-time test on its own predicted features;
   `--rollout-weight λ` weighs the KL and CE of the rows greedy decoding evaluates 1 + λ (replay.rollout_weights).
   continued.py: `--init FOLDER` continues a saved feature draft instead (its weights, its vocabulary, its exit head
   as the start of stage 2's): more data for a draft that has already seen the first, without paying for its first
   passes again; with a larger `--num-layers` it grows the draft first (the new layers start as identities).
4. replay.py, held out (new topics, never in training prompts): teacher-forced top-1 agreement per depth; τ replayed
   from the rollouts greedy speculative decoding drafts on those answers, logged along the way at γ = depths and,
   with Mirror-SD's hit rate at each slot, at γ 1..8 into the draft's profile for the latency model; the
   vocabulary's coverage, and a token-only draft (`--compare`) on the same answers.
5. this module: the exit head's second pass where the draft is wrong (candidate_pass), the saved draft and the run's
   record (feature_distill.json), and the command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import time

import torch

from mirror_core.latency import GAMMAS
from mirror_core.models.vocab import VocabMap
from training.draft import feature_loop
from training.draft.answers import AnswerSet, coverage, data_subset, draft_vocabulary, load_sequences, read_json
from training.draft.continued import ContinuedDraft, continued_draft, kappa_hits, starting_draft
from training.draft.exit_heads import (
    ExitHeadTask,
    exit_readout,
    hit_coverage,
    load_target,
    save_exit_head,
    train_exit_head,
)
from training.draft.feature_config import FeatureDistillConfig
from training.draft.replay import evaluate, first_predictions
from training.draft.runs import prepare_run, run_record, write_record
from training.draft.teacher import teacher_pass, teacher_path
from training.precision import resolve


def distill(cfg: FeatureDistillConfig) -> dict:
    """Teacher passes, vocabulary, exit head, draft, candidates where they matter, saved draft (this module's
    docstring's stages)."""
    target_dir, g = prepare_run(cfg.threads, cfg.work, cfg.seed, cfg.target)
    cfg = dataclasses.replace(cfg, dtype=resolve(cfg.dtype))  # measured at the run's threads; the record names it
    start = continued_draft(cfg, target_dir) if cfg.init else None
    folders = cfg.answers.split(",")
    pool = [s for folder in folders for s in load_sequences(folder)]
    keep = data_subset(pool, cfg.train_tokens, g)
    timings, t = {}, time.time()
    teachers = _teacher_passes(cfg, folders, keep, [pool[i] for i in keep], target_dir)
    timings["teacher_pass_s"] = round(time.time() - t, 1)
    target, readout, always = load_target(target_dir)
    vmap = start.vmap if start else VocabMap.from_ids(draft_vocabulary(teachers[0][0], cfg.draft_vocab, always),
                                                       int(target.config.vocab_size))
    train_set, held_set = (AnswerSet.of(seqs, teacher, vmap) for seqs, teacher in teachers)
    vocab_coverage = _vocab_coverage(train_set, held_set, vmap)
    t = time.time()
    task = _exit_head_task(cfg, train_set, readout, vmap.target_ids, g)
    head, exit_cov = train_exit_head(dataclasses.replace(task, init=start.head) if start else task, g)
    timings["exit_head_s"] = round(time.time() - t, 1)
    model = starting_draft(cfg, start, target, vmap.target_ids, head)
    t = time.time()
    log = feature_loop.train(cfg, model, train_set, lambda: evaluate(model, held_set, cfg), g)
    timings["draft_s"] = round(time.time() - t, 1)
    compare = token_draft_agreement(cfg.compare, held_set.seqs) if cfg.compare else None
    t = time.time()
    head, candidates = candidate_pass(cfg, model, task, head, train_set, held_set, g)
    timings["candidate_head_s"] = round(time.time() - t, 1)
    profile = evaluate(model, held_set, dataclasses.replace(cfg, depths=max(GAMMAS)),  # at every γ that is tried
                       exit_readout(head, task.readout, task.ids))
    _save_feature_draft(cfg, model, vmap, target, head, candidates, profile, len(held_set.seqs))
    return write_record(os.path.join(cfg.out, "feature_distill.json"), {
        **run_record(cfg), **_data_record(train_set, held_set, len(pool), teachers[0][1], folders, start),
        "draft_vocab_size": vmap.size, "vocab_coverage": vocab_coverage, "exit_coverage": exit_cov,
        "candidate_coverage": candidates, "draft_log": log, "profile": profile,
        "token_draft_heldout_agreement": compare, "timings": timings,
        "draft_params": sum(p.numel() for p in model.parameters())})


def _teacher_passes(cfg: FeatureDistillConfig, folders: list[str], keep: list[int], seqs,
                    target_dir: str) -> list[tuple[list, dict]]:
    """(sequences, teacher figures) of the training answers (records `keep` of `folders`) and of the held-out ones."""
    layer, k = cfg.feature_layer, cfg.topk
    held_seqs = load_sequences(cfg.heldout)
    teacher = teacher_pass(folders, keep, seqs, target_dir, layer, k,
                           teacher_path(cfg.work, "teacher_f", seqs, layer, k, target_dir, cfg.dtype), cfg.dtype)
    held = teacher_pass([cfg.heldout], list(range(len(held_seqs))), held_seqs, target_dir, layer, k,
                        teacher_path(cfg.work, "teacher_f_heldout", held_seqs, layer, k, target_dir, cfg.dtype),
                        cfg.dtype)
    return [(seqs, teacher), (held_seqs, held)]


def _vocab_coverage(train_set: AnswerSet, held_set: AnswerSet, vmap: VocabMap) -> dict:
    cov = {"train": round(coverage(train_set.seqs, vmap), 4), "heldout": round(coverage(held_set.seqs, vmap), 4)}
    print(f"draft vocabulary: {vmap.size} tokens cover {cov['train']} of training answer tokens, "
          f"{cov['heldout']} of held-out ones", flush=True)
    return cov


def _data_record(train_set: AnswerSet, held_set: AnswerSet, pool: int, teacher: dict, folders: list[str],
                 start: ContinuedDraft | None) -> dict:
    """The run record's data: what was trained on and held out, where it came from, and the run continued."""
    return {"sequences": len(train_set.seqs), "answer_tokens": sum(len(a) for _, a in train_set.seqs),
            "pool_sequences": pool, "teacher_recorded": teacher["recorded"],
            "sources": {f: _generated(f) for f in folders},
            "continued_from": start.record if start else None, "heldout_sequences": len(held_set.seqs),
            "heldout_answer_tokens": sum(len(a) for _, a in held_set.seqs)}


def _generated(folder: str) -> dict | None:
    """A folder's totals from chat_data's generation.json (None for answers made otherwise)."""
    g = read_json(os.path.join(folder, "generation.json"))
    return {k: g.get(k) for k in ("records", "answer_tokens", "seconds", "threads")} if g else None


def _answer_rows(answers: AnswerSet) -> torch.Tensor:
    """The teacher's feature rows at the positions predicting an answer token, in the order of its answer rows."""
    return torch.cat([torch.arange(f + len(p) - 1, f + len(p) - 1 + len(a))
                      for f, (p, a) in zip(answers.teacher["fstart"], answers.seqs)])


def _exit_head_task(cfg: FeatureDistillConfig, answers: AnswerSet, readout, ids: torch.Tensor,
                    g: torch.Generator) -> ExitHeadTask:
    """The exit head at ℓ_e over the draft vocabulary, on the answer rows (a random 2 % held out)."""
    hidden = answers.teacher["feat"][_answer_rows(answers)]
    n = len(hidden)
    perm = torch.randperm(n, generator=g)
    return ExitHeadTask(cfg.feature_layer, hidden, answers.teacher["top_ids"], perm[n // 50:], perm[: n // 50],
                        readout, ids, answers.soft, cfg.exit_epochs, cfg.exit_lr)


def candidate_pass(cfg: FeatureDistillConfig, model, task: ExitHeadTask, head, train_set: AnswerSet,
                   held_set: AnswerSet, g: torch.Generator) -> tuple[tuple, dict]:
    """Candidates where they matter: the exit head again, from where it is, weighted to the draft's mistakes with
    the draft's own token excluded (M_t never sends it); its held-out hit coverage before and after."""
    pred, held_pred = first_predictions(model, train_set, cfg), first_predictions(model, held_set, cfg)
    label = train_set.to_draft[train_set.teacher["top_ids"][:, 0].long()]
    held_label = held_set.to_draft[held_set.teacher["top_ids"][:, 0].long()]
    held_h = held_set.teacher["feat"][_answer_rows(held_set)]
    candidates = {"before": hit_coverage(exit_readout(head, task.readout, task.ids), held_h, held_label, held_pred)}
    if cfg.candidate_epochs > 0:
        wrong = pred != label
        exclude = torch.where(wrong, pred, torch.full_like(pred, train_set.other))
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
