"""The int8 function's rows (src/int8_kernels.h): a call of any row count (1..17, the windows, and counts past one
panel pass) gives every row the bits of its own 1-row call, at every row position and thread count, on every variant
this machine runs, and those bits are the scalar reference's, for each packing (q4_1 and q8_0 blocks), an odd number
of blocks and a partial last panel included; so are rows holding infinities, NaNs, zeros and huge values."""
from __future__ import annotations

import random

import pytest
import torch

from mirror_core.kernels import native
from mirror_core.kernels.blocks import BlockWeights
from mirror_core.kernels.formats import INT8, PACKINGS
from mirror_core.kernels.variants import SCALAR
from testing.variants import variant_params

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")
STORAGES = tuple(p.storage for p in PACKINGS if p.activations == INT8)
ROWS = tuple(range(1, 18)) + (40, 70)  # the windows, then two and three panel passes


def _bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int32)  # NaNs compare by their bits


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("storage", STORAGES)
def test_every_row_count_and_position_gives_the_scalar_references_bits(variant, storage):
    lib, ref = native.library(variant), native.library(SCALAR)
    rng = random.Random(f"{variant}{storage}")
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for k, n in ((32, 1), (96, 33), (576, 100), (1024, 40)):  # 70 rows of 1024: quantised on both threads
        b = BlockWeights.random(storage, n, k, gen)
        w = b.dequantize().t().contiguous()
        packed, reference = native.PackedLinear(w, INT8, lib, blocks=b), native.PackedLinear(w, INT8, ref, blocks=b)
        x = torch.randn(max(ROWS), k, generator=gen) * 3                                   # [70, K]
        x[3, 5], x[7, :32], x[9, 1], x[11, 2] = float("inf"), 0.0, float("nan"), 3e38
        alone = torch.cat([reference(x[r:r + 1]) for r in range(x.shape[0])])              # [70, N]
        for threads in (1, 2):
            lib.set_threads(threads)
            try:
                for m in ROWS:
                    start = rng.randrange(0, x.shape[0] - m + 1)
                    got = packed(x[start:start + m])
                    assert torch.equal(_bits(got), _bits(alone[start:start + m])), (variant, storage, k, n, m, threads)
            finally:
                lib.set_threads(1)
