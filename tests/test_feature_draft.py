"""The feature-reading draft (models/feature_draft.py): every decoder still emits the target's greedy tokens when the
draft reads the target's exit-layer hidden states, on every lane kind; its training-time-test maths equals its
runner's step-by-step rollout; and a bad pairing is refused with a clear error."""
from __future__ import annotations

import os

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import MirrorError, SamplingConfig
from mirror_core.models.feature_draft import load_feature_draft, train_step_outputs
from mirror_core.models.vocab import load_vocab_map
from mirror_core.runners.feature import FeatureRunner
from mirror_core.runners.protocol import Runner
from testing.toy_models import VOCAB, build_pair, feature_draft, hf_greedy, prompts

N_NEW = 24
SUBSET = list(range(0, VOCAB, 2)) + list(range(1, VOCAB, 4))  # 72 of 96 target ids


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("feature"))
    target, _ = build_pair(root, "llama", target_layers=4)
    return target, feature_draft(target, os.path.join(root, "fdraft"), layer=2, ids=SUBSET)


@pytest.fixture(scope="module")
def inline(pair):
    target, draft = pair
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        yield engine


def _run(engine, prompt, decoder, gamma=4, kappa=2, temperature=0.0, seed=0):
    end = engine.generate(Request(prompt_ids=prompt, decoder=decoder, max_new_tokens=N_NEW,
                                  spec=SpecConfig(gamma=gamma, kappa=kappa),
                                  sampling=SamplingConfig(temperature=temperature, seed=seed)))
    assert end.error is None and end.fallback is None, (end.error, end.fallback)
    return end


def test_every_decoder_equals_the_targets_greedy_tokens(pair, inline):
    target, _ = pair
    accepted = hits = 0
    for i, prompt in enumerate(prompts(6, seed=5)):
        want = hf_greedy(target, prompt, N_NEW)
        for decoder in ("ar", "sd", "mirror"):
            for gamma, kappa in ((4, 2), (2, 1), (5, 3)):
                end = _run(inline, prompt, decoder, gamma, kappa)
                assert list(end.token_ids) == want, (i, decoder, gamma, kappa)
                if decoder == "mirror":
                    accepted += end.summary.accepted
                    hits += end.summary.hits
    assert inline.info.draft_features == 2 and inline.info.describe()["draft"]["reads_features_of_layer"] == 2
    assert accepted > 0 and hits > 0  # the branch prefix, adoption and fallback paths all ran


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_parallel_lanes_equal_the_inline_lane(pair, inline, kind):
    target, draft = pair
    with MirrorEngine.load(target, draft, LaneConfig(kind=kind, dtype="float32")) as engine:
        for prompt in prompts(3, seed=8):
            for decoder in ("sd", "mirror"):
                assert list(_run(engine, prompt, decoder).token_ids) == list(_run(inline, prompt, decoder).token_ids)


def test_sampling_is_reproducible_and_runs_every_rule(pair, inline):
    for prompt in prompts(2, seed=9):
        for decoder in ("sd", "mirror"):
            a = _run(inline, prompt, decoder, temperature=0.8, seed=3)
            b = _run(inline, prompt, decoder, temperature=0.8, seed=3)
            assert list(a.token_ids) == list(b.token_ids) and len(a.token_ids) == N_NEW


def test_the_feature_runner_declares_what_it_can_do(pair):
    """It reads the target's features, takes no row plan and reads nothing out at ℓ_e; without the kernel a format
    moves the whole draft, one format for every shape."""
    _, draft = pair
    runner = FeatureRunner(load_feature_draft(draft), load_vocab_map(draft))
    assert isinstance(runner, Runner) and runner.reads_features and not runner.plans_rows and runner.exit_head is None
    assert runner.kernel.library is None and runner.formats.whole_model and runner.weight_stream is None
    with pytest.raises(ValueError, match="one format"):
        runner.set_dtypes(torch.float32, torch.bfloat16)


