"""The kernel's decoder layer (src/layer.h) at attention shapes the toy pairs do not have: query heads attended
together by KV head in parts of up to four (5 heads a KV head: a part of 4 and one of 1), head sizes that are and are
not a multiple of 16, a prefill of more than one block of keys: every row of a window gives the bits of its own
one-row call, on one thread and two, on every variant this machine runs, equal to the scalar reference's."""
from __future__ import annotations

import pytest
import torch

from mirror_core.kernels import native
from mirror_core.kernels.variants import SCALAR
from testing.variants import variant_params

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")


def _layer(lib: native.Library, h: int, heads: int, kv_heads: int, d: int, inter: int, seed: int) -> native.NativeLayer:
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen) / shape[0] ** 0.5  # noqa: E731
    packed = lambda w: native.PackedLinear(w, "float32", lib)  # noqa: E731
    return native.NativeLayer(lib, ln1=torch.rand(h, generator=gen) + 0.5, ln2=torch.rand(h, generator=gen) + 0.5,
                              qkv=packed(rand(h, (heads + 2 * kv_heads) * d)), b_qkv=None, q_norm=None, k_norm=None,
                              o=packed(rand(heads * d, h)), gate_up=packed(rand(h, 2 * inter)),
                              down=packed(rand(inter, h)), heads=heads, kv_heads=kv_heads, head_dim=d, eps=1e-5)


def _run(layer: native.NativeLayer, x: torch.Tensor, angles: torch.Tensor, prefix: int, window: int, alone: bool,
         kv_heads: int, d: int) -> torch.Tensor:
    """The prefix in one call, then the window in one call (or row by row): the window's outputs [window, H]."""
    keys, values = torch.zeros(kv_heads, prefix + window, d), torch.zeros(kv_heads, prefix + window, d)
    cos, sin = angles.cos(), angles.sin()                                                   # [T, D]
    x = x.clone()
    layer(x[:prefix], cos[:prefix].contiguous(), sin[:prefix].contiguous(), keys, values, 0)
    spans = [(r, r + 1) for r in range(prefix, prefix + window)] if alone else [(prefix, prefix + window)]
    for lo, hi in spans:
        part = x[lo:hi].clone()
        layer(part, cos[lo:hi].contiguous(), sin[lo:hi].contiguous(), keys, values, lo)
        x[lo:hi] = part
    return x[prefix:]


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("heads,kv_heads,d", [(10, 2, 32), (9, 3, 24), (4, 4, 16)])
def test_grouped_heads_give_every_row_its_own_bits_on_every_variant(variant, heads, kv_heads, d):
    h, inter, prefix, window = 48, 40, 37, 17
    gen = torch.Generator().manual_seed(heads * d)
    x = torch.randn(prefix + window, h, generator=gen)                                      # [T, H]
    angles = torch.rand(prefix + window, d, generator=gen) * 3                              # [T, D]
    layer = _layer(native.library(variant), h, heads, kv_heads, d, inter, seed=1)
    reference = _layer(native.library(SCALAR), h, heads, kv_heads, d, inter, seed=1)
    window_call = _run(layer, x, angles, prefix, window, False, kv_heads, d)
    assert torch.equal(window_call, _run(layer, x, angles, prefix, window, True, kv_heads, d))
    assert torch.equal(window_call, _run(reference, x, angles, prefix, window, False, kv_heads, d))
    native.library(variant).set_threads(2)  # the (row, KV head, part) units split between two threads
    try:
        assert torch.equal(window_call, _run(layer, x, angles, prefix, window, False, kv_heads, d))
    finally:
        native.library(variant).set_threads(1)
