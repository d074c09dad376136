"""Per-forward cost of the draft runners on this machine: `python scripts/runner_steps.py [--pair DIR]`.

Times one forward of each draft runner after a 128-token prefix, 1 intra-op thread, interleaved
over the cases, median of --iters: the AR draft (FastLlamaRunner) and the SS draft (FastSSRunner,
and the model's own forward, SSRunner), for one token and for the 1 + n_str tokens an SS pass
feeds (fed token + lookahead), main stream only or with the streams, and as a branch batch of
--rows rows. Prints a markdown table; BENCHMARKS.md's history quotes it.
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


def measure(runners: dict, prefix: int = 128, rows: int = 10, iters: int = 200) -> dict[str, dict[str, float]]:
    """runners: label → runner. Returns label → case → median ms; SS cases only for SS runners."""
    def cases(r):
        n = r.num_streams
        out = {"1 token": lambda c: r.forward(c, [5])}
        if n:
            fed = [5] + [6] * n
            out |= {f"{1 + n} tokens, main only": lambda c: r.forward(c, fed),
                    "1 token + streams": lambda c: r.forward_streams(c, [5]),
                    f"{1 + n} tokens + streams (an SS pass)": lambda c: r.forward_streams(c, fed)}
        width = 1 + n
        out[f"branch batch: {rows} rows × {width} token{'s' if width > 1 else ''}"] = lambda c: r.forward_rows(
            r.fork(c, [prefix - i % 4 for i in range(rows)]), torch.full((rows, width), 7))
        return out

    plan = {label: cases(r) for label, r in runners.items()}
    caches = {}
    for label, r in runners.items():
        caches[label] = r.new_cache()
        r.forward(caches[label], [(11 * i) % 97 + 3 for i in range(prefix)])
    times = {label: {case: [] for case in plan[label]} for label in runners}
    for _ in range(iters):
        for label, r in runners.items():
            for case, fn in plan[label].items():
                t0 = time.perf_counter()
                fn(caches[label])
                times[label][case].append(time.perf_counter() - t0)
                r.truncate(caches[label], prefix)
    return {label: {case: 1e3 * statistics.median(v) for case, v in by_case.items()} for label, by_case in times.items()}


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    import mirror_core.models.ss_draft  # noqa: F401  registers the SS model class with the Auto classes
    from mirror_core.runners import build_runner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=os.path.join(ROOT, "assets", "default_pair"))
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rows", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load = lambda name: AutoModelForCausalLM.from_pretrained(os.path.join(args.pair, name),  # noqa: E731
                                                             dtype=torch.float32).eval()
    ar, ss = load("draft_ar"), load("draft_ss")
    vocab = ar.config.vocab_size
    runners = {"AR draft, FastLlamaRunner": build_runner(ar, vocab), "SS draft, FastSSRunner": build_runner(ss, vocab),
               "SS draft, SSRunner (model's forward)": build_runner(ss, vocab, "hf")}
    result = measure(runners, rows=args.rows, iters=args.iters)
    print(f"| runner | forward | ms (median of {args.iters}, 1 thread) |\n|---|---|---|")
    for label, by_case in result.items():
        for case, ms in by_case.items():
            print(f"| {label} | {case} | {ms:.2f} |")


if __name__ == "__main__":
    main()
