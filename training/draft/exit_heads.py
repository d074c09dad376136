"""The early-exit head a distilled draft ships with (mirror_core/models/exit_head.py): trained on the teacher's
hidden states at ℓ_e to put the target's next token among its top-κ candidates, read out through the frozen target's
final norm and LM head rows of the draft vocabulary.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mirror_core.models.ops import rms_norm

ROWS_PER_STEP = 2048  # teacher rows per exit-head step
Head = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (adapter A [H, H], bias b [H], gain g [H])


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
    init: Head | None = None
    exclude: torch.Tensor | None = None
    row_weight: torch.Tensor | None = None


def load_target(target_dir: str):
    """The target in float32, frozen, for the readout and the draft's initialisation: (model, its Readout, the ids a
    draft vocabulary always keeps: the end of an answer is always proposable)."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    eos = target.config.eos_token_id
    readout = Readout(target.lm_head.weight.detach(), target.model.norm.weight.detach(),
                      float(target.config.rms_norm_eps))
    return target, readout, [eos] if isinstance(eos, int) else list(eos or [])


def exit_readout(head: Head, readout: Readout, ids: torch.Tensor):
    """The exit head read out as the engine does (exit_head.py) through the target's Readout over the target ids
    `ids` (the draft vocabulary): features [n, H] → logits [n, V_d]."""
    adapter, bias, gain = (t.float() for t in head)
    lm_rows = readout.lm_head[ids].float()                                                  # [V_d, H]
    return lambda h: rms_norm(h.float() @ adapter + bias, gain, readout.eps) @ lm_rows.t()


def train_exit_head(task: ExitHeadTask, g: torch.Generator) -> tuple[Head, dict]:
    """A, b, g for one exit layer (exit_head.py), and its top-1/2/4/8 coverage of the target's next token on the
    held-out rows (raw: the logit lens over the whole vocabulary, for comparison)."""
    hsz = task.hidden.shape[1]
    start = (torch.eye(hsz), torch.zeros(hsz), task.readout.norm) if task.init is None else task.init
    head = tuple(t.clone().float().requires_grad_() for t in start)
    opt = torch.optim.Adam(head, lr=task.lr)
    read = exit_readout(head, task.readout, task.ids)  # reads the head's tensors as the optimizer updates them
    steps = int(task.epochs * len(task.train_rows) / ROWS_PER_STEP)
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = task.lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        rows = task.train_rows[torch.randint(len(task.train_rows), (ROWS_PER_STEP,), generator=g)]
        loss = _exit_head_loss(task, read, rows)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head = tuple(t.detach() for t in head)
    cov = _exit_head_coverage(task, head)
    print(f"exit head at layer {task.layer}: {steps} steps, {time.time() - t0:.0f} s, coverage {cov}", flush=True)
    return head, cov


def _exit_head_loss(task: ExitHeadTask, read, rows: torch.Tensor) -> torch.Tensor:
    """Forward KL from the teacher's top-k (in draft ids) to the head's readout `read` on `rows`, the excluded id
    (when given) carrying no target mass; rows weighed by row_weight when given."""
    z = read(task.hidden[rows])                                                              # [n, V_e]
    z = torch.cat([z, z.new_full((len(rows), 1), -1e4)], 1)  # an "other" column for soft_targets' padding
    sid, sprob = task.soft[0][rows], task.soft[1][rows]
    if task.exclude is not None:  # the excluded id carries no target mass: renormalise the rest
        z = z.scatter(1, task.exclude[rows].unsqueeze(1), -1e4)
        sprob = sprob * (sid != task.exclude[rows].unsqueeze(1))
        sprob = sprob / sprob.sum(-1, keepdim=True).clamp(min=1e-9)
    per_row = -(sprob * F.log_softmax(z, -1).gather(1, sid)).sum(-1)
    if task.row_weight is None:
        return per_row.mean()
    return (per_row * task.row_weight[rows]).sum() / task.row_weight[rows].sum()


@torch.no_grad()
def _exit_head_coverage(task: ExitHeadTask, head: Head) -> dict:
    """Top-k coverage of the target's greedy token on the held-out rows: the trained head, and the logit lens."""
    h, r = task.hidden[task.val_rows], task.readout
    label = task.top_ids[task.val_rows, 0].long()
    trained = task.ids[exit_readout(head, r, task.ids)(h).topk(8, -1).indices]              # [n, 8] target ids
    raw = (rms_norm(h.float(), r.norm.float(), r.eps) @ r.lm_head.t().float()).topk(8, -1).indices  # the logit lens
    return {k: {"trained": float((trained[:, :k] == label[:, None]).any(1).float().mean()),
                "logit_lens": float((raw[:, :k] == label[:, None]).any(1).float().mean())} for k in (1, 2, 4, 8)}


def hit_coverage(readout, h: torch.Tensor, label: torch.Tensor, pred: torch.Tensor) -> dict:
    """Where the draft's token was wrong: the share whose target token is in the readout's top-κ with the draft's
    token excluded (what M_t sends), κ = 1, 2, 4: the hit rate this head can give at those slots."""
    wrong = pred != label
    z = readout(h[wrong])                                                                   # [n, V_d]
    z.scatter_(1, pred[wrong].clamp(max=z.shape[1] - 1).unsqueeze(1), float("-inf"))
    top = z.topk(4, -1).indices
    lab = label[wrong].unsqueeze(1)
    return {"draft_wrong_share": round(float(wrong.float().mean()), 4),
            **{f"top{k}": round(float((top[:, :k] == lab).any(1).float().mean()), 4) for k in (1, 2, 4)}}


def save_exit_head(folder: str, layer: int, target, head: Head, ids: torch.Tensor) -> None:
    """A trained head beside a draft, where the engine's "auto" finds it (exit_head.py)."""
    from mirror_core.models.exit_head import ExitHeadWeights

    a, b, gain = head
    c = target.config
    ExitHeadWeights(layer, int(c.hidden_size), int(c.num_hidden_layers), int(c.vocab_size), a, b, gain, ids).save(folder)
