"""Greedy losslessness: ar, sd and mirror emit exactly transformers' greedy tokens."""
from __future__ import annotations

import itertools

import pytest

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from testing.toy_models import ARCHS, build_pair, hf_greedy, prompts

N_NEW = 24


@pytest.fixture(scope="module", params=["auto", "hf"])
def engines(pairs, request):
    """Every pair with the default runners (fast for Llama-family weights) and with the generic HF runner."""
    made = {arch: MirrorEngine.load(t, d, LaneConfig(dtype="float32", kind="inline", runner=request.param))
            for arch, (t, d) in pairs.items()}
    yield made
    for e in made.values():
        e.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_all_decoders_match_hf_generate(arch, pairs, engines):
    target, _ = pairs[arch]
    engine = engines[arch]
    for i, prompt in enumerate(prompts(6, seed=1)):
        ref = hf_greedy(target, prompt, N_NEW)
        spec = SpecConfig(gamma=1 + i % 8, kappa=1 + (3 * i) % 8, exit_layer=1 + i % 3)
        for decoder in ("ar", "sd", "mirror"):
            end = engine.generate(Request(prompt, decoder, N_NEW, spec=spec))
            assert end.error is None and end.fallback is None
            assert list(end.token_ids) == ref, (arch, decoder, prompt, spec)


GRID = list(itertools.product(range(1, 9), range(1, 9), range(1, 4)))  # γ × κ × ℓ_e: 192 settings


@pytest.mark.parametrize("grid", ["sample", pytest.param("full", marks=pytest.mark.slow)])
def test_mirror_every_gamma_kappa_exit_layer(pairs, engines, grid):
    """The grid γ 1..8 × κ 1..8 × ℓ_e 1..N−1 on the Llama pair: every 7th setting by default (every γ, κ and ℓ_e
    value still occurs), all of them in the slow tier."""
    target, _ = pairs["llama"]
    engine = engines["llama"]
    prompt = (5, 17, 42, 8)
    ref = hf_greedy(target, prompt, 16)
    hits = misses = 0
    for gamma, kappa, exit_layer in GRID if grid == "full" else GRID[::7]:
        end = engine.generate(Request(prompt, "mirror", 16, spec=SpecConfig(gamma, kappa, exit_layer)))
        assert list(end.token_ids) == ref, (gamma, kappa, exit_layer)
        hits += (end.summary.hit_rate or 0) > 0
        misses += (end.summary.fallback_frequency or 0) > 0
    assert hits > 0 and misses > 0  # both the reuse path and the fresh-rollout path ran


def test_some_steps_accept_and_some_reuse_branches(pairs, engines):
    """Guard against a vacuous pass: the tiny pair accepts drafts and hits precomputed branches."""
    end = engines["llama"].generate(Request((3, 1, 4, 1, 5), "mirror", 48, spec=SpecConfig(4, 4, 2)))
    assert end.summary.acceptance_rate > 0.1
    assert end.summary.hit_rate > 0.3
    assert end.summary.tau > 1.2


@pytest.mark.parametrize("decoder", ["ar", "sd", "mirror"])
def test_eos_ends_where_ar_does(pair_root, decoder):
    base_t, _ = build_pair(pair_root, "llama", seed=7)
    prompt = (9, 9, 2)
    free = hf_greedy(base_t, prompt, 30)
    eos = free[11]  # a token the target emits: the run must end at its first occurrence
    t, d = build_pair(pair_root, "llama", seed=7, eos=eos)
    ref = hf_greedy(t, prompt, 30)
    assert ref[-1] == eos and len(ref) <= 12
    with MirrorEngine.load(t, d, LaneConfig(dtype="float32", kind="inline")) as engine:
        for gamma in (1, 3, 8):
            end = engine.generate(Request(prompt, decoder, 30, spec=SpecConfig(gamma, 2, 2)))
            assert list(end.token_ids) == ref


@pytest.mark.parametrize("max_new", [1, 2, 5, 9])
def test_max_new_tokens_is_exact(pairs, engines, max_new):
    target, _ = pairs["qwen2"]
    ref = hf_greedy(target, (1, 2, 3), max_new)
    for decoder in ("ar", "sd", "mirror"):
        end = engines["qwen2"].generate(Request((1, 2, 3), decoder, max_new, spec=SpecConfig(4, 3, 2)))
        assert list(end.token_ids) == ref
        if decoder == "ar":  # every token after the prefill's is one target pass (no verification steps)
            assert end.summary.steps == 0 and end.summary.target_passes == max_new - 1


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_parallel_lanes_are_lossless(pairs, kind):
    target, draft = pairs["llama"]
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind=kind)) as engine:
        for i, prompt in enumerate(prompts(4, seed=3)):
            ref = hf_greedy(target, prompt, N_NEW)
            for decoder in ("sd", "mirror"):
                for zero_windows in (True, False):  # on: plain steps promised ahead run while the draft lane works
                    spec = SpecConfig(2 + i, 1 + i, 2, zero_windows=zero_windows)
                    end = engine.generate(Request(prompt, decoder, N_NEW, spec=spec))
                    assert list(end.token_ids) == ref
                    assert end.fallback is None


def test_step_records_name_each_branch_row(pairs, engines):
    """StepRecord.branch_rows says which (slot, candidate) each precomputed branch belongs to."""
    from mirror_core import StepRecord

    events = list(engines["llama"].stream(Request((3, 1, 4), "mirror", 24, spec=SpecConfig(3, 2, 2))))
    records = [e for e in events if isinstance(e, StepRecord) and e.branches]
    assert records
    for r in records:
        assert len(r.branch_rows) == len(r.branches)
        assert all(v in r.topk_ids[j] for j, v in r.branch_rows)
        if r.branch_row is not None:  # adopted (a hit, unless the context draft's window was chosen instead)
            assert r.hit and r.branch_rows[r.branch_row] == (r.accepted, r.token)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_branch_budget_keeps_output_and_caps_rows(arch, pairs, engines):
    """A branch budget only prunes which windows are precomputed: output stays exact, rows ≤ budget."""
    from mirror_core import StepRecord
    from mirror_core.config import AUTO_BRANCH_BUDGET
    from ui.inspector import _topk_cells

    target, _ = pairs[arch]
    for i, prompt in enumerate(prompts(4, seed=5)):
        ref = hf_greedy(target, prompt, N_NEW)
        for budget in (1, 3, 7, AUTO_BRANCH_BUDGET):
            spec = SpecConfig(gamma=2 + i, kappa=1 + i, exit_layer=2, branch_budget=budget)
            events = list(engines[arch].stream(Request(prompt, "mirror", N_NEW, spec=spec)))
            assert list(events[-1].token_ids) == ref, (arch, prompt, budget)
            for r in (e for e in events if isinstance(e, StepRecord)):
                cap = budget if budget > 0 else (r.drafted + 1) * spec.kappa  # a context window may be longer than γ
                assert len(r.branch_rows) <= cap and len(r.branches) <= cap
                assert all(v in r.topk_ids[j] for j, v in r.branch_rows)  # topk_ids: every candidate, pruned too
                if budget == 1 and r.branches:  # the rest are shown as pruned, not dropped (ui/inspector.py)
                    assert sum(v >= 0 for row in r.topk_ids for v in row) > 1 or spec.kappa * (r.drafted + 1) == 1  # (a window of zero: 1 slot)
                    cells = "".join(_topk_cells(r, j, str, None) for j in range(len(r.topk_ids)))
                    assert cells.count("pruned (budget)") == sum(v >= 0 for row in r.topk_ids for v in row) - 1
