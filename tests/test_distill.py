"""The distillation pipelines end to end on a tiny Llama target: training/draft/distill.py (teacher pass, reduced
draft vocabulary, exit heads, draft training, a saved folder the engine loads, reduced draft + exit head, whose
decoders all equal ar; the card renders from the run's record) and training/draft/feature_distill.py (the
feature-reading draft, its exit head trained twice, its profile: the engine loads it, chooses γ and κ from it, and
every decoder equals ar)."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from training.draft import distill as D
from mirror_core.models.profile import load_profile, save_profile
from training.draft.card import render
from training.draft.continued import earlier_record
from training.precision import resolve
from testing.reliability import _save_tokenizer
from testing.toy_models import VOCAB, build_pair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # training runs (the slow tier)


def _answers(folder, n: int, seed: int = 0) -> str:
    """chat_data's shard format: n random prompts with answers over ids < 48."""
    g = torch.Generator().manual_seed(seed)
    rows = [{"prompt": torch.randint(0, VOCAB, (6,), generator=g).tolist(),
             "answer": torch.randint(0, 48, (20,), generator=g).tolist()} for _ in range(n)]
    folder.mkdir()
    torch.save(rows, folder / "answers_0000.pt")
    return str(folder)


def test_distill_writes_a_pair_the_engine_runs_losslessly(tmp_path):
    target, _ = build_pair(str(tmp_path), "llama", target_layers=4)
    _save_tokenizer(target, [f"w{i}" for i in range(VOCAB)])
    answers = _answers(tmp_path / "answers", 24)
    cfg = D.DistillConfig(answers=answers, work=str(tmp_path / "work"), out=str(tmp_path / "pair"),
                          target=target, draft_vocab=56, init_layers=(0, 3), exit_layers=(1, 2), exit_layer=2,
                          topk=8, draft_minutes=0.05, exit_epochs=20.0, batch_sequences=4, val_share=0.25)
    summary = D.distill(cfg)
    assert summary["config"]["dtype"] == resolve("auto")  # "auto" resolved where it ran, and recorded so
    folder = os.path.join(cfg.out, "draft")
    assert {"draft_vocab.json", "exit_head.json", "exit_head.safetensors", "config.json"} <= set(os.listdir(folder))
    assert summary["draft_log"][-1]["step"] > 0 and set(summary["exit_coverage"]) == {1, 2}
    with MirrorEngine.load(target, folder, LaneConfig(kind="inline", dtype="float32")) as engine:
        pair = engine.info.describe()
        assert pair["draft"]["vocab"] == 56 and pair["exit_head"]["layer"] == 2
        for prompt in ((1, 2, 3), (40, 41, 7, 9)):
            ar = engine.generate(Request(prompt, "ar", 12)).token_ids
            for decoder in ("sd", "mirror"):
                assert engine.generate(Request(prompt, decoder, 12, spec=SpecConfig(3, 2))).token_ids == ar
    import json

    record = json.load(open(os.path.join(cfg.out, "distill.json")))
    card = render(None, distill=record)
    assert "2 layers" in card and "top-1" in card and "logit lens" in card


@pytest.mark.parametrize("dtype, rollout_weight", [("bfloat16", 0.0), ("float32", 1.0)])  # "auto" with bf16 units,
def test_feature_distill_writes_a_draft_the_engine_runs_losslessly(tmp_path, dtype, rollout_weight):  # and without
    from training.draft import feature_distill as FD

    target, _ = build_pair(str(tmp_path), "llama", target_layers=4)
    cfg = FD.FeatureDistillConfig(answers=_answers(tmp_path / "answers", 24), heldout=_answers(tmp_path / "held", 6, 1),
                                  work=str(tmp_path / "work"), out=str(tmp_path / "pair"), target=target,
                                  feature_layer=3, draft_vocab=56, topk=8, depths=2, minutes=0.03, exit_epochs=20.0,
                                  candidate_epochs=5.0, batch_sequences=4, compare="", dtype=dtype,
                                  rollout_weight=rollout_weight)
    summary = FD.distill(cfg)
    assert summary["config"]["dtype"] == dtype
    folder = os.path.join(cfg.out, "feature_draft")
    measured, profile = summary["profile"], load_profile(folder)  # decoding's rollouts replayed at γ = 1..8
    assert list(profile.accept) == measured["accept"] and len(profile.tau_by_gamma) == 8
    assert [list(r) for r in profile.hit_by_gamma] == measured["hit_by_gamma"] and len(profile.hit_by_gamma[0]) == 4
    assert [profile.tau(g) for g in range(1, 9)] == pytest.approx(measured["tau_by_gamma"])  # the model reads them
    assert summary["draft_log"][-1]["heldout_tau"] == pytest.approx(measured["tau_by_gamma"][1])  # depths 2 = γ 2
    script = importlib.util.spec_from_file_location("draft_profile", os.path.join(ROOT, "scripts", "draft_profile.py"))
    draft_profile = importlib.util.module_from_spec(script)
    script.loader.exec_module(draft_profile)
    again = draft_profile.main(["--draft", folder, "--heldout", cfg.heldout, "--target", target, "--dtype", dtype,
                                "--work", str(tmp_path / "again")])  # the saved (bfloat16) draft re-measured
    assert again["tau_by_gamma"] == pytest.approx(measured["tau_by_gamma"], abs=0.25)  # a near-tie may flip
    assert len(again["hit_by_gamma"]) == len(measured["hit_by_gamma"]) == 8
    assert {"feature_draft.json", "draft_vocab.json", "draft_profile.json", "exit_head.json"} <= set(os.listdir(folder))
    assert summary["draft_log"][-1]["step"] > 0 and set(summary["candidate_coverage"]) == {"before", "after"}
    with MirrorEngine.load(target, folder, LaneConfig(kind="inline")) as engine:
        assert engine.info.draft_features == 3 and engine.info.exit_head.layer == 3 and engine.info.spec_choice
        for prompt in ((1, 2, 3), (40, 41, 7, 9)):
            ar = engine.generate(Request(prompt, "ar", 12)).token_ids
            for decoder in ("sd", "mirror"):
                assert engine.generate(Request(prompt, decoder, 12)).token_ids == ar


