"""The fast Llama-family runner matches the Hugging Face forward: logits, exit readout, branch rows."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.lanes import pinned
from mirror_core.runners.fast import FastLlamaRunner
from mirror_core.runners.hf import HFRunner
from testing.toy_models import hf_greedy, prompts

ATOL = 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_fast_runner_matches_hf_logits(pairs, arch):
    model = AutoModelForCausalLM.from_pretrained(pairs[arch][0]).eval()
    fast, hf = FastLlamaRunner(model, capacity=8), HFRunner(model)   # capacity 8: the cache must grow
    ids = torch.randint(0, 96, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    cf, ch = fast.new_cache(), hf.new_cache()
    pairs_out = [(fast.forward(cf, ids[:12]), hf.forward(ch, ids[:12])),        # prefill
                 (fast.forward(cf, ids[12:17]), hf.forward(ch, ids[12:17]))]    # a window
    fast.truncate(cf, 14)
    hf.truncate(ch, 14)
    pairs_out.append((fast.forward(cf, ids[17:18]), hf.forward(ch, ids[17:18])))  # after a rejection
    pairs_out.append((fast.forward_to_exit(fast.new_cache(), ids[:6], 2).h,      # h^(ℓ_e) [6, H]
                      hf.forward_to_exit(hf.new_cache(), ids[:6], 2).h))
    bf, bh = fast.fork(cf, [10, 12, 15]), hf.fork(ch, [10, 12, 15])
    for step in range(20):  # grows the rows' own buffers past their initial 16 entries
        tok = torch.tensor([[step % 96], [(step * 7) % 96], [(step * 3) % 96]])
        pairs_out.append((fast.forward_rows(bf, tok)[0], hf.forward_rows(bh, tok)[0]))
    sf, sh = fast.select_row(bf, 1), hf.select_row(bh, 1)
    assert fast.cache_len(sf) == hf.cache_len(sh) == 12 + 20
    pairs_out.append((fast.forward(sf, [5]), hf.forward(sh, [5])))
    for a, b in pairs_out:
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("runner,arch", [("fast", a) for a in ("llama", "qwen2", "qwen3", "mistral")]
                         + [("hf", a) for a in ("llama", "qwen2", "qwen3", "mistral", "gpt2", "qwen2-sliding")])
def test_a_pass_split_at_the_exit_equals_the_whole_forward(pairs, runner, arch):
    """forward_to_exit then finish_pass is forward, bitwise: the same logits, the same cache afterwards, and h^(ℓ_e)
    the exit layer's output. qwen2-sliding has full-attention layers 1-2 and sliding ones above: an exit at 1 cannot
    know the sliding layers' mask before it stops, so that pass runs whole (same result); an exit at 3 has seen both."""
    if arch == "qwen2-sliding":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                             num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                             sliding_window=256, max_window_layers=2)).eval()
        assert len(set(model.config.layer_types)) == 2
    else:
        model = AutoModelForCausalLM.from_pretrained(pairs[arch][0]).eval()
    make = (lambda: FastLlamaRunner(model, capacity=8)) if runner == "fast" else (lambda: HFRunner(model))
    whole, split = make(), make()
    ids = torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    for layer in (1, 3):
        cw, cs = whole.new_cache(), split.new_cache()
        for lo, hi in ((0, 12), (12, 17), (17, 18)):                                    # prefill, window, one token
            want = whole.forward(cw, ids[lo:hi])
            at_exit = split.forward_to_exit(cs, ids[lo:hi], layer)
            assert at_exit.h.shape == (hi - lo, model.config.hidden_size) and at_exit.h.dtype == torch.float32
            got = split.finish_pass(at_exit)
            assert torch.equal(got, want), (runner, arch, layer, lo)
            assert split.cache_len(cs) == whole.cache_len(cw) == hi
        with torch.no_grad():
            out = model(torch.tensor([ids[:12]]), output_hidden_states=True)
        h = split.forward_to_exit(split.new_cache(), ids[:12], layer).h
        torch.testing.assert_close(h, out.hidden_states[layer][0].float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_fast_runner_decoders_match_hf_generate(pairs, arch):
    target, draft = pairs[arch]
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind="inline", runner="fast")) as engine:
        assert isinstance(engine.target, FastLlamaRunner)
        for i, prompt in enumerate(prompts(4, seed=13)):
            ref = hf_greedy(target, prompt, 24)
            for decoder in ("ar", "sd", "mirror"):
                end = engine.generate(Request(prompt, decoder, 24, spec=SpecConfig(1 + 2 * i, 1 + i, 1 + i % 3)))
                assert list(end.token_ids) == ref


def test_fast_runner_refuses_other_architectures(pairs):
    from mirror_core import MirrorError

    with pytest.raises(MirrorError, match="fast runner supports"):
        MirrorEngine.load(*pairs["gpt2"], LaneConfig(dtype="float32", kind="inline", runner="fast"))


TARGETS = ["llama", "qwen2", "qwen3", "mistral", "shipped"]


@pytest.mark.parametrize("arch", TARGETS)
def test_a_positions_logits_do_not_depend_on_how_many_rows_share_the_call(pairs, arch):
    """Lossless needs the target to be one function: AR computes each token in a one-row call, SD and Mirror-SD
    inside windows. After the engine's load-time check, a position's logits are bit-identical alone and inside
    windows of 2..16, with the earlier slots' keys and values from either path (runners/exactness.py: check_rows)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.path.join(root, "assets", "default_pair", "target") if arch == "shipped" else pairs[arch][0]
    lanes = LaneConfig(dtype="float32", kind="inline", runner="fast", target_threads=1)
    with MirrorEngine.load(target, None, lanes) as engine:
        runner, rows = engine.target, engine.info.target_rows
        assert rows.checked and rows.invariant and runner.row_plan == rows.plan
        assert (rows.plan is None) == (rows.differing == 0)  # a plan only where the logits needed one here
        prefix = [(5 * i + 1) % 90 for i in range(56)]  # the window crosses a key bucket (runners/fast.py)
        window = [(3 * i + 2) % 90 for i in range(16)]
        with pinned((), 1):  # the target lane's threads: the plan holds for the kernels it was measured with
            _check_positions(runner, engine.info.num_layers, prefix, window, arch)


def _check_positions(runner, num_layers, prefix, window, arch):
    """Each slot of the window: its logits alone (AR's path) equal its logits in every longer window, bitwise."""
    cache = runner.new_cache()
    runner.forward(cache, prefix)
    for at in (0, 3, 9):  # the first and later slots of the window (9: past the bucket boundary)
        alone_cache = runner.new_cache()  # AR's path: the prompt in one call, then one token per call
        runner.forward(alone_cache, prefix)
        for token in window[:at]:
            runner.forward(alone_cache, [token])
        at_exit = runner.forward_to_exit(alone_cache, window[at: at + 1], num_layers // 2)
        alone = runner.finish_pass(at_exit)
        assert alone.shape[0] == 1 and at_exit.h.shape[0] == 1                  # padded rows never leave
        assert runner.cache_len(alone_cache) == len(prefix) + at + 1            # nor stay in the cache
        for rows_in_call in range(at + 1, 17):
            logits = runner.forward(cache, window[:rows_in_call])
            runner.truncate(cache, len(prefix))
            assert torch.equal(logits[at], alone[0]), (arch, at, rows_in_call)
