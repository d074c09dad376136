"""The default target's forward by rows on the exact kernel, per weight format and thread count, from its GGUF blocks.

    PYTHONPATH=. python scripts/target_rows.py [--formats float32,int8] [--threads 1,2] [--rows 1,2,3,5,8,16]
        [--amx-rows 16] [--reps 30]

For each (format, threads): the forward of M new rows after a 96-token prefix, the quartile of `reps` timed calls
(ms), and the same in one-token steps. With the amx variant, `--amx-rows N` sends int8 calls of N+ rows to AMX tiles
(0: never; the bits do not change), so the tile path and VNNI's can be timed one against the other. The CPU and its
flags, the kernel variant and one core's and both cores' read bandwidth are printed first, so that every figure sits
beside the machine it was measured on (BENCHMARKS.md's history).
"""
from __future__ import annotations

import argparse
import time

import torch

from mirror_core.kernels import native
from mirror_core.lanes.placement import pinned
from mirror_core.machine import cpu_model, usable_cpus
from mirror_core.models.gguf_blocks import read_blocks
from mirror_core.models.loading import ModelSpec, load_model
from mirror_core.models.prepared import find_gguf, resolve_source
from mirror_core.runners.calibrate import DTYPES
from mirror_core.runners.fast import FastLlamaRunner
from mirror_core.runners.protocol import KernelChoice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="float32,int8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,2,3,5,8,16")
    ap.add_argument("--amx-rows", type=int, default=None, help="amx variant: int8 calls of this many rows on tiles")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    folder = resolve_source("smollm2-135m-instruct")
    model = load_model(ModelSpec(folder, "cpu"))
    lib = native.library()
    if lib is None:
        raise SystemExit(f"no kernel here: {native.unavailable()}")
    if args.amx_rows is not None:
        lib.set_amx_rows(args.amx_rows)
    every = usable_cpus()
    print(f"CPU: {cpu_model()}; kernel {lib.variant}")  # cpu_model names the kernel's flags
    print(f"read bandwidth: one core {native.read_bandwidth(lib)} GB/s", end="")
    with pinned(every, len(every), True):
        print(f", {len(every)} cores {native.read_bandwidth(lib, pool=True)} GB/s")
    runner = FastLlamaRunner(model, kernel=KernelChoice(lib), blocks=read_blocks(find_gguf(folder), model.config))
    rows = [int(r) for r in args.rows.split(",")]
    ids = list(range(100, 196))
    for fmt in args.formats.split(","):
        runner.set_dtypes(DTYPES[fmt])
        for threads in (int(t) for t in args.threads.split(",")):
            with pinned(every[:threads], threads, True):
                cache = runner.new_cache()
                runner.forward(cache, ids)
                ms = []
                for m in rows:
                    times = []
                    for _ in range(args.reps):
                        t0 = time.perf_counter()
                        runner.forward(cache, ids[:m])
                        times.append(time.perf_counter() - t0)
                        runner.truncate(cache, len(ids))
                    ms.append(sorted(times)[len(times) // 4] * 1e3)
            stream = runner.weight_stream
            print(f"{stream.storage:>22}, {threads} thread(s), {stream.nbytes / 1e6:.0f} MB a token; "
                  f"rows {rows}: ms {[round(t, 2) for t in ms]}, steps {[round(t / ms[0], 2) for t in ms]}")


if __name__ == "__main__":
    main()
