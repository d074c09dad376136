"""One target function on every machine: make a position's logits independent of how many rows share the call.

Lossless decoding needs the target to compute the same logits for a position whether AR feeds it alone (a
one-row call) or SD and Mirror-SD feed it inside a window of γ + 1 rows. Floating point does not promise that:
a CPU's matmul library picks its kernel by the number of rows M, and kernels round differently. Where it
switches is a property of the CPU, the library, the dtype, the threads and the matrix's shape (measured here:
M = 2 on an Intel Xeon with AMX, M = 4 on AMD EPYCs with AVX2 and with AVX-512, for every linear map of two
models; BENCHMARKS.md's history), so no constant is right everywhere. This module measures it where the target runs.

The mechanism, per operation whose kernel depends on the row count (each linear map, the LM head, attention):
a **row band** [lo, hi] of call sizes inside which the operation's kernel gives every row the same result
whatever the call's size and the row's place in it. A call of M rows is then computed as chunks of at most hi
rows, each padded with zero rows to at least lo (`RowBand.spans`). Rows never interact in these operations, so
the padding and the chunking change no real row's value; the band only fixes which kernel computes it.
A band always exists: [1, 1] (every row alone, exactly AR's call) is exact by construction.

How a band is found (`search_plan`): the operation is run on P identical rows for every P = 1..EXACT_ROWS; the
sizes whose rows all equal each other form runs of consecutive P with one value, and every maximal run [a, b]
is an exact band (b = EXACT_ROWS: no upper bound). Of these, the one with the least summed slowdown of its AR
step (1 row) and its window (γ + 1 rows at the default γ) against the fastest band at each is taken, timed with
the operation's real weights and the lane's threads (`cheapest`). The whole forward is then checked end to end
(`check_rows`: 17 positions one at a time against windows of 2..17 rows, bitwise) and, only if that fails,
every band falls back to [1, 1]. Where even that is not exact,
the run says so: "not bit-exact on this CPU" (`RowCheck.describe`), never a silent pass.

Attention has a second call-shape dependence, the key axis: a longer axis blocks the weighted sum of values
differently. A runner with a plan reduces each row over a key axis fixed by its own position
(runners/fast.py, `_key_buckets`); its band is in query rows.

The records (RowBand, RowPlan, RowCheck) are mirror_core/records.py's: the events and the page read them without
torch. This module is the measurement.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from .. import machine
from ..config import DEFAULT_GAMMA
from ..records import RowBand, RowCheck, RowPlan

EXACT_ROWS = 17                  # calls of up to γ + 1 rows (config.MAX_GAMMA = 16) are made exact; longer ones
                                 # (prefills) are the same call in every decoder and run as they are
WINDOW = DEFAULT_GAMMA + 1       # the window the band choice is timed on (with one AR step)
TIMING_ROUNDS = 5


@dataclass(frozen=True)
class RowOp:
    """One operation whose kernel may depend on the row count, bound to its real weights by its runner."""

    name: str
    width: int                                              # K: features per input row
    run: Callable[[torch.Tensor, RowBand | None], torch.Tensor]  # rows [M, K] → [M, N], called as the band says


# -- the search -------------------------------------------------------------------------------
def exact_bands(op: RowOp, device: torch.device, max_rows: int = EXACT_ROWS) -> list[RowBand]:
    """Every maximal band of sizes 1..max_rows in which P identical rows all get one and the same result."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, op.width, generator=gen).to(device)                               # two probe rows
    values: list[torch.Tensor | None] = []
    for p in range(1, max_rows + 1):
        out = torch.cat([op.run(row.expand(p, -1).contiguous(), None) for row in x], -1)  # [P, 2N]
        values.append(out[0] if bool((out == out[0]).all()) else None)
    bands, a = [], 0
    while a < max_rows:
        if values[a] is None:
            a += 1
            continue
        b = a
        while b + 1 < max_rows and values[b + 1] is not None and torch.equal(values[b + 1], values[a]):
            b += 1
        bands.append(RowBand(a + 1, None if b + 1 == max_rows else b + 1))
        a = b + 1
    return bands


def band_costs(op: RowOp, band: RowBand, device: torch.device, window: int = WINDOW) -> tuple[float, float]:
    """Median seconds of one AR row and of one window of `window` rows, called as the band says."""
    x = torch.randn(window, op.width, generator=torch.Generator().manual_seed(1)).to(device)
    samples: tuple[list[float], list[float]] = ([], [])
    for r in range(TIMING_ROUNDS + 1):  # round 0 warms the kernels up
        for rows, kept in zip((x[:1], x), samples):
            machine.synchronize(device)
            t0 = time.perf_counter()
            op.run(rows, band)
            machine.synchronize(device)
            if r:
                kept.append(time.perf_counter() - t0)
    return statistics.median(samples[0]), statistics.median(samples[1])


