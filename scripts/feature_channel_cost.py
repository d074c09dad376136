"""What the feature-reading draft adds to the token channel: bytes and codec time per message, with and without the
target's hidden states (H = 576, SmolLM2's width; γ = 4). The process lane copies these frames through shared memory.

    PYTHONPATH=. python scripts/feature_channel_cost.py
"""
from __future__ import annotations

import time

import torch

from mirror_core.lanes.codec import decode, encode
from mirror_core.machine import cpu_model
from mirror_core.messages import BranchRequest, ResolveRequest

H, GAMMA, KAPPA = 576, 4, 2


def cost(msg, n: int = 2000) -> tuple[float, int]:
    """(µs to encode + decode, bytes in the frame's arrays)."""
    for _ in range(50):
        decode(encode(msg))
    t0 = time.perf_counter()
    for _ in range(n):
        decode(encode(msg))
    frame = encode(msg)
    return (time.perf_counter() - t0) / n * 1e6, frame.i64.nbytes + frame.f64.nbytes + frame.f32.nbytes


def main() -> None:
    torch.set_num_threads(1)
    ids = tuple(tuple(range(j, j + KAPPA)) for j in range(GAMMA + 1))
    cases = [("M_t, ids only", BranchRequest(1, ids)),
             (f"M_t + features [{GAMMA + 1}, {H}]", BranchRequest(1, ids, torch.randn(GAMMA + 1, H))),
             ("ResolveRequest, ids only", ResolveRequest(1, 2, 7, True)),
             (f"ResolveRequest + features [3, {H}] (A_t = 2)", ResolveRequest(1, 2, 7, True, torch.randn(3, H))),
             (f"ResolveRequest step 0 + prompt features [200, {H}]", ResolveRequest(0, 0, 7, False, torch.randn(200, H)))]
    print(f"CPU: {cpu_model()}, 1 thread")
    print("| message | bytes | encode + decode (µs) |\n|---|---|---|")
    for name, msg in cases:
        us, nbytes = cost(msg, 300 if "prompt" in name else 2000)
        print(f"| {name} | {nbytes:,} | {us:.1f} |")


if __name__ == "__main__":
    main()
