"""The q8_0 format (kernels/formats.py): any float weights quantised to Q8_0 blocks as llama.cpp's quantize does (per
32 inputs d = max|w|/127 kept as float16, q = round(w · 1/d), halves away from zero), packed by the kernel's C packer
(src/pack.h) into the very bytes the int8 format packs from a GGUF's q8_0 blocks, so it computes the int8 function on
those blocks, on every variant; weights it cannot quantise are a clear error. The shipped feature draft's maps on it
stay within Q8_0's rounding of the float maps."""
from __future__ import annotations

import pytest
import torch

from mirror_core.kernels import native
from mirror_core.kernels.blocks import BlockWeights
from mirror_core.kernels.formats import FUNCTIONS, Q8_0, packing
from testing.variants import DEFAULT_TIER

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")


def llama_cpp_q8_0(w: torch.Tensor) -> BlockWeights:
    """W [N, K] → its q8_0 blocks, llama.cpp's quantize_row_q8_0_ref written in torch: amax per block of 32, d = amax /
    127 (float32), id = 1/d (0 where d is 0), q = roundf(w · id) with halves away from zero, d stored as float16."""
    b = w.float().reshape(w.shape[0], -1, 32)                                             # [N, K/32, 32]
    d = b.abs().amax(-1) / 127                                                            # [N, K/32]
    v = b * torch.where(d != 0, 1 / d, torch.zeros_like(d)).unsqueeze(-1)
    whole = torch.trunc(v)
    q = torch.where((v - whole).abs() == 0.5, whole + torch.sign(v), torch.round(v))      # halves away from zero
    return BlockWeights("q8_0", d.half(), q.to(torch.int8))


def _weights(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random bfloat16-valued weights W [N, K] with the blocks quantisation must get right: a zero block, a block of
    exact halves (d = 1: w = ±2.5, ±0.5 ...), and one whose scale is a float16 subnormal."""
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).bfloat16().float()
    w[0, :32] = 0
    w[1, :32] = torch.tensor([127.0] + [(i - 15.5) for i in range(31)])                   # 127, -15.5 .. 14.5
    w[2, 32:64] = torch.randn(32, generator=gen) * 1e-4
    return w


@needs_kernel
def test_q8_0_packs_llama_cpps_blocks_and_computes_int8_on_them():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 576, generator=gen) * 2
    w = _weights(100, 576, gen)                                                            # [N, K]
    blocks = llama_cpp_q8_0(w)
    assert blocks.q[1, 0, 1:].tolist() == [int((i - 15.5) + (0.5 if i > 15 else -0.5)) for i in range(31)]
    assert float(blocks.d[2, 1]) != 0 and blocks.d[2, 1].abs() < 6.1e-5                  # a subnormal scale
    first = None
    for variant in DEFAULT_TIER:  # the best path here, the AVX2 one and the scalar reference: the same bytes and bits
        lib = native.library(variant)
        mine = native.PackedLinear(w.t(), Q8_0, lib)
        gguf = native.PackedLinear(blocks.dequantize().t().contiguous(), "int8", lib, blocks=blocks)
        assert torch.equal(mine.data, gguf.data) and mine.storage == "q8_0" and mine.packing == packing(Q8_0)
        y = mine(x)
        assert torch.equal(y, gguf(x)) and torch.equal(y[4:5], mine(x[4:5]))
        first = y if first is None else first
        assert torch.equal(y, first), variant
    exact = x.double() @ w[3:].t().double()                                               # the random rows
    assert (first[:, 3:].double() - exact).abs().max() < 0.02 * exact.abs().max()  # int8 on both sides: ~1 % here
    assert FUNCTIONS[Q8_0].startswith("int8 activations per block of 32 on Q8_0 weights quantised")


@needs_kernel
def test_weights_q8_0_cannot_quantise_are_a_clear_error():
    lib = native.library()
    with pytest.raises(ValueError, match="blocks of 32 inputs.*has 33 inputs"):
        native.PackedLinear(torch.randn(33, 8), Q8_0, lib)
    w = torch.randn(64, 8)
    w[5, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        native.PackedLinear(w, Q8_0, lib)
    b = llama_cpp_q8_0(torch.randn(8, 64))
    with pytest.raises(ValueError, match="cannot be packed as q8_0"):
        native.PackedLinear(b.dequantize().t().contiguous(), Q8_0, lib, blocks=b)


@needs_kernel
def test_a_float_target_runs_q8_0_on_the_kernel_and_every_decoder_equals_ar(pairs):
    """q8_0 is offered for any float32 target whose maps fill blocks (a folder's safetensors here), named as the
    function it computes; every decoder still emits ar's tokens; without the kernel it is refused in one line."""
    from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
    from mirror_core.config import MirrorError
    from mirror_core.models.pairs import target_function
    from testing.toy_models import prompts

    target, draft = pairs["llama"]
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype=Q8_0)) as engine:
        assert engine.info.target_dtype.sequence == Q8_0 and engine.target.weight_stream.storage == Q8_0
        assert Q8_0 in engine.info.target_formats and target_function(engine.info).computes == FUNCTIONS[Q8_0]
        for prompt in prompts(2, seed=4):
            ar = engine.generate(Request(prompt, "ar", 16)).token_ids
            for decoder, spec in (("sd", SpecConfig(3)), ("mirror", SpecConfig(2, 2))):
                assert engine.generate(Request(prompt, decoder, 16, spec=spec)).token_ids == ar, decoder
    with pytest.raises(MirrorError, match="--dtype q8_0 quantises .*; this target runs on torch"):
        MirrorEngine.load(target, None, LaneConfig(kind="inline", dtype=Q8_0, kernel="torch"))
