"""Each default the loaded pair decides has one home (pair.PairInfo.resolve, applied once in MirrorEngine.validate).

For every draft kind (token-only, feature-reading, speculative-streaming) × exit head (none: the logit lens; the
trained head in the draft's folder) × setting left out (ℓ_e, γ, κ, all three): the request resolves to the pair's
choice, a value named is kept, and the run decodes AR's tokens and records what it used. The CLI and the page leave
settings out the same way and encode a prompt with one encoder."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from mirror_core import LaneConfig, MirrorEngine, Request, RunStart, SpecConfig
from mirror_core.cli import main
from mirror_core.config import DEFAULT_GAMMA, DEFAULT_KAPPA, MirrorError
from mirror_core.models.profile import save_profile
from mirror_core.models.ss_draft import ss_draft_from_llama
from testing.reliability import page_values
from testing.toy_models import build_pair, feature_draft, prompts, random_exit_head
from ui.loader import EngineLoader
from ui.session import Session
from ui.settings import settings_from_ui
from ui.streaming import DONE, run_comparison

N = 4             # target layers: N // 2 = 2 is the paper's default ℓ_e
HEAD_LAYER = 1    # the trained exit heads of the token-only and SS drafts
FEATURE_LAYER = 3  # the layer the feature-reading draft reads (its own exit head reads it too)
LANES = LaneConfig(kind="inline", target_threads=1, draft_threads=1, dtype="float32")  # no timing: no γ, κ chosen
KINDS = ("token", "feature", "ss")
HEADS = ("none", "trained")
LEFT_OUT = ("exit_layer", "gamma", "kappa", "all")
NAMED = SpecConfig(gamma=3, kappa=1, exit_layer=2)  # what a request names when it leaves nothing out


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """kind → (target, draft folder holding a trained exit head); the exit-head axis is LaneConfig.exit_head."""
    root = str(tmp_path_factory.mktemp("defaults"))
    target, token = build_pair(root, "llama", target_layers=N)
    random_exit_head(target, HEAD_LAYER, None, token)
    ss = os.path.join(root, "ss_draft")
    ss_draft_from_llama(AutoModelForCausalLM.from_pretrained(target), num_layers=2, num_msa_layers=1, num_streams=2,
                        generator=torch.Generator().manual_seed(0)).save_pretrained(ss)
    random_exit_head(target, HEAD_LAYER, None, ss)
    feature = feature_draft(target, os.path.join(root, "feature"), layer=FEATURE_LAYER, steps=0)
    return {"token": (target, token), "feature": (target, feature), "ss": (target, ss)}


def _expected_exit_layer(kind: str, head: str) -> int:
    """What the pair decides: the feature layer a feature-reading draft reads, else the trained head's, else N // 2."""
    return FEATURE_LAYER if kind == "feature" else HEAD_LAYER if head == "trained" else N // 2


def _spec_leaving_out(left_out: str, kind: str) -> SpecConfig:
    named = NAMED if kind != "feature" else SpecConfig(NAMED.gamma, NAMED.kappa, FEATURE_LAYER)  # it reads only that
    if left_out == "all":
        return SpecConfig(branch_budget=named.branch_budget)
    return SpecConfig(**{"gamma": named.gamma, "kappa": named.kappa, "exit_layer": named.exit_layer, left_out: None})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head", HEADS)
def test_what_a_request_leaves_out_is_the_pairs_choice_and_decodes(drafts, kind, head):
    target, draft = drafts[kind]
    lanes = LaneConfig(**{**LANES.__dict__, "exit_head": "auto" if head == "trained" else "none"})
    with MirrorEngine.load(target, draft, lanes) as engine:
        assert (engine.info.exit_head is not None) == (head == "trained")
        assert engine.info.default_exit_layer() == _expected_exit_layer(kind, head)
        prompt = prompts(1, seed=3)[0]
        ar = engine.generate(Request(prompt, "ar", 12)).token_ids
        for left_out in LEFT_OUT:
            spec = _spec_leaving_out(left_out, kind)
            resolved = engine.validate(Request(prompt, "mirror", 12, spec=spec)).spec
            want = {"gamma": DEFAULT_GAMMA, "kappa": DEFAULT_KAPPA, "exit_layer": _expected_exit_layer(kind, head)}
            for name, value in want.items():  # left out: the pair's; named: kept
                assert getattr(resolved, name) == (value if getattr(spec, name) is None else getattr(spec, name)), (
                    left_out, name)
            for decoder in ("sd", "mirror"):
                events = list(engine.stream(Request(prompt, decoder, 12, spec=spec)))
                start, end = events[0], events[-1]
                assert isinstance(start, RunStart) and start.settings.request.spec == resolved
                assert start.settings.exit_layer == resolved.exit_layer
                assert end.error is None and end.fallback is None and end.token_ids == ar, (left_out, decoder)


