"""The default pair on its real target: SmolLM2-135M-Instruct, prepared from its PyPI package, with the distilled
draft and trained exit head in assets/smollm2_pair. Every decoder emits exactly `ar`'s greedy tokens.

Needs the prepared target (a package index, once); skipped without one, except under CI (`CI` set, as .ci/run
does after `python -m mirror_core prepare`), where a missing target is a failure."""
from __future__ import annotations

import os

import pytest

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import MirrorError
from mirror_core.models.pairs import REAL_DRAFT, REAL_TARGET

pytestmark = pytest.mark.slow  # the real default pair (SmolLM2-135M) loads for about a minute (the slow tier)

PROMPTS = ("What is the capital of France?", "Write a Python function that reverses a string.")


@pytest.fixture(scope="module")
def engine():
    from mirror_core.models.prepared import resolve_source

    if not os.path.isdir(REAL_DRAFT):
        pytest.fail(f"the distilled draft is missing from {REAL_DRAFT}")
    try:
        resolve_source(REAL_TARGET)
    except MirrorError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot prepare {REAL_TARGET}: {exc}")
    with MirrorEngine.load(REAL_TARGET, REAL_DRAFT, LaneConfig(kind="inline")) as e:
        yield e


def test_every_decoder_equals_ar_on_the_real_pair(engine):
    assert engine.info.exit_head is not None and engine.info.draft_vocab  # the shipped head and reduced draft
    for i, text in enumerate(PROMPTS):
        ids = engine.encode(text)
        ar = engine.generate(Request(ids, "ar", 24))
        assert ar.error is None and len(ar.token_ids) > 0
        for decoder, spec in (("sd", SpecConfig(4)), ("mirror", SpecConfig(4, 2)), ("mirror", SpecConfig(3, 1, 12))):
            end = engine.generate(Request(ids, decoder, 24, spec=spec))
            assert end.error is None and end.fallback is None
            assert end.token_ids == ar.token_ids, (text, decoder, spec)


def test_im_end_stops_a_chat_answer(engine):
    end = engine.generate(Request(engine.encode("Say only the word yes."), "mirror", 64))
    assert end.token_ids and end.token_ids[-1] in engine.eos_ids and len(end.token_ids) < 64
    assert engine.tokenizer.decode([end.token_ids[-1]]) == "<|im_end|>"
