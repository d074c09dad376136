"""One budgeted training loop for every model the wing trains: the toy pair's target and drafts, and both distilled
drafts.

A loop runs until its wall-clock budget (or its step cap) is spent. The learning rate warms up linearly over
`warmup_steps`, then follows a cosine down to `floor` × peak over the budget; every step clips the gradient norm.
What differs between the recipes stays with them: the batches, the loss, the optimizer, and what is logged or
evaluated along the way (`on_step`).
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch

RECENT = 50  # steps whose losses LoopStats.recent_loss averages


@dataclass(frozen=True)
class Budget:
    """How long one loop runs, and its learning-rate schedule."""

    seconds: float               # wall-clock budget
    peak_lr: float
    warmup_steps: int
    max_steps: int = 0           # 0: the time budget alone; else a cap, and the cosine runs over the steps
    grad_clip: float = 1.0       # max gradient norm per step
    min_steps: int = 0           # steps taken even when the budget is spent at once
    floor: float = 0.1           # the cosine ends at floor × peak_lr

    def spent(self, step: int, elapsed: float) -> bool:
        if step < self.min_steps:
            return False
        return elapsed >= self.seconds or bool(self.max_steps and step >= self.max_steps)

    def lr(self, step: int, elapsed: float) -> float:
        """Linear warmup, then cosine to floor × peak_lr over the budget's share spent (of its steps or seconds)."""
        progress = step / self.max_steps if self.max_steps else elapsed / max(self.seconds, 1e-9)
        warm = min(1.0, (step + 1) / self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return self.peak_lr * warm * (self.floor + (1 - self.floor) * cosine)


@dataclass(frozen=True)
class Step:
    """One step done, as on_step sees it."""

    number: int                  # steps done, this one included
    elapsed: float               # seconds since the loop began, when this step began
    loss: torch.Tensor           # the step's loss, detached
    aside: Any                   # what the loss function returned beside the loss (a draft's predictions, say)
    batch: Any


@dataclass(frozen=True)
class LoopStats:
    steps: int
    seconds: float
    recent_loss: float | None    # mean loss of the last ≤ RECENT steps (None: no step)


def run(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: Iterator, loss_fn: Callable[[Any], tuple],
        budget: Budget, amp: Callable[[], ContextManager] = nullcontext,
        on_step: Callable[[Step], None] | None = None) -> LoopStats:
    """Train `model` until the budget is spent: each step sets the scheduled lr, takes the next batch, computes
    loss_fn(batch) → (loss, aside) under amp(), steps the optimizer after clipping, then calls on_step. The budget is
    checked before a batch is drawn, so a loop draws exactly the batches it trains on."""
    model.train()
    recent: list[float] = []
    step, t0 = 0, time.perf_counter()
    while not budget.spent(step, elapsed := time.perf_counter() - t0):
        for group in opt.param_groups:
            group["lr"] = budget.lr(step, elapsed)
        batch = next(batches)
        with amp():
            loss, aside = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), budget.grad_clip)
        opt.step()
        step += 1
        recent = (recent + [loss.item()])[-RECENT:]
        if on_step is not None:
            on_step(Step(step, elapsed, loss.detach(), aside, batch))
    return LoopStats(step, time.perf_counter() - t0, sum(recent) / len(recent) if recent else None)
