"""The shipped toy pair (assets/default_pair): loads offline, fits the size budget, its Q8_0 target loads as the
blocks the kernel streams, decodes losslessly."""
import glob
import json
import os

import pytest
import torch
from safetensors import safe_open

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import AUTO_BRANCH_BUDGET
from mirror_core.kernels import native
from mirror_core.models.gguf_blocks import own_gguf, read_blocks, tensor_index
from mirror_core.models.loading import ModelSpec, load_model
from mirror_core.models.prepared import file_sha256
from testing.toy_models import hf_greedy

PAIR = os.path.join(os.path.dirname(__file__), "..", "assets", "default_pair")
TARGET, DRAFT_AR, DRAFT_SS = (os.path.join(PAIR, n) for n in ("target", "draft_ar", "draft_ss"))
PROMPTS = ("def fibonacci(n):\n", "The with statement is used to")


def test_the_drafts_are_fp16_safetensors_and_the_target_a_q8_0_gguf_within_48_mb():
    files = glob.glob(os.path.join(PAIR, "**", "*"), recursive=True)
    shipped = [f for f in files if os.path.isfile(f) and not f.endswith(".index.json")]  # the index: made on load
    assert sum(os.path.getsize(f) for f in shipped) <= 48_000_000  # the budget the toy pair's shapes were chosen for (training/toy_pair/build.py)
    for name in ("draft_ar", "draft_ss"):
        with safe_open(os.path.join(PAIR, name, "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert not glob.glob(os.path.join(PAIR, "*", "*.bin")) and not glob.glob(os.path.join(TARGET, "*.safetensors"))
    kinds = {t["name"]: t["type"] for t in tensor_index(own_gguf(TARGET))}
    assert {k for n, k in kinds.items() if n.endswith("norm.weight")} == {"F32"}
    assert {k for n, k in kinds.items() if not n.endswith("norm.weight")} == {"Q8_0"} and "token_embd.weight" in kinds


def test_the_target_loads_as_the_blocks_the_kernel_streams_dequantised():
    """Every weight of the loaded target is bit for bit what transformers' own GGUF loader reads from the file (the
    llama.cpp layout: names and query/key rows), and every linear map and the tied LM head are the GGUF's Q8_0
    blocks dequantised: so the kernel streams them all, in the float32 format's function."""
    from transformers import AutoModelForCausalLM

    model = load_model(ModelSpec(TARGET))
    theirs = AutoModelForCausalLM.from_pretrained(TARGET, gguf_file="model.gguf", dtype=torch.float32).state_dict()
    ours = model.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[n].view(torch.int32), theirs[n].view(torch.int32))
                                           for n in ours)
    blocks = read_blocks(own_gguf(TARGET), model.config)
    assert len(blocks) == 7 * model.config.num_hidden_layers + 2 and {b.kind for b in blocks.values()} == {"q8_0"}
    for name, b in blocks.items():
        assert torch.equal(b.dequantize().view(torch.int32), ours[name].view(torch.int32)), name


@pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")
def test_an_engine_streams_the_targets_q8_0_blocks_and_every_decoder_equals_ar():
    lanes = LaneConfig(dtype="float32", kind="inline", target_threads=1)
    with MirrorEngine.load(TARGET, DRAFT_AR, lanes) as engine:
        assert engine.target.weight_stream.storage == "float32 as q8_0" and engine.target.block_note == ""
        prompt = tuple(engine.tokenizer.encode(PROMPTS[0]))
        ar = engine.generate(Request(prompt, "ar", 16))
        assert ar.error is None and len(ar.token_ids) == 16
        for decoder in ("sd", "mirror"):
            assert engine.generate(Request(prompt, decoder, 16, spec=SpecConfig(4, 2))).token_ids == ar.token_ids


def test_model_card_reports_the_engine_measured_quality():
    with open(os.path.join(PAIR, "model_card.json"), encoding="utf-8") as f:
        card = json.load(f)
    for key in ("draft_ar/mirror", "draft_ss/mirror"):
        assert card["speculation"][key]["output_equals_ar"] is True
        assert card["speculation"][key]["runs_that_fell_back_to_the_target"] == 0
    # the card was measured on the file that ships, and says how that file was made from the float16 one
    made = card["target_gguf"]
    assert made["sha256"] == file_sha256(own_gguf(TARGET)) and "git commit" in made["source"]
    assert card["sizes"]["target"]["format"] == "GGUF Q8_0+F32"


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
