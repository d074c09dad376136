"""The exact small-row kernel (mirror_core/kernels): every row of an M-row call equals its own 1-row call bitwise, for
every M, row position, format and CPU variant this machine runs (the other CPU kinds' variants forced: AVX2 on an
AVX-512 machine); it agrees with torch's matmul within rounding; bad input is a clear error, never a crash; without
a compiler the engine says so and keeps torch's matmul; and a target on the kernel is one function (every window's
logits equal the one-token logits) without any row plan."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from mirror_core.kernels import native
from mirror_core.kernels.blocks import BlockWeights
from mirror_core.kernels.formats import PACKINGS
from mirror_core.kernels.variants import SCALAR
from testing.variants import DEFAULT_TIER, variant_params

VARIANTS = native.runnable_variants()
FORMATS = tuple(native.FORMATS)
needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")


def _quantised(w: torch.Tensor, x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights as the format stores them and the inputs as the kernel reads them, widened to float32."""
    wq = w.to(native.FORMATS[fmt]).float()
    return wq, (x.bfloat16().float() if fmt == "bfloat16" else x)


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_row_equals_its_own_one_row_call(variant, fmt):
    """Invariance as a property: random shapes (odd K and N included), M = 1..16, every row position."""
    lib = native.library(variant)
    rng = random.Random(f"{variant}{fmt}")
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for _ in range(4):
        k, n = rng.choice([1, 2, 7, 33, 64, 129, 576]), rng.choice([1, 5, 31, 32, 33, 100, 257])
        w = torch.randn(k, n, generator=gen) / k ** 0.5
        x = torch.randn(16, k, generator=gen)
        packed = native.PackedLinear(w, fmt, lib)
        alone = torch.cat([packed(x[r:r + 1]) for r in range(16)])                        # [16, N]
        for m in range(1, 17):
            start = rng.randrange(0, 17 - m)
            assert torch.equal(packed(x[start:start + m]), alone[start:start + m]), (k, n, m, start)
        wq, xq = _quantised(w, x, fmt)
        assert torch.allclose(alone, xq @ wq, rtol=1e-4, atol=1e-4 * k ** 0.5)


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
def test_every_variant_equals_the_scalar_reference(variant):
    """One function on every CPU kind: every packing of every format (formats.PACKINGS: float values and GGUF blocks,
    float and int8 activations) gives the scalar reference's bits, at several row counts and shapes; and so does the
    kernel's RMS norm."""
    lib, ref = native.library(variant), native.library(SCALAR)
    gen = torch.Generator().manual_seed(11)
    seen = set()
    for k, n in ((64, 33), (576, 100), (96, 257)):
        x = torch.randn(9, k, generator=gen) * 3
        for p in PACKINGS:
            if p.blocks:  # a GGUF's blocks, or (q8_0) their float weights, which it quantises itself
                b = BlockWeights.random(p.storage, n, k, gen)
                w, kw = b.dequantize().t().contiguous(), {} if p.quantises else {"blocks": b}
            else:
                w, kw = torch.randn(k, n, generator=gen) / k ** 0.5, {}
            for m in (1, 4, 9):
                got = native.PackedLinear(w, p.function, lib, **kw)(x[:m])
                assert torch.equal(got, native.PackedLinear(w, p.function, ref, **kw)(x[:m])), (variant, p.name, k, n, m)
            seen.add(p.name)
        gain = torch.rand(k, generator=gen) + 0.5
        assert torch.equal(native.rms_norm(lib, x, gain, 1e-5), native.rms_norm(ref, x, gain, 1e-5))
    assert seen == {p.name for p in PACKINGS}


def test_the_format_tables_agree(monkeypatch):
    """formats.py and the kernel's formats.h hold one table: a library whose table differs is refused at load."""
    lib = native.library(SCALAR)
    if lib is None:
        pytest.skip(native.unavailable(SCALAR))
    native._check_formats(lib.dll)  # today's tables agree
    changed = (replace(PACKINGS[0], block_bytes=PACKINGS[0].block_bytes + 1),) + PACKINGS[1:]
    monkeypatch.setattr(native, "PACKINGS", changed)
    with pytest.raises(OSError, match="format table"):
        native._check_formats(lib.dll)


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
def test_strided_and_batched_inputs_give_the_same_rows(variant):
    lib = native.library(variant)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 70, generator=gen)
    packed = native.PackedLinear(w, "float32", lib)
    x = torch.randn(3, 5, 80, generator=gen)[..., ::2]                                    # [3, 5, 40], stride 2
    assert not x.is_contiguous()
    y = packed(x)
    assert y.shape == (3, 5, 70)
    assert torch.equal(y, packed(x.contiguous()))
    assert torch.equal(y[1, 2], packed(x[1, 2:3].contiguous())[0])
    assert packed(torch.empty(0, 40)).shape == (0, 70)


