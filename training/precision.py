"""The dtype the training pipeline computes in, chosen by measuring where it runs.

The pipeline's matrix products (chat_data's generation, the teacher pass, the exit head's and the drafts' training
under autocast) may run in bfloat16 or float32. Which is faster depends on the CPU, not on taste: with bf16 units
(avx512_bf16, AMX) bfloat16 is 1.5x float32 or more; without them (AVX2 only) torch converts every bfloat16 product
to float32 and back, and one product of 128 rows took 8x float32's time (docs/TRAINING.md, "Precision"). So "auto"
times one product of the pipeline's typical shape in both dtypes, once per process, and takes bfloat16 only when it
is faster by MARGIN; the generation records and run records keep the dtype that ran.

The engine chooses its own dtypes per lane (runners/calibrate.py); this module is the training side's one place.
"""
from __future__ import annotations

import functools
import statistics
import time
from contextlib import nullcontext

import torch

PRECISIONS = ("auto", "bfloat16", "float32")
SHAPE = (128, 576, 1536)  # rows × in × out: a batch of 128 rows through SmolLM2-135M's MLP up-projection
MARGIN = 0.10             # bfloat16 must be this much faster (it also rounds): else float32
ROUNDS = 5                # timed products per dtype (median), after one warm-up each


def _product_s(dtype: torch.dtype) -> float:
    rows, k, n = SHAPE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g).to(dtype)                        # [rows, k]
    w = torch.randn(n, k, generator=g).to(dtype)                           # [n, k]
    torch.nn.functional.linear(x, w)
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@functools.lru_cache(maxsize=None)
def bf16_speedup() -> float:
    """float32's time over bfloat16's for one product of SHAPE on this CPU, at this process's thread count (> 1:
    bfloat16 is faster). Measured once per process."""
    return _product_s(torch.float32) / _product_s(torch.bfloat16)


def resolve(requested: str) -> str:
    """The dtype to compute in, by name: the requested one, or for "auto" "bfloat16" where it is measured MARGIN
    faster than float32 here, else "float32"."""
    if requested not in PRECISIONS:
        raise ValueError(f"dtype must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if requested == "auto":
        return "bfloat16" if bf16_speedup() >= 1.0 + MARGIN else "float32"
    return requested


def torch_dtype(requested: str) -> torch.dtype:
    return getattr(torch, resolve(requested))


def autocast(requested: str):
    """Forward passes in the resolved dtype with float32 master weights: bfloat16 autocast, or nothing for float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if resolve(requested) == "bfloat16" else nullcontext()
