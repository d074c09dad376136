"""The shipped default pair (assets/default_pair): loads offline, fits the size budget, decodes losslessly."""
import glob
import json
import os

import pytest
import torch
from safetensors import safe_open

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import AUTO_BRANCH_BUDGET
from testing.toy_models import hf_greedy

PAIR = os.path.join(os.path.dirname(__file__), "..", "assets", "default_pair")
TARGET, DRAFT_AR, DRAFT_SS = (os.path.join(PAIR, n) for n in ("target", "draft_ar", "draft_ss"))
PROMPTS = ("def fibonacci(n):\n", "The with statement is used to")


def test_weights_are_fp16_safetensors_within_48_mb():
    files = glob.glob(os.path.join(PAIR, "**", "*"), recursive=True)
    assert sum(os.path.getsize(f) for f in files if os.path.isfile(f)) <= 48_000_000  # the budget the toy pair's shapes were chosen for (training/toy_pair/build.py)
    for name in ("target", "draft_ar", "draft_ss"):
        with safe_open(os.path.join(PAIR, name, "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
        assert not glob.glob(os.path.join(PAIR, name, "*.bin"))


def test_model_card_reports_the_engine_measured_quality():
    with open(os.path.join(PAIR, "model_card.json"), encoding="utf-8") as f:
        card = json.load(f)
    for key in ("draft_ar/mirror", "draft_ss/mirror"):
        assert card["speculation"][key]["output_equals_ar"] is True
        assert card["speculation"][key]["runs_that_fell_back_to_the_target"] == 0


@pytest.mark.slow  # the toy architectures' equality is in the default tier (test_equivalence.py)
@pytest.mark.parametrize("draft", [DRAFT_AR, DRAFT_SS])
def test_every_decoder_equals_transformers_greedy_on_the_shipped_pair(draft, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with MirrorEngine.load(TARGET, draft, LaneConfig(dtype="float32", kind="inline")) as engine:
        for i, text in enumerate(PROMPTS):
            prompt = tuple(engine.tokenizer.encode(text))
            ref = hf_greedy(TARGET, prompt, 24)
            for decoder, budget in (("ar", 0), ("sd", 0), ("mirror", 0), ("mirror", 5), ("mirror", AUTO_BRANCH_BUDGET)):
                spec = SpecConfig(gamma=3 + i, kappa=4, branch_budget=budget)
                end = engine.generate(Request(prompt, decoder, 24, spec=spec))
                assert end.error is None and end.fallback is None
                assert list(end.token_ids) == ref, (draft, decoder, budget, text)


def test_shipped_ss_draft_multi_token_steps_equal_one_token_decoding():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.toy_pair.evaluate import ss_greedy_generate
    from testing.toy_models import main_greedy_generate

    model = AutoModelForCausalLM.from_pretrained(DRAFT_SS, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(DRAFT_SS)
    for text in PROMPTS:
        ids = tok.encode(text)
        tokens, per_forward = ss_greedy_generate(model, ids, 40)
        assert tokens == main_greedy_generate(model, ids, 40)
        assert max(per_forward) > 1  # the streams do produce several tokens per forward somewhere
