"""The feature draft's training: EAGLE-3's training-time test as a loss, run by the wing's budgeted loop with a
held-out curve along the way.

The draft is unrolled to `depths` tokens on its own predicted features (feature_draft.train_step_outputs); its loss
is KL to the target's top-k + hard_weight × CE on the target's greedy token + feature_weight × smooth-L1 to the true
next feature, depth d weighted depth_decay^(d−1), at answer positions only.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from training import loop
from training.draft.answers import AnswerSet, epochs
from training.draft.feature_config import FeatureDistillConfig
from training.draft.replay import agreed, depth_logits, make_batch, rollout_weights
from training.precision import autocast

WARMUP_STEPS = 50
LOG_EVERY = 50  # steps between printed losses


def draft_loss(model, batch, cfg: FeatureDistillConfig, answers: AnswerSet, prompt_lens: list[int] | None = None):
    """The training-time test's loss over every depth, and per depth the draft's top-1 token (draft ids [N_d], in
    make_batch's row order; `agreed` compares them with the target's). With cfg.rollout_weight λ > 0 and the batch's
    prompt lengths, the KL and CE of a row that greedy decoding evaluates (rollout_weights) count 1 + λ, the rest 1."""
    to_draft, other = answers.to_draft, answers.other
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


def train(cfg: FeatureDistillConfig, model, answers: AnswerSet, held: Callable[[], dict],
          g: torch.Generator) -> list[dict]:
    """The draft trained for cfg.minutes on every sequence of `answers` (training/loop.py); the held-out curve
    (held(): replay.evaluate's figures) before, every cfg.eval_every steps and at the end."""
    log: list[dict] = []

    def point(step: int, minutes: float) -> None:  # one point of the held-out curve
        f = held()
        log.append({"step": step, "minutes": round(minutes, 2), "heldout_agreement": f["agreement"],
                    "heldout_accept": f["accept"], "heldout_tau": f["tau"]})
        print(f"held-out after {step} steps: top-1 by depth {f['agreement']}, given the earlier depths right "
              f"{f['accept']}, predicted greedy τ at γ {cfg.depths}: {f['tau']}", flush=True)

    def loss_fn(chunk: list[int]) -> tuple[torch.Tensor, tuple]:
        batch = make_batch(answers, chunk, cfg.depths)
        loss, preds = draft_loss(model, batch, cfg, answers, answers.prompt_lens(chunk))
        return loss, (batch, preds)

    def on_step(s: loop.Step) -> None:
        if s.number % LOG_EVERY == 0:
            batch, preds = s.aside
            print(f"step {s.number}: loss {float(s.loss):.3f}, batch top-1 by depth "
                  f"{[round(float(r.float().mean()), 3) for r in agreed(batch, preds, answers.to_draft)]}, "
                  f"{s.elapsed / 60:.1f} min", flush=True)
        if s.number % cfg.eval_every == 0:
            point(s.number, s.elapsed / 60)

    point(0, 0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    stats = loop.run(model, opt, epochs(answers.seqs, list(range(len(answers.seqs))), cfg.batch_sequences, g),
                     loss_fn, loop.Budget(cfg.minutes * 60, cfg.lr, WARMUP_STEPS), lambda: autocast(cfg.dtype), on_step)
    point(stats.steps, stats.seconds / 60)
    return log