def test_feature_distill_continues_a_saved_draft_and_refuses_one_that_does_not_fit(tmp_path):
    """--init: a run of no steps saves the draft and exit head it started from bit for bit (bfloat16 round trip);
    a run that trains keeps the vocabulary (not --draft-vocab), records its sources and the runs before it, and the
    card shows every run; the engine still equals ar; a larger --num-layers grows it (new layers start as identities:
    the same held-out figures); fewer layers or another feature layer are refused before any teacher pass."""
    import json

    from training.draft import feature_distill as FD
    from training.draft.card import render_feature

    target, _ = build_pair(str(tmp_path), "llama", target_layers=4)
    answers, held = _answers(tmp_path / "answers", 24), _answers(tmp_path / "held", 6, 1)
    cfg = FD.FeatureDistillConfig(answers=answers, heldout=held, work=str(tmp_path / "work"), out=str(tmp_path / "a"),
                                  target=target, feature_layer=3, draft_vocab=40, topk=8, depths=2, minutes=0.03,
                                  exit_epochs=5.0, candidate_epochs=0.0, batch_sequences=4, compare="")
    first = FD.distill(cfg)
    start = os.path.join(cfg.out, "feature_draft")
    p = load_profile(start)  # re-measured (scripts/draft_profile.py --write): the run's exit hit rates are kept
    save_profile(start, [0.5] * len(p.accept), list(p.hit), "re-measured", [1.5, 1.7])
    assert earlier_record(start)["draft_log"] == first["draft_log"]
    same = FD.distill(FD.FeatureDistillConfig(**{**cfg.__dict__, "init": start, "out": str(tmp_path / "same"),
                                                 "minutes": 0.0, "exit_epochs": 0.0}))
    for name in ("feature_draft.safetensors", "exit_head.safetensors", "draft_vocab.json"):
        assert open(os.path.join(start, name), "rb").read() == \
            open(os.path.join(tmp_path, "same", "feature_draft", name), "rb").read(), name
    assert same["draft_log"][0]["heldout_agreement"] == same["draft_log"][-1]["heldout_agreement"]
    more = _answers(tmp_path / "more", 24, 2)
    (tmp_path / "more" / "generation.json").write_text(json.dumps({"records": 24, "answer_tokens": 480,
                                                                   "seconds": 9.0, "threads": 1}))
    second = FD.distill(FD.FeatureDistillConfig(**{**cfg.__dict__, "answers": f"{answers},{more}", "init": start,
                                                   "out": str(tmp_path / "b"), "draft_vocab": 56}))
    assert second["draft_vocab_size"] == 40   # the continued draft's vocabulary, not --draft-vocab 56
    assert second["sources"] == {answers: None, more: {"records": 24, "answer_tokens": 480, "seconds": 9.0,
                                                       "threads": 1}}
    assert second["continued_from"]["draft_log"] == first["draft_log"] and first["continued_from"] is None
    third = FD.distill(FD.FeatureDistillConfig(**{**cfg.__dict__, "answers": more, "out": str(tmp_path / "c"),
                                                  "init": os.path.join(tmp_path, "b", "feature_draft")}))
    assert third["continued_from"]["continued_from"]["draft_log"] == first["draft_log"]
    card = "\n".join(render_feature(third, None, ""))
    assert "Run 1 of 3" in card and "Run 3 of 3" in card and card.count("--init ") == 2
    assert "chat_data --sources more --out WORK/data --threads 1" in card and f"answers in {answers}" in card
    assert "Run 1" not in "\n".join(render_feature(first, None, ""))
    with MirrorEngine.load(target, os.path.join(tmp_path, "c", "feature_draft"), LaneConfig(kind="inline")) as engine:
        ar = engine.generate(Request((1, 2, 3), "ar", 12)).token_ids
        assert engine.generate(Request((1, 2, 3), "mirror", 12)).token_ids == ar
    deeper = FD.distill(FD.FeatureDistillConfig(**{**cfg.__dict__, "init": start, "num_layers": 2, "minutes": 0.0,
                                                   "exit_epochs": 0.0, "out": str(tmp_path / "deep")}))
    assert deeper["draft_log"][0]["heldout_agreement"] == same["draft_log"][0]["heldout_agreement"]  # new layer: identity
    deep = os.path.join(tmp_path, "deep", "feature_draft")
    assert json.load(open(os.path.join(deep, "feature_draft.json")))["num_layers"] == 2
    assert f"--init {start} --num-layers 2" in "\n".join(render_feature(deeper, None, ""))
    with MirrorEngine.load(target, deep, LaneConfig(kind="inline")) as engine:
        ar = engine.generate(Request((1, 2, 3), "ar", 12)).token_ids
        assert engine.generate(Request((1, 2, 3), "mirror", 12)).token_ids == ar
    for init, layers, feature_layer in ((deep, 1, 3), (start, 1, 2)):
        with pytest.raises(SystemExit, match="cannot continue here"):
            FD.distill(FD.FeatureDistillConfig(**{**cfg.__dict__, "init": init, "num_layers": layers,
                                                  "feature_layer": feature_layer, "work": str(tmp_path / "fresh"),
                                                  "out": str(tmp_path / "d")}))
    assert not any(f.startswith("teacher") for f in os.listdir(tmp_path / "fresh"))   # refused before the teacher pass


