"""What making the target one function costs here: the row plan the load chose, and AR with and without it.

    PYTHONPATH=. python scripts/exactness_cost.py [--target T] [--prompts assets/chat_prompts.jsonl]
        [--limit 6] [--max-new-tokens 64] [--rounds 3] [--dtype auto]

Loads the target alone on the target lane (the CLI's automatic lane plan: its cores and threads), prints the CPU,
the chosen dtype and the row plan (runners/exactness.py) with the check's numbers, then runs `ar` on each prompt with
the plan and with the target's plain calls (row_plan = None), alternating in every round so drift hits both
alike, and prints the median tokens/s of each and their ratio. Then each row-shape-dependent operation's exact
bands (runners/exactness.py: exact_bands, i.e. where its kernel switches) and the runner's own step and window times
(1 and γ + 1 rows after a cached prefix) both ways. Timings are the engine's spans (RunSummary), decoding only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="default: the CLI's default target")
    p.add_argument("--prompts", default=os.path.join(ROOT, "assets", "chat_prompts.jsonl"))
    p.add_argument("--limit", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="auto")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dataclasses import replace

    import torch

    from mirror_core import MirrorEngine
    from mirror_core.bench.harness import load_prompts
    from mirror_core.cli import resolve_pair
    from mirror_core.lanes import auto_lanes
    from mirror_core.machine import cpu_model

    ns = argparse.Namespace(target=args.target, draft=None)
    resolve_pair(ns)
    lanes = replace(auto_lanes(), dtype=args.dtype)
    t0 = time.perf_counter()
    with MirrorEngine.load(ns.target, None, lanes) as engine:
        load_s = time.perf_counter() - t0
        info, rows = engine.info, engine.info.target_rows
        print(f"cpu: {cpu_model()}; torch {torch.__version__}; target lane threads {lanes.target_threads}")
        print(f"target: {ns.target} ({info.target_runner}), dtype {info.target_dtype.label} "
              f"(screened out: {', '.join(info.target_dtype.screened) or 'none'}); load {load_s:.1f} s")
        print(f"row check: {rows.describe}; differing without a plan: {rows.differing:,}; "
              f"source {rows.source}, {rows.seconds:.1f} s")
        prompts = load_prompts(args.prompts, engine.tokenizer, args.limit)
        ar_with_and_without(engine, rows.plan, prompts, args)
        forwards_with_and_without(engine, rows.plan, list(prompts[0].prompt_ids), lanes)
        engine.target.row_plan = rows.plan
    return 0


def ar_with_and_without(engine, plan, prompts, args: argparse.Namespace) -> None:
    """`ar` on every prompt with the row plan and with plain calls, alternating in every round; the medians."""
    from mirror_core import Request

    runner = engine.target
    tps: dict[str, list[float]] = {"plan": [], "plain": []}
    engine.generate(Request(prompts[0].prompt_ids, "ar", 4))  # warm-up
    for rnd in range(args.rounds):
        order = ("plan", "plain") if rnd % 2 == 0 else ("plain", "plan")
        for prompt in prompts:
            for mode in order:
                runner.row_plan = plan if mode == "plan" else None
                end = engine.generate(Request(prompt.prompt_ids, "ar", args.max_new_tokens))
                tps[mode].append(end.summary.tokens_per_s)
    runner.row_plan = plan
    med = {m: statistics.median(v) for m, v in tps.items()}
    print(f"ar tokens/s, median of {len(tps['plan'])} runs: with the plan {med['plan']:.1f}, "
          f"plain {med['plain']:.1f}, ratio {med['plan'] / med['plain']:.3f}")


def forwards_with_and_without(engine, plan, prompt_ids: list[int], lanes) -> None:
    """Each row-shape-dependent operation's exact bands, then the runner's own forwards of 1 and γ + 1 rows after
    the prompt, with the plan and plain, on the target lane's cores (as the engine's calibration times them)."""
    from mirror_core.lanes import pinned
    from mirror_core.runners.exactness import WINDOW, exact_bands

    runner = engine.target
    with pinned(lanes.target_cpus if lanes.target_device == "cpu" else (), lanes.target_threads):
        for op in runner.row_ops():  # where each operation's kernel treats rows alike, at the chosen dtype
            bands = exact_bands(op, runner.device)
            print(f"  {op.name}: exact bands {', '.join(b.label for b in bands)}; chosen "
                  f"{dict(plan.bands)[op.name].label if plan else 'none needed'}")
        for n in (1, WINDOW):
            a, b = (forward_ms(runner, plan if mode == "plan" else None, prompt_ids, n, engine.info.vocab_size)
                    for mode in ("plan", "plain"))
            print(f"target forward of {n} row(s): with the plan {a:.1f} ms, plain {b:.1f} ms, ratio {a / b:.3f}")


def forward_ms(runner, plan, prompt_ids: list[int], n: int, vocab_size: int) -> float:
    """Median time of a forward of n rows after the prompt's cached prefix, under row plan `plan` (None: plain)."""
    runner.row_plan = plan
    cache = runner.new_cache()
    runner.forward(cache, prompt_ids)
    start = runner.cache_len(cache)
    samples = []
    for r in range(12):
        t = time.perf_counter()
        runner.forward(cache, [(7 * i + 3) % vocab_size for i in range(n)])
        if r >= 2:
            samples.append(time.perf_counter() - t)
        runner.truncate(cache, start)
    return 1e3 * statistics.median(samples)


if __name__ == "__main__":
    raise SystemExit(main())
