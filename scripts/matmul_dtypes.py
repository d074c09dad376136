"""The matmuls of one forward, per dtype and row count, on this CPU: `python scripts/matmul_dtypes.py [--model DIR]`.

Times only `x[M, K] @ W[K, N]` over every linear-map weight of the model's layers plus its LM head (the fast
runner's layout: weights transposed and fused), one intra-op thread, interleaved over dtypes and M, median of
--iters. This is the part of a forward a dtype can speed up (runners/calibrate.py times whole forwards);
BENCHMARKS.md's history quotes it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv: list[str] | None = None) -> None:
    from mirror_core.models.loading import ModelSpec, load_model

    from mirror_core.machine import cpu_model
    from mirror_core.runners.fast import FastLlamaRunner

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(ROOT, "assets", "default_pair", "target"))
    p.add_argument("--rows", default="1,2,5,10,16")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    runner = FastLlamaRunner(load_model(ModelSpec(args.model)))  # float32 (the toy target's GGUF dequantised)
    weights = [w for layer in runner.layers for w in (layer.w_qkv, layer.w_o, layer.w_gate_up, layer.w_down)]
    weights.append(runner.lm_head)
    rows = [int(m) for m in args.rows.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    per_dtype = {d: [w.to(d) for w in weights] for d in dtypes}
    times: dict[tuple, list[float]] = {(d, m): [] for d in dtypes for m in rows}
    for i in range(args.iters + 2):  # the first two rounds warm up
        for d in dtypes:
            for m in rows:
                x = torch.randn(m, weights[0].shape[0]).to(d)
                xs = {w.shape[0]: torch.randn(m, w.shape[0]).to(d) for w in per_dtype[d]}
                start = time.perf_counter()
                for w in per_dtype[d]:
                    xs.get(w.shape[0], x) @ w
                if i >= 2:
                    times[d, m].append(time.perf_counter() - start)
    mb = sum(w.numel() for w in weights) * 4 / 2**20
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; {os.path.basename(args.model.rstrip('/'))}: "
          f"{len(weights)} weights, {mb:.0f} MiB in float32; 1 thread; median of {args.iters}")
    print("| dtype | " + " | ".join(f"M = {m}" for m in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for d in dtypes:
        cells = " | ".join(f"{1e3 * statistics.median(times[d, m]):.2f} ms" for m in rows)
        print(f"| {str(d).removeprefix('torch.')} | {cells} |")


if __name__ == "__main__":
    main()