def test_a_pair_with_a_profile_fills_in_its_chosen_setting(drafts, tmp_path):
    """γ and κ left out take what the latency model chose for this machine at load (timed lanes, a draft profile)."""
    target, token = drafts["token"]
    draft = str(tmp_path / "profiled")
    shutil.copytree(token, draft)
    save_profile(draft, [0.7, 0.6, 0.5], [0.3, 0.45, 0.5, 0.55], "test")
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", target_threads=1, draft_threads=1)) as engine:
        choice = engine.info.spec_choice
        assert choice is not None
        o = engine.info.overheads  # timed at load by a short run of each decoder, and in the model that chose
        assert o is not None and o.readout > 0 and o.sd > 0 and o.mirror > 0 and o.ar_step > 0 and o.rollout > 0
        assert o.sd_verify > 0 and o.mirror_verify > 0 and o.gamma >= 1
        assert engine.info.describe()["chosen_settings"]["overheads_ms"]["readout"] == o.readout
        resolved = engine.validate(Request((1, 2), "mirror", 8)).spec
        assert (resolved.gamma, resolved.kappa, resolved.exit_layer) == (choice.gamma, choice.kappa, HEAD_LAYER)
        assert engine.info.spec_note(resolved).startswith("chosen for this machine")
        kept = engine.validate(Request((1, 2), "mirror", 8, spec=SpecConfig(gamma=choice.gamma % 8 + 1))).spec
        assert (kept.gamma, kept.kappa) == (choice.gamma % 8 + 1, choice.kappa)


def test_the_cli_decodes_a_feature_draft_with_the_logit_lens_naming_no_layer(drafts, tmp_path, capsys):
    """The command a user types, on a toy pair: `--exit-head none` and no --exit-layer decode at the draft's feature layer
    (no longer refused as N // 2); a target without a tokenizer takes --prompt as ids, commas or spaces."""
    target, feature = drafts["feature"]
    trace = str(tmp_path / "trace.json")
    assert main(["generate", "--target", target, "--draft", feature, "--prompt", "1, 2 3", "--exit-head", "none",
                 "--max-new-tokens", "8", "--lane", "inline", "--dtype", "float32", "--trace", trace, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_ids"] == [1, 2, 3] and len(out["token_ids"]) == 8 and out["error"] is None
    start = json.load(open(trace))["events"][0]
    assert start["settings"]["exit_layer"] == FEATURE_LAYER
    assert start["settings"]["request"]["spec"]["gamma"] == DEFAULT_GAMMA
    assert main(["generate", "--target", target, "--draft", feature, "--prompt-ids", "1 2,3", "--exit-layer", "2",
                 "--lane", "inline", "--dtype", "float32"]) == 2
    assert "reads the target's hidden states after layer 3" in capsys.readouterr().err


def test_the_page_leaves_out_and_encodes_as_the_engine_does(drafts):
    """γ, κ, ℓ_e at 0 on the page are the pair's; its prompt of ids goes through MirrorEngine.encode."""
    target, feature = drafts["feature"]
    loader = EngineLoader(LaneConfig(**{**LANES.__dict__, "exit_head": "none"}))
    try:
        session = Session()
        settings = settings_from_ui(page_values(prompt="1 2, 3", target=target, draft=feature,
                                                decoders=["ar", "mirror"], gamma=0, kappa=0, exit_layer=0,
                                                max_new_tokens=8))
        ticks = list(run_comparison(loader, session, settings, settle_s=0.0))
        assert ticks[-1].kind == DONE and session.error is None, session.error
        spec = session.runs["mirror"].start.settings.request.spec
        assert (spec.gamma, spec.kappa, spec.exit_layer) == (DEFAULT_GAMMA, DEFAULT_KAPPA, FEATURE_LAYER)
        assert session.runs["mirror"].start.prompt_ids == (1, 2, 3)
        assert session.runs["mirror"].end.token_ids == session.runs["ar"].end.token_ids
        with pytest.raises(MirrorError, match="no tokenizer"):
            loader.get(target, feature).encode("not ids")
    finally:
        loader.close()
