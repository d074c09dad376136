"""The lean SS runner computes what the SS model's own forward (SSRunner) computes, op sequence for op sequence.

The draft worker and the engine over it are tested in test_ss_engine.py with both runners."""
import importlib.util
import os

import pytest
import torch

from mirror_core.models.ss_draft import SSDraftConfig, SSDraftForCausalLM
from mirror_core.runners import build_runner
from mirror_core.runners.fast_ss import FastSSRunner
from mirror_core.runners.protocol import Runner
from mirror_core.runners.ss_reference import SSRunner

VOCAB = 48


def tiny_model(seed: int, layers: int, msa: int, streams: int = 2) -> SSDraftForCausalLM:
    config = SSDraftConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, num_msa_layers=msa, num_streams=streams)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = SSDraftForCausalLM(config).eval()
    with torch.no_grad():
        model.stream_embed.mul_(20.0)  # streams far from the main rows, so a mix-up would show
    return model


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-4, rtol=1e-4)


SHAPES = [(1, 1), (3, 1), (3, 2), (2, 2)]  # (layers, multi-stream layers); the shipped draft is (1, 1)


@pytest.mark.parametrize("layers,msa", SHAPES)
def test_sequence_forwards_match_the_model(layers, msa):
    model = tiny_model(layers + msa, layers, msa)
    fast, ref = FastSSRunner(model), SSRunner(model)
    fc, rc = fast.new_cache(), ref.new_cache()
    gen = torch.Generator().manual_seed(layers * 10 + msa)
    feeds = [7, 1, 3, 2, 1, 3, 3, 1]
    for step, t in enumerate(feeds):
        ids = torch.randint(0, VOCAB, (t,), generator=gen).tolist()
        if step % 3 == 2:  # main-only forward
            assert close(fast.forward(fc, ids), ref.forward(rc, ids))
        else:
            (fl, fs), (rl, rs) = fast.forward_streams(fc, ids), ref.forward_streams(rc, ids)
            assert fl.shape == rl.shape == (t, VOCAB) and fs.shape == rs.shape == (t, 2, 32)
            assert close(fl, rl) and close(fs, rs)
            assert torch.equal(fast.stream_proposals(fs), ref.stream_proposals(rs))
        if step % 4 == 3:  # drop rejected tokens, as self-verification does
            fast.truncate(fc, fast.cache_len(fc) - 2)
            ref.truncate(rc, ref.cache_len(rc) - 2)
        assert fast.cache_len(fc) == ref.cache_len(rc)


@pytest.mark.parametrize("layers,msa", SHAPES)
def test_branch_rows_with_rewinds_match_the_model(layers, msa):
    model = tiny_model(layers * msa, layers, msa)
    fast, ref = FastSSRunner(model), SSRunner(model)
    fc, rc = fast.new_cache(), ref.new_cache()
    prompt = list(range(3, 15))
    fast.forward(fc, prompt)
    ref.forward(rc, prompt)
    valid = [12, 9, 11, 12, 10]
    fb, rb = fast.fork(fc, valid), ref.fork(rc, valid)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (5, 1), generator=gen)
    for step in range(7):  # 1 + 6·3 = 19 entries, more than the 16 own slots fork starts with: the buffers grow
        (fl, fs), (rl, rs) = fast.forward_rows(fb, ids), ref.forward_rows(rb, ids)
        assert close(fl, rl) and close(fs, rs), step
        assert torch.equal(fb.positions, rb.positions)
        drop = [(r + step) % ids.shape[1] for r in range(5)]  # each row rejects a different number
        fast.rewind_rows(fb, drop)
        ref.rewind_rows(rb, drop)
        ids = torch.randint(0, VOCAB, (5, 3), generator=gen)
    for row in (0, 3):  # adopting a row gives the same sequence cache
        a, b = fast.select_row(fb, row), ref.select_row(rb, row)
        assert fast.cache_len(a) == ref.cache_len(b)
        (fl, fs), (rl, rs) = fast.forward_streams(a, [4, 5]), ref.forward_streams(b, [4, 5])
        assert close(fl, rl) and close(fs, rs)


def test_build_runner_picks_the_fast_ss_runner_unless_asked_for_the_models_own():
    model = tiny_model(0, 1, 1)
    assert isinstance(build_runner(model, VOCAB), FastSSRunner)
    assert isinstance(build_runner(model, VOCAB, "fast"), FastSSRunner)
    assert type(build_runner(model, VOCAB, "hf")) is SSRunner


def test_both_ss_runners_declare_what_they_can_do():
    """No kernel and no row plan (a draft's rounding never changes the output), no readout at ℓ_e; the fast one
    changes its linear maps' format alone, the model's own forward moves the whole model."""
    model = tiny_model(0, 1, 1)
    for runner in (FastSSRunner(model), SSRunner(model)):
        assert isinstance(runner, Runner) and runner.kernel.library is None and runner.kernel.reason
        assert not runner.plans_rows and runner.exit_head is None and not runner.reads_features
        assert runner.formats.whole_model == (type(runner) is SSRunner)
        assert runner.max_positions == model.config.max_position_embeddings


def test_runner_steps_script_times_every_case_on_the_shipped_pair(capsys):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("runner_steps", os.path.join(root, "scripts", "runner_steps.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--iters", "2", "--rows", "3"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and not line.startswith("| runner")]
    assert len(lines) == 2 + 5 + 5  # AR: 1 token, branch batch; each SS runner: 4 sequence cases, branch batch
    assert all(float(line.split("|")[3]) > 0 for line in lines)
    assert any("3 tokens + streams" in line for line in lines)
