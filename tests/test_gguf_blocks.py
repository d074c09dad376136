"""The target's own GGUF blocks (models/gguf_blocks.py; the kernel's q4_1 and q8_0 storages): they dequantise to
exactly the prepared float32 folder's weights; streamed by the kernel they compute the float32 format's function bit
for bit, for any row count, row position, thread count and CPU variant (the AVX2 one forced on an AVX-512 machine);
the int8 format (int8 activations against the same blocks) is one function for every row count, thread count and
variant (VNNI and the AVX2 fallback give the same bits) and agrees with the real product within its rounding;
blocks that do not fit are refused and the map stays float32; the kernel's threads change no bit and sleep when idle;
and an engine on a quantised GGUF's prepared folder streams its blocks with every decoder equal to AR, in both."""
from __future__ import annotations

import os
import random
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.kernels import native
from testing.variants import DEFAULT_TIER, variant_params
from mirror_core.models.gguf_blocks import BlockWeights, read_blocks
from mirror_core.models.loading import ModelSpec, load_model
from mirror_core.models.prepared import RegistryModel, _write_marker, convert_gguf, find_gguf
from mirror_core.runners import set_kernel_threads
from mirror_core.runners.fast import FastLlamaRunner
from mirror_core.runners.protocol import KernelChoice
from testing.toy_gguf import write_tiny_gguf

needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A prepared folder made from a quantised tiny GGUF (Q4_1 layers, a Q8_0 tied embedding), the GGUF kept beside."""
    root = tmp_path_factory.mktemp("quantised")
    gguf = str(root / "tiny.Q4_1.gguf")
    write_tiny_gguf(gguf, quantised=True)
    out = str(root / "folder")
    convert_gguf(gguf, out)
    shutil.copy(gguf, os.path.join(out, "tiny.Q4_1.gguf"))
    _write_marker(out, RegistryModel("tiny-q", "toy-llm", "1.0", "0" * 64, "tiny.Q4_1.gguf", "MIT", "none"),
                  "tiny.Q4_1.gguf")
    return out


@pytest.fixture(autouse=True)
def one_kernel_thread():
    yield
    set_kernel_threads(1)


def _random_blocks(kind: str, n: int, k: int, gen: torch.Generator) -> BlockWeights:
    d = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half()
    if kind == "q8_0":
        return BlockWeights(kind, d, torch.randint(-128, 128, (n, k // 32, 32), generator=gen).to(torch.int8))
    m = (-torch.rand(n, k // 32, generator=gen) * 0.1).half()
    return BlockWeights(kind, d, torch.randint(0, 16, (n, k // 32, 32), generator=gen, dtype=torch.uint8), m)


def test_blocks_dequantise_to_the_prepared_weights_bit_for_bit(folder):
    config = load_model(ModelSpec(folder, "cpu")).config
    blocks = read_blocks(find_gguf(folder), config)
    weights = load_file(os.path.join(folder, "model.safetensors"))
    maps = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    want = {f"model.layers.{i}.{'self_attn' if m.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{m}.weight"
            for i in range(config.num_hidden_layers) for m in maps} | {"model.embed_tokens.weight", "lm_head.weight"}
    assert set(blocks) == want
    for name, b in blocks.items():
        source = weights.get(name, weights["model.embed_tokens.weight"])  # the LM head is tied to the embedding
        assert torch.equal(b.dequantize().view(torch.int32), source.view(torch.int32)), name
    assert {b.kind for b in blocks.values()} == {"q4_1", "q8_0"}


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_block_storage_computes_the_float32_function(variant, kind):
    """Random blocks and shapes; every M in 1..16 at a random position and 1..3 threads against the float32 pack of the
    dequantised weights (itself one chain per output: test_kernels.py)."""
    lib = native.library(variant)
    rng = random.Random(f"{variant}{kind}")
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for k, n in ((32, 1), (64, 33), (576, 100), (96, 257)):
        b = _random_blocks(kind, n, k, gen)
        w = b.dequantize().t().contiguous()                                               # [K, N]
        x = torch.randn(16, k, generator=gen)
        reference = native.PackedLinear(w, "float32", lib)(x)                             # [16, N]
        packed = native.PackedLinear(w, "float32", lib, blocks=b)
        assert packed.storage == kind and packed.nbytes < native.PackedLinear(w, "float32", lib).nbytes
        for threads in (1, 3):
            lib.set_threads(threads)
            for m in (1, 2, 3, 5, 8, 9, 16):
                start = rng.randrange(0, 17 - m)
                assert torch.equal(packed(x[start:start + m]), reference[start:start + m]), (k, n, m, threads)
        lib.set_threads(1)
        assert torch.allclose(reference, x @ w, rtol=1e-4, atol=1e-4 * k ** 0.5)


def _int8_reference(b: BlockWeights, x: torch.Tensor) -> torch.Tensor:
    """The int8 format's function in float64: each row rounded alone to int8 per block of 32 (dx = max|x| / 127),
    exact integer block sums, then Σ_blocks d·dx·sum (+ m·dx·Σqx for q4_1)."""
    xb = x.view(x.shape[0], -1, 32)                                                       # [M, K/32, 32]
    dx = xb.abs().amax(-1) / 127                                                          # [M, K/32]
    qx = torch.round(xb * torch.where(dx > 0, 1 / dx, torch.zeros_like(dx)).unsqueeze(-1)).clamp(-127, 127)
    sums = torch.einsum("mbi,nbi->mnb", qx.double(), b.q.double())                        # [M, N, K/32]
    y = (b.d.double().unsqueeze(0) * dx.double().unsqueeze(1) * sums).sum(-1)             # [M, N]
    if b.m is not None:
        y = y + (b.m.double().unsqueeze(0) * (dx.double() * qx.double().sum(-1)).unsqueeze(1)).sum(-1)
    return y


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_the_int8_format_is_one_function_on_every_variant(kind):
    gen = torch.Generator().manual_seed(11)
    b = _random_blocks(kind, 257, 576, gen)
    w = b.dequantize().t().contiguous()
    x = torch.randn(16, 576, generator=gen)
    first = None
    for variant in DEFAULT_TIER:  # the best path here and the AVX2 one: the same bits
        lib = native.library(variant)
        packed = native.PackedLinear(w, "int8", lib, blocks=b)
        alone = torch.cat([packed(x[r:r + 1]) for r in range(16)])                       # [16, N]
        for amx_rows in ((0, 1, 16) if variant == "amx" else (None,)):  # AMX tiles for every call / none / 16+ rows
            if amx_rows is not None:
                lib.set_amx_rows(amx_rows)
            for threads in (1, 2):
                lib.set_threads(threads)
                for m in (1, 2, 5, 8, 16):
                    assert torch.equal(packed(x[16 - m:]), alone[16 - m:]), (variant, amx_rows, threads, m)
        lib.set_threads(1)
        first = alone if first is None else first
        assert torch.equal(alone, first), variant  # VNNI's dpbusd and AVX2's maddubs: the same exact sums
        ref = _int8_reference(b, x)
        assert torch.allclose(alone.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    exact = x.double() @ w.double()
    assert (first.double() - exact).abs().max() < 0.02 * exact.abs().max()  # int8 activations: ~0.5 % here
    with pytest.raises(ValueError, match="int8 format runs on GGUF blocks only"):
        native.PackedLinear(w, "int8", native.library())


@needs_kernel
@pytest.mark.parametrize("variant", variant_params())
@pytest.mark.parametrize("fmt", tuple(native.FORMATS))
def test_the_kernel_threads_change_no_bit(variant, fmt):
    lib = native.library(variant)
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(576, 1000, generator=gen) / 24
    x = torch.randn(9, 576, generator=gen)
    packed = native.PackedLinear(w, fmt, lib)
    alone = packed(x)
    for threads in (2, 3, 5):
        lib.set_threads(threads)
        assert lib.threads == threads
        for m in (1, 4, 9):
            assert torch.equal(packed(x[:m]), alone[:m]), (threads, m)
    lib.set_threads(1)


@needs_kernel
def test_idle_kernel_threads_sleep():
    """The pool's workers spin for a moment after a call, then sleep: an idle app costs no core."""
    lib = native.library()
    lib.set_threads(2)
    packed = native.PackedLinear(torch.randn(576, 2048), "float32", lib)
    packed(torch.randn(1, 576))
    time.sleep(0.2)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(0.5)
    used = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    lib.set_threads(1)
    assert used < 0.05, f"idle kernel threads used {used:.1%} of a core"


