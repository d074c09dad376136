"""Encode + decode cost of the process lane's messages (the wire format in mirror_core/lanes/codec.py).

    PYTHONPATH=. python scripts/codec_cost.py [--n 20000] [--rounds 7]

Prints, per message, the minimum over `rounds` of the mean encode+decode time over `n` repeats, with
the CPU it ran on. It also runs on the tree before the lanes were split into a package (commit 51012a5, where
the codec was in mirror_core/lanes.py and the messages in mirror_core/draft.py), so the two can be
compared on one machine in one sitting.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mirror_core.config import SamplingConfig  # noqa: E402

try:  # not in the 51012a5 tree
    from mirror_core.machine import cpu_model
except ImportError:
    def cpu_model() -> str:
        return platform.processor() or platform.machine()

try:  # the renovated tree
    from mirror_core.lanes.codec import decode, encode
    from mirror_core.messages import BranchRequest, DraftStart, DraftWindow, ResolveRequest
    RENOVATED = True
except ImportError:  # 51012a5
    from mirror_core.draft import BranchRequest, DraftStart, DraftWindow, ResolveRequest
    from mirror_core.lanes import decode, encode
    RENOVATED = False


def samples(p_draft: torch.Tensor | None) -> dict[str, object]:
    spans = [("draft_branches", 1.0, 2.0), ("select_branch", 2.0, 2.1)]
    branches = tuple(tuple(range(r, r + 4)) for r in range(10))
    window = (DraftWindow((1, 2, 3, 4), p_draft, 3, branches, spans, 40, 60) if RENOVATED
              else DraftWindow((1, 2, 3, 4), p_draft, True, 3, branches, spans, 40, 60))
    return {
        "BranchRequest 5×2 ids": BranchRequest(3, tuple((2 * j, 2 * j + 1) for j in range(5))),
        "ResolveRequest": ResolveRequest(3, 2, 17, True) if RENOVATED else ResolveRequest(3, 2, 17),
        "DraftStart, 64-id prompt": DraftStart(tuple(range(64)), 4, SamplingConfig(0.7, 5, 0.9, 1, "rejection")),
        "DraftWindow, 4 tokens, 10 rows" + (", p_draft [4, 32000]" if p_draft is not None else ""): window,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    cases = {**samples(None), **samples(torch.rand(4, 32000))}
    print(f"CPU: {cpu_model()}; tree: {'renovated' if RENOVATED else '51012a5'}")
    for name, msg in cases.items():
        n = max(1, args.n // 20) if "p_draft" in name else args.n
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                decode(encode(msg))
            best = min(best, (time.perf_counter() - t0) / n)
        print(f"  {name}: {best * 1e6:.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
