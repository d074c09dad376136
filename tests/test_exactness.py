"""The target is one function on any CPU (runners/exactness.py): row bands are found by measurement, never assumed.

The machine's own kernels switch wherever they switch (M = 2 on an Intel AMX host, 4 on AMD EPYCs); a test
runner adds a switch of its own at a row count the test chooses, and the search must find it wherever the
machine's own switch lies, after which every decoder equals AR token for token."""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import mirror_core.pair as pair_mod
from mirror_core import LaneConfig, MirrorEngine, Request, SamplingConfig, SpecConfig
from mirror_core.cli import main
from mirror_core.runners.fast import FastLlamaRunner
from mirror_core.records import NOT_EXACT, RowBand, RowCheck, RowPlan
from mirror_core.runners.exactness import check_rows, differing_logits, exact_bands
from testing.toy_models import build_pair, prompts


def _ulp_up(x: torch.Tensor) -> torch.Tensor:
    """x one float step up: what another kernel's rounding looks like."""
    return torch.nextafter(x, torch.full_like(x, float("inf")))


class SwitchAt(FastLlamaRunner):
    """A CPU whose linear-map kernels round differently below `matmul` rows, and whose attention rounds
    differently below `attention` query rows (on top of whatever this machine's kernels do)."""

    matmul = 4
    attention = 1

    def _kernel(self, x, w):
        out = super()._kernel(x, w)
        return out if out.numel() // out.shape[-1] >= self.matmul else _ulp_up(out)

    def _attend(self, q, keys, values, may_attend):
        out = super()._attend(q, keys, values, may_attend)
        return out if q.shape[2] >= self.attention else _ulp_up(out)


class Unfixable(FastLlamaRunner):
    """A CPU on which no call shape is exact: every other matmul call rounds one step up."""

    calls = itertools.count()

    def _kernel(self, x, w):
        out = super()._kernel(x, w)
        return _ulp_up(out) if next(self.calls) % 2 else out


def _load(monkeypatch, runner_cls, target, draft=None, **attrs):
    def build(model, vocab, choice="auto", exit_head=None, kernel="auto", blocks=None):  # torch matmul: another CPU's kernels
        runner = runner_cls(model, vocab, exit_head=exit_head)
        for k, v in attrs.items():
            setattr(runner, k, v)
        return runner
    monkeypatch.setattr(pair_mod, "build_runner", build)
    return MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32", target_threads=1))


def _crosses(band: RowBand, at: int) -> bool:
    """The band holds both at − 1 and at rows (so it would mix two kernels)."""
    return band.lo <= at - 1 and (band.hi is None or band.hi >= at)


@pytest.mark.parametrize("threshold", [4, 8])
def test_the_search_finds_a_switch_wherever_it_lies(pairs, threshold):
    model = AutoModelForCausalLM.from_pretrained(pairs["llama"][0]).eval()
    runner = SwitchAt(model)
    runner.matmul = threshold
    for op in runner.row_ops()[:-1]:  # the linear maps and the LM head
        bands = exact_bands(op, runner.device)
        assert bands and not any(_crosses(b, threshold) for b in bands), (op.name, bands)
        assert any(b.lo == threshold for b in bands), (op.name, bands)  # the switch is a band's floor
        assert bands[0].lo == 1  # one row alone is always a band of its own
    check = check_rows(runner, runner.vocab_size)
    assert check.checked and check.invariant and check.differing > 0 and check.plan is not None
    assert differing_logits(runner, runner.vocab_size) == 0
    for name, band in check.plan.bands:
        if name != "attention":
            assert not _crosses(band, threshold), (name, band)


@pytest.mark.parametrize("matmul,attention", [(4, 1), (8, 3), (2, 6)])
def test_every_decoder_equals_ar_on_a_cpu_with_another_switch(pairs, monkeypatch, matmul, attention):
    target, draft = pairs["qwen3"]
    with _load(monkeypatch, SwitchAt, target, draft, matmul=matmul, attention=attention) as engine:
        rows = engine.info.target_rows
        assert rows.invariant and rows.differing > 0 and engine.target.row_plan == rows.plan
        assert not _crosses(rows.plan.band("attention") or RowBand(), attention) or attention == 1
        for i, prompt in enumerate(prompts(4, seed=3)):
            spec = SpecConfig(gamma=(1, 3, 6, 9)[i], kappa=1 + i % 3, exit_layer=1 + i % 3)
            ar = engine.generate(Request(prompt, "ar", 24, spec=spec)).token_ids
            for decoder in ("sd", "mirror"):
                assert engine.generate(Request(prompt, decoder, 24, spec=spec)).token_ids == ar, (decoder, i)
        sampling = SamplingConfig(temperature=0.9, seed=5, rule="exact")  # Rule E: same seed, same tokens
        prompt = prompts(1, seed=9)[0]
        ar = engine.generate(Request(prompt, "ar", 24, sampling=sampling)).token_ids
        assert engine.generate(Request(prompt, "mirror", 24, sampling=sampling)).token_ids == ar