def cheapest(costs: dict[RowBand, tuple[float, float]]) -> RowBand:
    """The band with the least summed slowdown of its AR step and its window against the fastest band at each:
    AR (the baseline, one row a call) and the speculative decoders (windows) weigh alike."""
    best_step = min(c[0] for c in costs.values())
    best_window = min(c[1] for c in costs.values())
    return min(costs, key=lambda b: costs[b][0] / best_step + costs[b][1] / best_window)


def search_plan(ops: list[RowOp], device: torch.device) -> RowPlan:
    """Each operation's cheapest exact band (see the module's docstring)."""
    chosen = []
    for op in ops:
        bands = exact_bands(op, device)
        best = bands[0] if len(bands) == 1 else cheapest({b: band_costs(op, b, device) for b in bands})
        chosen.append((op.name, best))
    return RowPlan(tuple(chosen))


def row_by_row(ops: list[RowOp]) -> RowPlan:
    """Every operation one row per call: AR's own call for every row of a window (exact by construction)."""
    return RowPlan(tuple((op.name, RowBand(1, 1)) for op in ops))


# -- the end-to-end check ---------------------------------------------------------------------
def probe_ids(vocab_size: int, n: int, a: int, b: int) -> list[int]:
    """n token ids inside the vocabulary (any fixed sequence: the check needs no meaning)."""
    return [(a * i + b) % vocab_size for i in range(n)]


@torch.inference_mode()
def differing_logits(runner, vocab_size: int) -> int:
    """Logits that differ between 17 positions computed one token at a time (AR's path) and the same positions
    inside windows of 2..17 rows, summed over the window sizes; positions stay inside the model's context."""
    context = runner.max_positions or 4096
    rows = min(EXACT_ROWS, max(2, context // 2))
    prefix = probe_ids(vocab_size, max(1, min(56, context - rows)), 7, 3)  # the window crosses a key bucket (64)
    probe = probe_ids(vocab_size, rows, 11, 5)
    cache = runner.new_cache()
    runner.forward(cache, prefix)
    one_at_a_time = torch.cat([runner.forward(cache, [token]) for token in probe])         # [rows, V], AR's path
    runner.truncate(cache, len(prefix))
    total = 0
    for m in range(2, rows + 1):
        total += int((runner.forward(cache, probe[:m]) != one_at_a_time[:m]).sum())
        runner.truncate(cache, len(prefix))
    return total


def check_rows(runner, vocab_size: int, known: RowCheck | None = None) -> RowCheck:
    """Make the target one function on this machine, with the calling thread's settings, and say how.

    A runner that takes a plan (Runner.plans_rows: runners/fast.py's `row_plan`, `row_ops`) gets one: the known one
    (the calibration cache's) if it still checks out, else none if the logits are already invariant, else the
    searched one, else row by row. A runner without plans (HFRunner) is measured and reported as it is."""
    t0 = time.perf_counter()
    done = lambda check: replace(check, seconds=round(time.perf_counter() - t0, 2))  # noqa: E731
    if not runner.plans_rows:
        before = differing_logits(runner, vocab_size)
        return done(RowCheck(None, before == 0, before, source="measured"))
    if known is not None and known.checked and known.invariant:
        runner.row_plan = known.plan
        if differing_logits(runner, vocab_size) == 0:
            return done(replace(known, source="cached"))
    runner.row_plan = None
    before = differing_logits(runner, vocab_size)
    if before == 0:
        return done(RowCheck(None, True, 0, source="measured"))
    ops = runner.row_ops()
    tried = []
    for plan in dict.fromkeys((search_plan(ops, runner.device), row_by_row(ops))):  # the same plan is checked once
        runner.row_plan = plan
        after = differing_logits(runner, vocab_size)
        if after == 0:
            return done(RowCheck(plan, True, before, source="measured"))
        tried.append((after, plan))
    after, plan = min(tried, key=lambda t: t[0])  # nothing exact: keep the plan that differs least, and say so
    runner.row_plan = plan
    return done(RowCheck(plan, False, before, source="measured"))


def pad_rows(x: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """x with zero rows appended along dim up to `rows` (x itself when it has them)."""
    extra = rows - x.shape[dim]
    if extra <= 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, extra]
    return F.pad(x, pad)

