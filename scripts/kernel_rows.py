"""The exact small-row kernel against torch's matmul at SmolLM2-135M's shapes, one thread, M = 1..8 rows (--rows).

    OMP_NUM_THREADS=1 taskset -c 1 python scripts/kernel_rows.py [--variants avx512_bf16,avx2] [--reps 30]
        [--rows 1,2,3,4,5,8,12,17]

For each path and weight shape x[M, K] @ W[K, N] (random weights; the int8 function on random GGUF blocks, q8_0 for
the LM head as the default pair stores it, q4_1 elsewhere): the best-of-reps ms per call for each M, '*' where some
row of the M-row call differs bitwise from that row's own 1-row call, and the streaming rate at the first M
(weight bytes ÷ time). Then one core's read bandwidth (kernels/native.read_bandwidth) and the CPU, so that every
figure sits beside the machine it was measured on (BENCHMARKS.md's history).
"""
from __future__ import annotations

import argparse
import time

import torch

from mirror_core.kernels import native
from mirror_core.kernels.blocks import BlockWeights
from mirror_core.kernels.formats import INT8
from mirror_core.machine import cpu_model

SHAPES = ((576, 1728), (576, 1536), (1536, 576), (576, 49152))  # q|k|v, gate|up (per half), down, LM head


def best_ms(f, x: torch.Tensor, reps: int) -> float:
    f(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def row(name: str, f, x: torch.Tensor, nbytes: int, reps: int, rows: list[int]) -> str:
    alone = [f(x[r:r + 1]) for r in range(max(rows))]
    cells = []
    for m in rows:
        exact = all(torch.equal(f(x[:m])[r], alone[r][0]) for r in range(m))
        cells.append(f"{best_ms(f, x[:m], reps):7.3f}{' ' if exact else '*'}")
    rate = nbytes / best_ms(f, x[:rows[0]], reps) / 1e6
    return f"  {name:<24}" + "".join(cells) + f"   {rate:5.1f} GB/s at M={rows[0]}"



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(native.runnable_variants()))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; one thread")
    gen = torch.Generator().manual_seed(0)
    for k, n in SHAPES:
        w = torch.randn(k, n, generator=gen) / k ** 0.5
        x = torch.randn(max(rows), k, generator=gen)
        print(f"x[M, {k}] @ W[{k}, {n}]: ms per call for M = {args.rows} ('*': a row differs from its own 1-row call)")
        reps = max(5, args.reps // 6) if n > 10000 else args.reps
        print(row("torch float32", lambda a: a @ w, x, w.numel() * 4, reps, rows))
        wb = w.bfloat16()
        print(row("torch bfloat16", lambda a: (a.bfloat16() @ wb).float(), x, w.numel() * 2, reps, rows))
        blocks = BlockWeights.random("q8_0" if n > 10000 else "q4_1", n, k, gen)
        for variant in args.variants.split(","):
            lib = native.library(variant)
            if lib is None:
                print(f"  kernel {variant}: {native.unavailable(variant)}")
                continue
            for fmt in native.FORMATS:
                packed = native.PackedLinear(w, fmt, lib)
                print(row(f"kernel {variant} {fmt}", packed, x, packed.nbytes, reps, rows))
            packed = native.PackedLinear(blocks.dequantize().t().contiguous(), INT8, lib, blocks=blocks)
            print(row(f"kernel {variant} {INT8} {blocks.kind}", packed, x, packed.nbytes, reps, rows))
    lib = native.library()
    if lib is not None:
        print(f"one core's read bandwidth: {native.read_bandwidth(lib)} GB/s")


if __name__ == "__main__":
    main()
