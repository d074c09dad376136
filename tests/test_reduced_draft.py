"""A reduced-vocabulary draft (models/vocab.py) and a trained early-exit head (exit_head.py) never change the output:
every decoder still emits transformers' greedy tokens, with the head and without it, on both runners."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import MirrorError
from mirror_core.models.exit_head import find_exit_head
from mirror_core.models.vocab import VocabMap, load_vocab_map
from testing.toy_models import VOCAB, build_pair, hf_greedy, prompts, random_exit_head, reduce_draft

N_NEW = 20
SUBSET = list(range(0, VOCAB, 3)) + list(range(1, VOCAB, 3))[:20]  # 52 of 96 target ids


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reduced"))
    target, draft = build_pair(root, "llama", target_layers=4)
    small = reduce_draft(draft, SUBSET, os.path.join(root, "draft_small"))
    random_exit_head(target, 2, SUBSET[:40], small)
    return target, small


def test_vocab_map_round_trip(tmp_path):
    vm = VocabMap.from_ids([5, 2, 9], 12)
    assert vm.to_draft.tolist() == [3, 3, 1, 3, 3, 0, 3, 3, 3, 2, 3, 3]
    vm.save(str(tmp_path))
    assert load_vocab_map(str(tmp_path)).target_ids.tolist() == [5, 2, 9]
    with pytest.raises(MirrorError, match="distinct"):
        VocabMap.from_ids([1, 1], 4)
    with pytest.raises(MirrorError, match="distinct"):
        VocabMap.from_ids([7], 4)


@pytest.mark.parametrize("runner", ["auto", "hf"])
def test_every_decoder_is_lossless_with_and_without_the_exit_head(reduced, runner):
    target, draft = reduced
    hit_rates = {}
    for head in ("auto", "none"):
        with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind="inline", runner=runner,
                                                         exit_head=head)) as engine:
            pair = engine.info.describe()
            assert pair["draft"]["vocab"] == len(SUBSET)
            assert (pair["exit_head"] is not None) == (head == "auto")
            rates = []
            for i, prompt in enumerate(prompts(5, seed=3)):
                ref = hf_greedy(target, prompt, N_NEW)
                spec = SpecConfig(gamma=2 + i % 4, kappa=1 + i % 3)  # ℓ_e: the head's own layer (2) or N // 2 = 2
                for decoder in ("ar", "sd", "mirror"):
                    end = engine.generate(Request(prompt, decoder, N_NEW, spec=spec))
                    assert end.error is None and end.fallback is None
                    assert list(end.token_ids) == ref, (runner, head, decoder, prompt)
                rates.append(end.summary.hit_rate or 0.0)
            hit_rates[head] = rates
    assert hit_rates["auto"] != hit_rates["none"]  # the head was used: other candidates, other hits


def test_reduced_draft_proposes_only_its_subset(reduced):
    from mirror_core.lanes.draft_lanes import DraftLaneSpec, make_runner

    _, draft = reduced
    runner, _ = make_runner(DraftLaneSpec(draft, "cpu", VOCAB, 0, (), dtype="float32"))
    logits = runner.forward(runner.new_cache(), [1, 2, 95])                             # [3, V]
    assert logits.shape == (3, VOCAB)
    outside = sorted(set(range(VOCAB)) - set(SUBSET))
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, SUBSET]).all()


def test_exit_head_choices(reduced, tmp_path):
    target, draft = reduced
    assert find_exit_head(draft).layer == 2
    with pytest.raises(MirrorError, match="does not exist"):
        MirrorEngine.load(target, draft, LaneConfig(kind="inline", exit_head=str(tmp_path / "nope")))
    with pytest.raises(MirrorError, match="holds no exit head"):
        MirrorEngine.load(target, draft, LaneConfig(kind="inline", exit_head=str(tmp_path)))
    other, _ = build_pair(str(tmp_path), "llama", target_layers=3)  # another shape: auto ignores the head
    with MirrorEngine.load(other, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        assert engine.info.exit_head is None
    shutil.copy(os.path.join(draft, "exit_head.json"), tmp_path / "exit_head.json")
    shutil.copy(os.path.join(draft, "exit_head.safetensors"), tmp_path / "exit_head.safetensors")
    with pytest.raises(MirrorError, match="does not fit"):
        MirrorEngine.load(other, draft, LaneConfig(kind="inline", exit_head=str(tmp_path)))


def test_full_vocab_copy_proposes_what_the_reduced_draft_proposes(reduced):
    """hf_assisted drives a full-vocabulary copy of a reduced draft (models/vocab.full_vocab_copy)."""
    from transformers import AutoModelForCausalLM

    from mirror_core.lanes.draft_lanes import DraftLaneSpec, make_runner
    from mirror_core.models.vocab import full_vocab_copy

    _, draft = reduced
    full = full_vocab_copy(AutoModelForCausalLM.from_pretrained(draft).eval(), load_vocab_map(draft))
    runner, _ = make_runner(DraftLaneSpec(draft, "cpu", VOCAB, 0, (), dtype="float32"))
    ids = [1, 2, 95, 40, 7]
    with torch.no_grad():
        logits_full = full(torch.tensor([ids])).logits[0]                                  # [T, V]
    mine = runner.forward(runner.new_cache(), ids)                                        # [T, V]
    assert logits_full.shape == mine.shape
    assert torch.allclose(logits_full[:, SUBSET], mine[:, SUBSET], atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_exit_heads_candidates_over_its_columns_are_those_over_the_whole_vocabulary(temperature):
    """The early exit's top-κ computed over a trained head's own ids equals the same computation over every token (the
    rest -inf), draft tokens inside and outside its ids excluded alike, and κ past its ids padded with -1."""
    from mirror_core.config import SamplingConfig
    from mirror_core.decode import exit_candidates
    from mirror_core.models.exit_head import ExitHead, ExitHeadWeights, ExitLogits

    gen = torch.Generator().manual_seed(3)
    vocab, hidden = 40, 8
    ids = torch.tensor([1, 4, 5, 9, 17, 22, 30, 39])
    weights = ExitHeadWeights(2, hidden, 4, vocab, torch.randn(hidden, hidden, generator=gen), torch.zeros(hidden),
                              torch.ones(hidden), ids)
    head = ExitHead(weights, torch.randn(vocab, hidden, generator=gen), 1e-6)
    h = torch.randn(4, hidden, generator=gen)                                  # γ + 1 = 4 slots
    cfg = SamplingConfig(temperature=temperature, top_k=5 if temperature else 0)
    for drafts in ([4, 9, 2], [39, 3, 1], [5, 5, 5]):                           # inside, outside and repeated
        for kappa in (1, 3, 8, 12):
            cols = exit_candidates(head.columns(h), drafts, cfg, kappa)
            full = exit_candidates(ExitLogits(head.readout(h), None, vocab), drafts, cfg, kappa)
            assert torch.equal(cols[0], full[0]) and cols[2] == full[2], (drafts, kappa)
            assert torch.allclose(cols[1], full[1], atol=1e-5) and cols[0].shape == (4, min(kappa, vocab))
