"""The distillation pipeline (train/distill.py) end to end on a tiny Llama target with a tokenizer: teacher pass,
reduced draft vocabulary, exit heads, draft training, and a saved folder the engine loads (reduced draft + exit
head) whose decoders all equal ar. The card renders from the run's record."""
from __future__ import annotations

import os

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.train import distill as D
from mirror_core.train.distill_card import render
from testing.reliability import _save_tokenizer
from testing.toy_models import VOCAB, build_pair

pytestmark = pytest.mark.slow  # training runs (the slow tier)


def test_distill_writes_a_pair_the_engine_runs_losslessly(tmp_path):
    target, _ = build_pair(str(tmp_path), "llama", target_layers=4)
    _save_tokenizer(target, [f"w{i}" for i in range(VOCAB)])
    g = torch.Generator().manual_seed(0)
    rows = [{"prompt": torch.randint(0, VOCAB, (6,), generator=g).tolist(),
             "answer": torch.randint(0, 48, (20,), generator=g).tolist()} for _ in range(24)]  # answers use ids < 48
    answers = tmp_path / "answers"
    answers.mkdir()
    torch.save(rows, answers / "answers_0000.pt")
    cfg = D.DistillConfig(answers=str(answers), work=str(tmp_path / "work"), out=str(tmp_path / "pair"),
                          target=target, draft_vocab=56, init_layers=(0, 3), exit_layers=(1, 2), exit_layer=2,
                          topk=8, draft_minutes=0.05, exit_epochs=20.0, batch_sequences=4, val_share=0.25)
    summary = D.distill(cfg)
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
    card = render(cfg.out, record, None, None, "")
    assert "2 layers" in card and "top-1" in card and "logit lens" in card