class _Parsed(Exception):
    """Raised in place of a training run: the command's flags were parsed into its configuration."""


# module of a `python -m` command → the function its main calls once the flags are parsed
RUNS = {"training.toy_pair": ("training.toy_pair.cli", "train_all"),
        "training.toy_pair.evaluate": ("training.toy_pair.evaluate", "reevaluate"),
        "training.toy_pair.to_gguf": ("training.toy_pair.to_gguf", "convert"),
        "training.draft.chat_data": ("training.draft.chat_data", "generate"),
        "training.draft.distill": ("training.draft.distill", "distill"),
        "training.draft.feature_distill": ("training.draft.feature_distill", "distill"),
        "training.draft.card": ("training.draft.card", "write_card")}


def _documented_commands(path: str) -> list[list[str]]:
    """Every `python -m training…` and `scripts/draft_profile.py` command in the file's code blocks, continuation
    lines joined, a trailing `# comment` and a following `&` or `&&` dropped."""
    import re
    import shlex

    with open(path, encoding="utf-8") as f:
        blocks = re.findall(r"```(?:bash)?\n(.*?)```", f.read(), re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            ends = [i for i, w in enumerate(words) if w in ("&", "&&", ";", "|", "||")]
            words = words[: ends[0]] if ends else words  # one command: the shell's operators end it
            if "python" in words and ("-m" in words or "scripts/draft_profile.py" in words):
                start = words.index("python")
                if words[start + 1:start + 2] == ["-m"] and words[start + 2].startswith("training"):
                    commands.append(words[start + 2:])
                elif words[start + 1:start + 2] == ["scripts/draft_profile.py"]:
                    commands.append(words[start + 1:])
    return commands


@pytest.mark.parametrize("doc", ["docs/TRAINING.md", "README.md"])
def test_every_documented_training_command_parses(doc, monkeypatch):
    """Each training command the docs state names a module that exists and flags it accepts (the run itself is
    replaced: these are hours of work; the recipes run end to end on tiny models in the tests above)."""
    import importlib

    commands = _documented_commands(os.path.join(ROOT, doc))
    assert commands, doc
    for words in commands:
        if words[0] == "scripts/draft_profile.py":
            script = importlib.util.spec_from_file_location("draft_profile", os.path.join(ROOT, words[0]))
            module = importlib.util.module_from_spec(script)
            script.loader.exec_module(module)
            assert module.parse_args(words[1:]).heldout, words
            continue
        where, run = RUNS[words[0]]
        runner = importlib.import_module(where)

        def stop(*args, **kwargs):
            raise _Parsed(args)

        monkeypatch.setattr(runner, run, stop)
        main = importlib.import_module(words[0] + (".cli" if words[0] == "training.toy_pair" else "")).main
        with pytest.raises(_Parsed):
            main(words[1:])