def test_training_time_test_equals_the_runners_rollout(pair):
    """Depth d of train_step_outputs is what the runner computes after d−1 tokens on its own predicted features."""
    _, draft = pair
    model = load_feature_draft(draft)
    runner = FeatureRunner(model, load_vocab_map(draft))
    g = torch.Generator().manual_seed(0)
    t, h = 9, model.cfg.hidden_size
    ids = torch.tensor(SUBSET)[torch.randint(len(SUBSET), (1, t), generator=g)]          # target ids [1, T]
    feats = torch.randn(1, t, h, generator=g)
    with torch.no_grad():
        outs = train_step_outputs(model, runner._draft_ids(ids), feats, 3)
    p = 4  # position whose depth-1..3 rollout we follow
    cache = runner.new_cache()
    _, g1 = runner.forward(cache, ids[0, : p + 1].tolist(), feats[0, : p + 1])            # true entries 0..p
    _, g2 = runner.forward(cache, [int(ids[0, p + 1])], g1[-1:])
    _, g3 = runner.forward(cache, [int(ids[0, p + 2])], g2)
    for want, got in ((outs[0][0, p], g1[-1]), (outs[1][0, p], g2[0]), (outs[2][0, p], g3[0])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # branch rows: forking at two lengths and stepping both rows equals two sequences
    br = runner.fork(cache, [2, p + 1])
    logits, gr = runner.forward_rows(br, ids[0, [2, p + 1]], feats[0, [2, p + 1]])
    _, want_a = runner.forward(runner.select_row(runner.fork(cache, [2]), 0), [int(ids[0, 2])], feats[0, 2:3])
    torch.testing.assert_close(gr[0], want_a[0], rtol=1e-4, atol=1e-4)
    assert logits.shape == (2, VOCAB) and torch.isinf(logits[:, [i for i in range(VOCAB) if i not in SUBSET]]).all()


def test_a_feature_draft_fixes_the_exit_layer_and_must_fit_its_target(pair, inline, tmp_path):
    with pytest.raises(MirrorError, match="reads the target's hidden states after layer 2"):
        inline.generate(Request(prompt_ids=(1, 2, 3), decoder="mirror", max_new_tokens=4,
                                spec=SpecConfig(exit_layer=1)))
    other, _ = build_pair(str(tmp_path), "llama", target_layers=3)
    with pytest.raises(MirrorError, match="trained for a target"):
        MirrorEngine.load(other, pair[1], LaneConfig(kind="inline"))


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_unrolled_attention_equals_masked_attention_over_every_depths_keys(depth):
    """train_step_outputs' attention (causal over depth 1, own position over depths 2..d) is the masked sdpa it
    replaced, values and gradients, with grouped KV heads."""
    import torch.nn.functional as F

    from mirror_core.models.feature_draft import unrolled_attention

    g = torch.Generator().manual_seed(depth)
    b, hq, hkv, t, d = 2, 6, 2, 7, 8
    q = torch.randn(b, hq, t, d, generator=g, requires_grad=True)
    past = [tuple(torch.randn(b, hkv, t, d, generator=g, requires_grad=True) for _ in "kv") for _ in range(depth)]
    mask = torch.cat([torch.ones(t, t, dtype=torch.bool).tril()] + [torch.eye(t, dtype=torch.bool)] * (depth - 1), 1)
    keys = torch.cat([k for k, _ in past], 2).repeat_interleave(hq // hkv, 1)
    values = torch.cat([v for _, v in past], 2).repeat_interleave(hq // hkv, 1)
    want = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    got = unrolled_attention(q, past)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    leaves = [q] + [x for kv in past for x in kv]
    grads_want = torch.autograd.grad(want.square().sum(), leaves)
    grads_got = torch.autograd.grad(got.square().sum(), leaves)
    for a, w in zip(grads_got, grads_want):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
