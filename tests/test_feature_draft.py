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
from mirror_core.kernels import native
from mirror_core.runners import calibrate, choose_kernel
from mirror_core.runners.calibrate import DRAFT_FORMAT_WHY, calibrate_feature_draft, draft_format
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
    """The pair at its own formats: the target float32, the draft q8_0 where the kernel runs (else its fastest)."""
    target, draft = pair
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline")) as engine:
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
    assert inline.info.target_dtype.sequence == "float32"
    assert inline.info.draft_dtype.sequence == ("q8_0" if native.library() is not None else "float32")


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_parallel_lanes_equal_the_inline_lane(pair, inline, kind):
    target, draft = pair
    with MirrorEngine.load(target, draft, LaneConfig(kind=kind)) as engine:
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


@pytest.mark.skipif(native.library() is None, reason=f"no kernel here: {native.unavailable()}")
def test_on_the_kernel_the_draft_runs_q8_0_and_a_branch_row_is_a_step(pair):
    """Where the kernel runs, the draft's own format is q8_0 (calibrate.draft_format: the pair's, on every CPU kind).
    Its packed step (a kernel call a layer) computes the draft's maths: in float32 as torch does within rounding, in
    q8_0 within Q8_0's; and a branch row's logits and features are a sequence step's, bit for bit."""
    _, draft = pair
    model, vmap = load_feature_draft(draft), load_vocab_map(draft)
    runner = FeatureRunner(model, vmap, kernel=choose_kernel("auto", "cpu", torch.float32))
    assert draft_format(runner) == "q8_0" and torch.qint8 in runner.formats.offered
    cal = calibrate_feature_draft(runner, "auto")
    assert cal.sequence == cal.rows == "q8_0" and cal.note == DRAFT_FORMAT_WHY and cal.ms("q8_0", "step") > 0
    g = torch.Generator().manual_seed(1)
    ids, feats = torch.tensor(SUBSET)[torch.randint(len(SUBSET), (12,), generator=g)], torch.randn(12, 64, generator=g)
    plain = FeatureRunner(load_feature_draft(draft), vmap)
    want_logits, want_g = plain.forward(plain.new_cache(), ids.tolist(), feats)
    kept = torch.isfinite(want_logits)
    for fmt, tol in (("float32", 1e-5), ("q8_0", 0.03)):  # q8_0 here: g within 1.3 %, logits within 3 % of their range
        runner.set_dtypes(calibrate.DTYPES[fmt])
        cache = runner.new_cache()
        logits, g_seq = runner.forward(cache, ids.tolist(), feats)                       # [T, V], [T, H]
        assert (g_seq - want_g).abs().max() < tol * want_g.abs().max(), fmt
        assert torch.equal(kept, torch.isfinite(logits))
        assert (logits - want_logits)[kept].abs().max() < 2 * tol * want_logits[kept].abs().max(), fmt
        runner.truncate(cache, 9)
        branches = runner.fork(cache, [5, 9])
        rows_logits, rows_g = runner.forward_rows(branches, ids[[5, 9]], feats[[5, 9]])
        for r, at in enumerate((5, 9)):
            step_logits, step_g = runner.forward(runner.select_row(runner.fork(cache, [at]), 0), [int(ids[at])],
                                                 feats[at: at + 1])
            assert torch.equal(rows_g[r], step_g[0]) and torch.equal(rows_logits[r], step_logits[0]), (fmt, at)
        _, last = runner.forward(cache, ids[9:].tolist(), feats[9:], rows=1)             # only the last row's
        assert last.shape == (1, 64) and torch.equal(last[0], g_seq[-1])


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
    assert logits.shape == (2, len(SUBSET) + 1) and torch.isinf(logits[:, -1]).all()  # the draft's vocabulary, "other"
    drawn = logits.argmax(-1)                                                              # never "other"
    p = runner.over_target_vocab(torch.softmax(logits, -1))                                # [2, V]
    assert p.shape == (2, VOCAB) and torch.equal(p.argmax(-1), runner.target_ids(drawn))
    assert (p[:, [i for i in range(VOCAB) if i not in SUBSET]] == 0).all()


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
