"""The engine with a speculative-streaming draft: lossless, and several draft tokens per forward."""
from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from mirror_core import LaneConfig, MirrorEngine, Request, SamplingConfig, SpecConfig
from mirror_core.config import SamplingConfig as SC
from mirror_core.draft_choice import ChoicePlan
from mirror_core.draft_worker import DraftWorker
from mirror_core.messages import BranchRequest, DraftStart, ResolveRequest
from mirror_core.models.ss_draft import ss_draft_from_llama
from mirror_core.runners.fast_ss import FastSSRunner
from mirror_core.runners.ss_reference import SSRunner
from testing.toy_models import build_pair, hf_greedy, main_greedy_generate, prompts


@pytest.fixture(scope="module")
def ss_pair(pair_root):
    target, _ = build_pair(pair_root, "llama", target_layers=4, seed=5)
    llama = AutoModelForCausalLM.from_pretrained(target)
    ss = ss_draft_from_llama(llama, num_layers=2, num_msa_layers=1, num_streams=2,
                             generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # streams that agree with the main stream only sometimes (η̄ ≈ 1.9 of at most 3):
        ss.stream_embed.mul_(35.0)  # both accepted and rejected lookahead tokens are exercised
    path = os.path.join(pair_root, "ss_draft_s5")
    ss.save_pretrained(path)
    return target, path


@pytest.mark.parametrize("kind,runner", [("inline", "auto"), pytest.param("process", "auto", marks=pytest.mark.slow),
                                         ("inline", "hf")])
def test_ss_draft_is_lossless_for_every_decoder(ss_pair, kind, runner):
    """auto: the lean FastSSRunner; hf: the SS model's own forward (SSRunner)."""
    target, draft = ss_pair
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind=kind, runner=runner)) as engine:
        for i, prompt in enumerate(prompts(4, seed=21)):
            ref = hf_greedy(target, prompt, 24)
            for decoder, zero_windows in (("ar", True), ("sd", False), ("mirror", True), ("mirror", False)):
                spec = SpecConfig(gamma=2 + 2 * i, kappa=1 + i, exit_layer=1 + i % 3, zero_windows=zero_windows)
                end = engine.generate(Request(prompt, decoder, 24, spec=spec))
                assert list(end.token_ids) == ref, (decoder, prompt, spec)
                assert end.fallback is None, end.fallback
                if not zero_windows:  # η̄ of γ-token rollouts: several tokens per SS pass, some lookahead rejected
                    assert 1.0 < end.summary.draft_tokens_per_forward < 3.0


def test_ss_draft_with_rule_e_reproduces_ar(ss_pair):
    target, draft = ss_pair
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind="inline")) as engine:
        for seed in (1, 2, 3):
            cfg = SamplingConfig(temperature=0.9, top_k=30, seed=seed)
            ar = engine.generate(Request((4, 4, 9), "ar", 24, sampling=cfg)).token_ids
            for decoder in ("sd", "mirror"):
                end = engine.generate(Request((4, 4, 9), decoder, 24, sampling=cfg, spec=SpecConfig(5, 2, 2)))
                assert end.token_ids == ar and end.fallback is None


@pytest.mark.parametrize("runner_class", [FastSSRunner, SSRunner])
def test_ss_rollouts_equal_one_token_at_a_time_decoding(ss_pair, runner_class):
    """The worker's multi-token fresh rollout and every branch row equal plain main-stream greedy."""
    _, draft = ss_pair
    model = AutoModelForCausalLM.from_pretrained(draft).eval()
    worker = DraftWorker(runner_class(model))
    prompt, gamma = (3, 1, 4, 1, 5), 7
    worker.handle(DraftStart(prompt, gamma, SC(), ChoicePlan(False, 64, ())))  # raw speculation: γ every step
    first = worker.handle(ResolveRequest(0, 0, 9, hit=False))
    assert list(first.tokens) == main_greedy_generate(model, list(prompt) + [9], gamma)
    candidates = ((10, 11), (12,), (13, 14), (15,), (16,), (17,), (18,), (19, 20))
    worker.handle(BranchRequest(1, candidates))
    reply = worker.handle(ResolveRequest(1, 2, 13, hit=True))  # A_t = 2, c = 13: a hit on slot 3
    assert reply.branch_row == [(j, v) for j, c in enumerate(candidates) for v in c].index((2, 13))
    rows = [(j, v) for j, c in enumerate(candidates) for v in c]
    window = [9, *first.tokens]
    for (j, v), branch in zip(rows, reply.branches):
        prefix = list(prompt) + window[: j + 1] + [v]
        assert list(branch) == main_greedy_generate(model, prefix, gamma), (j, v)
    assert list(reply.tokens) == list(reply.branches[rows.index((2, 13))])
    # After adopting the branch the cache is consistent: the next rollout continues correctly.
    nxt = worker.handle(ResolveRequest(2, 0, 21, hit=False))
    committed = list(prompt) + window[:3] + [13] + [21]
    assert list(nxt.tokens) == main_greedy_generate(model, committed, gamma)
