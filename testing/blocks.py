"""Random GGUF blocks (q4_1: values 0..15 with a scale and a minimum; q8_0: int8 values with a scale) for a weight
W [k, n] stored as GGUF stores it, [n, k/32, 32]: what the kernel's block packings read."""
from __future__ import annotations

import torch

from mirror_core.kernels.blocks import BlockWeights


def random_blocks(kind: str, n: int, k: int, gen: torch.Generator) -> BlockWeights:
    d = (torch.rand(n, k // 32, generator=gen) * 0.02).half()
    if kind == "q4_1":
        q = torch.randint(0, 16, (n, k // 32, 32), generator=gen, dtype=torch.uint8)
        return BlockWeights(kind, d, q, (-torch.rand(n, k // 32, generator=gen) * 0.1).half())
    return BlockWeights(kind, d, torch.randint(-128, 128, (n, k // 32, 32), generator=gen, dtype=torch.int8))