@needs_kernel
def test_bad_input_is_a_clear_error():
    lib = native.library()
    packed = native.PackedLinear(torch.randn(8, 4), "float32", lib)
    with pytest.raises(TypeError, match="float32"):
        packed(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        packed([[0.0] * 8])
    with pytest.raises(ValueError, match="rows of 8"):
        packed(torch.randn(2, 7))
    with pytest.raises(ValueError, match="rows of 8"):
        packed(torch.tensor(1.0))
    with pytest.raises(ValueError, match="format"):
        native.PackedLinear(torch.randn(8, 4), "int8", lib)
    with pytest.raises(ValueError, match="2-D"):
        native.PackedLinear(torch.randn(8), "float32", lib)
    with pytest.raises(ValueError, match="unknown kernel variant"):
        native.library("sse2")
    code = packed.code
    assert packed._run(code, 0, 1, 8, 8, packed.data.data_ptr(), 4, 0, 4) == 1      # the C side refuses null pointers
    assert packed._run(code, 1, 1, 8, 8, packed.data.data_ptr() + 4, 4, 1, 4) == 1  # and unaligned packed weights
    assert packed._run(99, 1, 1, 8, 8, packed.data.data_ptr(), 4, 1, 4) == 1        # and an unknown format


def test_no_compiler_says_so(monkeypatch):
    native.library.cache_clear()
    try:
        monkeypatch.setattr(native, "compiler", lambda: None)
        monkeypatch.setattr(native, "runnable_variants", lambda: ("avx2",))
        assert native.library() is None
        assert "no C++ compiler" in native.unavailable()
    finally:
        native.library.cache_clear()


# -- a target on the kernel ---------------------------------------------------------------------------------------
def _runner(path: str, variant: str, fmt: str):
    from transformers import AutoModelForCausalLM

    from mirror_core.runners.fast import FastLlamaRunner
    from mirror_core.runners.protocol import KernelChoice

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    kernel = KernelChoice(native.library(variant))
    runner = FastLlamaRunner(model, capacity=8, kernel=kernel)  # capacity 8: the cache must grow
    runner.set_dtypes(native.FORMATS[fmt])
    return model, runner


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_native_layers_match_the_hf_forward(pairs, arch):
    """float32 weights on the kernel: the logits and the exit layer's h agree with transformers' forward."""
    from mirror_core.runners.hf import HFRunner

    model, fast = _runner(pairs[arch][0], native.runnable_variants()[0], "float32")
    hf = HFRunner(model)
    ids = torch.randint(0, 96, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    cf, ch = fast.new_cache(), hf.new_cache()
    outs = [(fast.forward(cf, ids[:12]), hf.forward(ch, ids[:12])), (fast.forward(cf, ids[12:17]), hf.forward(ch, ids[12:17]))]
    fast.truncate(cf, 14)
    hf.truncate(ch, 14)
    outs.append((fast.forward(cf, ids[17:18]), hf.forward(ch, ids[17:18])))
    at_exit = fast.forward_to_exit(fast.new_cache(), ids[:6], 2)
    outs.append((at_exit.h, hf.forward_to_exit(hf.new_cache(), ids[:6], 2).h))
    h = at_exit.h.clone()
    fast.finish_pass(at_exit)
    assert torch.equal(at_exit.h, h)  # the exit's h is a copy: later layers run in place on the pass's own rows
    for a, b in outs:
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_target_on_the_kernel_is_one_function_without_a_plan(pairs, variant, fmt):
    """Every slot's logits alone (AR's path) equal its logits in every window of up to 16 rows, bitwise, for every
    format and variant, and equal the scalar reference's (the whole model: layers, norms, attention, LM head); the
    load-time check (runners/exactness.py) finds it so and sets no plan."""
    from mirror_core.runners.exactness import check_rows

    _, runner = _runner(pairs["qwen3"][0], variant, fmt)   # Qwen3: q/k norms; the widest native path
    check = check_rows(runner, 96)
    assert check.invariant and check.plan is None and check.differing == 0
    prefix = [(5 * i + 1) % 90 for i in range(30)]
    window = [(3 * i + 2) % 90 for i in range(16)]
    cache = runner.new_cache()
    runner.forward(cache, prefix)
    alone = []
    for token in window:
        alone.append(runner.forward(cache, [token]))
    runner.truncate(cache, len(prefix))
    alone = torch.cat(alone)                                                               # [16, V]
    for rows in range(2, 17):
        assert torch.equal(runner.forward(cache, window[:rows]), alone[:rows]), (variant, fmt, rows)
        runner.truncate(cache, len(prefix))
    _, reference = _runner(pairs["qwen3"][0], SCALAR, fmt)
    assert torch.equal(reference.forward(reference.new_cache(), prefix + window),
                       runner.forward(runner.new_cache(), prefix + window))


def _first_layer(pairs):
    """The toy Llama target's first NativeLayer (best variant, float32), a cache, its width H and head size D."""
    _, runner = _runner(pairs["llama"][0], native.runnable_variants()[0], "float32")
    return runner.native_layers[0], runner.new_cache(), runner.embed.shape[1], runner.head_dim


@needs_kernel
def test_native_layer_refuses_bad_calls(pairs):
    layer, cache, h, d = _first_layer(pairs)
    x, cos = torch.zeros(2, h), torch.zeros(2, d)
    layer(x, cos, cos, cache.k[0], cache.v[0], 0)  # a good call
    bad = [((torch.zeros(2, h + 1), cos, cos, cache.k[0], cache.v[0], 0), "x"),
           ((x, torch.zeros(3, d), cos, cache.k[0], cache.v[0], 0), "cos"),
           ((x, cos, cos, cache.k[0], cache.v[0], cache.k.shape[2] - 1), "past the cache"),
           ((x, cos, cos, cache.k[0].transpose(1, 2), cache.v[0], 0), "strides"),
           ((x.double(), cos, cos, cache.k[0], cache.v[0], 0), "dtype")]
    for args, what in bad:
        with pytest.raises(ValueError, match="native layer"):
            layer(*args)


@pytest.mark.parametrize("kernel", ["torch"] + [pytest.param(v, marks=pytest.mark.slow) for v in VARIANTS[1:]])
def test_every_decoder_equals_ar_on_each_kernel(pairs, kernel):
    """Lossless on every linear-map path a machine may take: torch's matmul under a measured row plan (no compiler)
    and the kernel variants of the other CPU kinds forced here (the best variant runs in every other test)."""
    from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
    from testing.toy_models import prompts

    target, draft = pairs["llama"]
    lanes = LaneConfig(kind="inline", kernel=kernel, target_threads=1)
    with MirrorEngine.load(target, draft, lanes) as engine:
        roof = engine.info.roofline
        assert roof is not None and roof.kernel == kernel and len(roof.rows_ms) == 8
        assert (roof.kernel_note != "") == (kernel == "torch")
        for i, prompt in enumerate(prompts(3, seed=5)):
            ar = engine.generate(Request(prompt, "ar", 20)).token_ids
            for decoder in ("sd", "mirror"):
                spec = SpecConfig(gamma=1 + 2 * i, kappa=1 + i, exit_layer=1 + i % 3)
                assert engine.generate(Request(prompt, decoder, 20, spec=spec)).token_ids == ar, (kernel, decoder, i)


def test_a_kernel_this_cpu_cannot_run_is_a_clear_error(pairs):
    from mirror_core import LaneConfig, MirrorEngine, MirrorError

    with pytest.raises(MirrorError, match="kernel must be one of"):
        LaneConfig(kernel="sse2")
    missing = [v for v in native.VARIANTS if v not in VARIANTS]
    if not missing:
        pytest.skip("this CPU runs every variant")
    with pytest.raises(MirrorError, match=f"kernel {missing[0]}"):
        MirrorEngine.load(pairs["llama"][0], None, LaneConfig(kind="inline", kernel=missing[0]))


@needs_kernel
def test_a_nan_in_the_cache_poisons_the_row_as_torchs_softmax_does(pairs):
    """A NaN or infinite attention score makes the row NaN (torch's softmax gives NaN), never finite garbage."""
    layer, cache, h, d = _first_layer(pairs)
    cos, sin = torch.ones(1, d), torch.zeros(1, d)
    for bad in (float("nan"), float("inf")):
        cache.k[0].zero_()
        cache.k[0][:, 0] = bad                                           # entry 0 of every KV head
        x = torch.randn(1, h, generator=torch.Generator().manual_seed(0))
        layer(x, cos, sin, cache.k[0], cache.v[0], 1)                    # position 1 sees entries 0 and 1
        assert torch.isnan(x).all(), bad