def test_where_nothing_is_exact_the_run_says_so_and_still_decodes(pairs, monkeypatch):
    target, draft = pairs["llama"]
    with _load(monkeypatch, Unfixable, target, draft) as engine:
        rows = engine.info.target_rows
        assert rows.checked and not rows.invariant and rows.describe.startswith(NOT_EXACT)
        events = list(engine.stream(Request((1, 2, 3), "mirror", 12)))
        assert events[0].settings.target_rows == rows and len(events[-1].token_ids) == 12 and not events[-1].error
        from types import SimpleNamespace

        from ui.numbers import target_line

        assert "not bit-exact on this CPU" in target_line(SimpleNamespace(start=events[0]))


def test_the_plan_is_cached_with_the_calibration_and_checked_again(pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRROR_SD_CACHE", str(tmp_path))
    target = pairs["mistral"][0]
    with _load(monkeypatch, SwitchAt, target, matmul=6) as first:
        rows = first.info.target_rows
        cal = first.info.target_dtype
    assert rows.source == "measured" and rows.plan is not None and dict(cal.exact)["float32"] == rows
    with _load(monkeypatch, SwitchAt, target, matmul=6) as second:
        assert second.info.target_rows.source == "cached" and second.info.target_rows.plan == rows.plan
        assert second.info.target_rows.invariant
    # a cached plan that no longer holds (here: one that ignores the switch at 6) fails its check at the next
    # load, and a new one is searched, used and cached
    (path,) = list((tmp_path / "calibration").glob("*.json"))
    saved = json.loads(path.read_text())
    wrong = RowPlan(tuple((name, RowBand(1, None)) for name, _ in rows.plan.bands))
    saved["exact"] = [[name, {**check, "plan": {"bands": [[n, vars(b)] for n, b in wrong.bands]}}]
                      for name, check in saved["exact"]]
    path.write_text(json.dumps(saved))
    with _load(monkeypatch, SwitchAt, target, matmul=6) as third:
        assert third.info.target_rows.source == "measured" and third.info.target_rows.invariant
        assert third.info.target_rows.plan != wrong
    saved = dict(json.loads(path.read_text())["exact"])
    assert RowCheck.from_dict(saved["float32"]).plan == third.info.target_rows.plan


def test_row_bands_cut_calls_into_chunks_the_kernel_treats_alike():
    assert RowBand(1, 3).spans(7) == [(0, 3, 3), (3, 6, 3), (6, 7, 1)]
    assert RowBand(4, None).spans(2) == [(0, 2, 4)] and RowBand(4, None).spans(9) == [(0, 9, 9)]
    assert RowBand(2, 5).spans(6) == [(0, 5, 5), (5, 6, 2)]
    plan = RowPlan((("qkv", RowBand(4, None)), ("head", RowBand(1, 3)), ("attention", RowBand())))
    assert plan.band("attention") is None and plan.band("head") == RowBand(1, 3)
    assert RowPlan.from_dict(json.loads(json.dumps({"bands": [[n, vars(b)] for n, b in plan.bands]}))) == plan
    assert plan.label == ("qkv in calls of ≥ 4 rows; head in calls of 1–3 rows; attention in calls of any rows "
                          "(query rows) over key axes fixed per position")


def test_probes_fit_a_model_with_a_tiny_vocabulary_and_context(tmp_path, capsys):
    target, draft = build_pair(str(tmp_path), "llama", vocab=8)
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", target_threads=1)) as engine:
        assert engine.info.target_rows.invariant
        ar = engine.generate(Request((1, 2, 3), "ar", 10)).token_ids
        assert engine.generate(Request((1, 2, 3), "mirror", 10)).token_ids == ar
    assert main(["generate", "--target", target, "--draft", draft, "--prompt-ids", "1,2", "--max-new-tokens", "4",
                 "--lane", "inline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["target_rows"]["invariant"] and out["target_rows"]["note"].startswith("bit-exact")