@needs_kernel
def test_blocks_that_do_not_fit_are_refused(folder):
    lib = native.library()
    gen = torch.Generator().manual_seed(1)
    b = _random_blocks("q4_1", 40, 64, gen)
    w = b.dequantize().t().contiguous()
    with pytest.raises(ValueError, match="do not dequantise to this weight bit for bit"):
        native.PackedLinear(w + 1e-3, "float32", lib, blocks=b)
    with pytest.raises(ValueError, match="cannot be packed as bfloat16"):
        native.PackedLinear(w, "bfloat16", lib, blocks=b)
    with pytest.raises(ValueError, match="blocks of shape"):
        native.PackedLinear(w[:, :20], "float32", lib, blocks=b)
    with pytest.raises(ValueError, match="0..15"):
        native.PackedLinear(w, "float32", lib, blocks=BlockWeights("q4_1", b.d, b.q + 16, b.m))
    with pytest.raises(ValueError, match="q4_1 or q8_0"):
        native.PackedLinear(w, "float32", lib, blocks=type("Q5", (), {"kind": "q5_0", "d": b.d, "q": b.q})())
    # a runner given a map's blocks that do not match keeps that map in float32, says so, and is unchanged
    model = load_model(ModelSpec(folder, "cpu"))
    blocks = read_blocks(find_gguf(folder), model.config)
    name = "model.layers.1.mlp.down_proj.weight"
    blocks[name] = BlockWeights("q4_1", blocks[name].d * 2, blocks[name].q, blocks[name].m)
    runner = FastLlamaRunner(model, kernel=KernelChoice(lib), blocks=blocks)
    plain = FastLlamaRunner(model, kernel=KernelChoice(lib))
    assert "(1, 'down')" in runner.block_note and runner.layers[1].w_down.storage == "float32"
    assert runner.layers[0].w_down.storage == "q4_1" and runner.weight_stream.storage == "float32 as float32+q4_1+q8_0"
    ids = [1, 5, 9, 40, 70, 200]
    assert torch.equal(runner.forward(runner.new_cache(), ids), plain.forward(plain.new_cache(), ids))


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_an_engine_on_a_quantised_gguf_streams_its_blocks_and_every_decoder_equals_ar(folder, dtype):
    with MirrorEngine.load(folder, folder, LaneConfig(kind="inline", dtype=dtype, target_threads=2)) as engine:
        runner = engine.target
        stream = runner.weight_stream
        assert stream.storage == ("float32 as q4_1+q8_0" if dtype == "float32" else "int8 on q4_1+q8_0")
        assert engine.info.roofline.weight_bytes == stream.nbytes
        model = load_model(ModelSpec(folder, "cpu"))
        plain = FastLlamaRunner(model, kernel=KernelChoice(native.library()))
        ids = engine.encode("the cat sat on")
        same = torch.equal(runner.forward(runner.new_cache(), list(ids)), plain.forward(plain.new_cache(), list(ids)))
        assert same == (dtype == "float32")  # float32 on blocks is the folder's function; int8 is another
        ar = engine.generate(Request(ids, "ar", 24))
        assert ar.error is None and ar.token_ids
        for decoder, spec in (("sd", SpecConfig(3)), ("mirror", SpecConfig(3, 2)), ("mirror", SpecConfig(2, 1, 1))):
            end = engine.generate(Request(ids, decoder, 24, spec=spec))
            assert end.error is None and end.token_ids == ar.token_ids, (decoder, spec)


@needs_kernel
def test_int8_without_blocks_is_a_clear_error(pairs):
    """--dtype int8 needs the target's own GGUF blocks; a plain safetensors folder says so before it runs."""
    from mirror_core.config import MirrorError

    with pytest.raises(MirrorError, match="--dtype int8 runs a GGUF target's own blocks"):
        MirrorEngine.load(pairs["llama"][0], None, LaneConfig(kind="inline", dtype="int8"))


def test_a_folder_whose_gguf_does_not_fit_its_config_is_one_clear_error(tmp_path):
    """A folder's own GGUF (the toy target's kind) of another model, or not a GGUF at all: one line, nothing loaded."""
    from mirror_core.config import MirrorError
    from mirror_core.models.pairs import TOY_TARGET

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOY_TARGET, name), tmp_path / name)
    write_tiny_gguf(str(tmp_path / "model.gguf"), quantised=True)
    for contents in (None, b"GGUF, but not really"):
        if contents is not None:
            (tmp_path / "model.gguf").write_bytes(contents)
        with pytest.raises(MirrorError, match="as the Llama model its config.json describes"):
            load_model(ModelSpec(str(tmp_path), "cpu"))


def test_the_tensor_index_is_kept_and_refreshed_when_the_file_changes(folder, monkeypatch):
    """gguf's reader parses every metadata field (seconds for a 49k vocabulary); the index beside the file spares
    the next load that, and a file of another size or time is parsed again."""
    import gguf

    from mirror_core.models.gguf_blocks import tensor_index

    path = find_gguf(folder)
    first = tensor_index(path)
    assert os.path.isfile(path + ".index.json") and any(t["type"] == "Q4_1" for t in first)

    def no_reader(*a, **k):
        raise AssertionError("the index should have been used")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    assert tensor_index(path) == first
    os.utime(path, ns=(1, 1))
    with pytest.raises(AssertionError, match="index should have been used"):
        tensor_index(path)
