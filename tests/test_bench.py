"""The bench command on tiny models and two prompts: every decoder and peer, JSON/CSV/HTML, sweeps,
the latency model and derive on hand-made numbers, the rows' JSON/CSV layout against a shipped report,
and the GPU script's CPU dry run; each finishes in seconds."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mirror_core.bench.harness import BenchConfig, BenchPrompt, Cell, Measurement, measured_row, parse_sweep
from mirror_core.bench.report import write_csv
from mirror_core.bench.rows import derive
from mirror_core.bench.summary import build_report, recorded_path
from mirror_core.cli import main
from mirror_core.config import SamplingConfig, SpecConfig
from mirror_core.events import SpanEvent, StepRecord
from mirror_core.latency import LatencyModel, hidden_draft_bound, latency_model_from_events, physical_bound, verify_time
from mirror_core.metrics import RunSummary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prompts(tmp_path, n: int = 2) -> str:
    path = tmp_path / "question.jsonl"
    rows = [{"question_id": "q1", "category": "toy", "prompt_ids": [1, 2, 3]},
            {"question_id": "q2", "category": "toy", "prompt_ids": [9, 8]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
    return str(path)


def test_bench_runs_every_decoder_and_peer_and_writes_json_csv_html(pairs, tmp_path, capsys):
    target, draft = pairs["llama"]
    out = tmp_path / "out"
    rc = main(["bench", "--target", target, "--draft", draft, "--prompts", _prompts(tmp_path), "--max-new-tokens", "12",
               "--repeats", "2", "--lane", "inline", "--out-dir", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "hf_assisted" in table and "baseline:" in table
    report = json.loads((out / "bench.json").read_text())
    decoders = ("ar", "ar_all", "sd", "mirror", "hf", "hf_assisted")
    assert [e["name"] for e in report["summary"]] == list(decoders) and len(report["rows"]) == 12
    summary = {e["name"]: e for e in report["summary"]}
    for d in decoders[1:]:  # the peers' greedy output equals ar's, token for token and length for length
        assert summary[d]["all_equal_to_ar"] is True, d
    assert report["baseline"] in ("ar", "ar_all") and summary[report["baseline"]]["speedup_vs_baseline"] == 1.0
    assert summary["ar"]["speedup_vs_ar"] == 1.0
    mirror = [r for r in report["rows"] if r["decoder"] == "mirror"]
    assert all(r["bound"] > 0 and r["hidden_bound_ms"] > 0 and r["predicted_speedup_vs_ar"] > 0 for r in mirror)
    assert all(r["wall_s_min"] <= r["wall_s"] <= r["wall_s_max"] for r in report["rows"])
    peers = [r for r in report["rows"] if r["decoder"].startswith("hf")]
    assert {r["timed_by"] for r in peers} == {"perf_counter around generate()"}
    with open(out / "bench.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {"speedup_vs_baseline", "bound", "model_delta_ms"} <= set(rows[0])
    page = (out / "bench.html").read_text()
    assert "Plotly.newPlot" in page and "<script src=" not in page          # plotly.js inlined: self-contained
    assert "Speedup vs the baseline" in page and "How it was measured" in page


def test_bench_sweeps_the_grid_and_names_the_best_setting(pairs, tmp_path, capsys):
    target, draft = pairs["llama"]
    out = tmp_path / "sweep.json"
    rc = main(["bench", "--target", target, "--draft", draft, "--prompts", _prompts(tmp_path, 1),
               "--max-new-tokens", "8", "--repeats", "1", "--warmup", "0", "--lane", "inline",
               "--decoders", "ar,mirror", "--sweep", "gamma=2,3", "kappa=1,2", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    mirror = [e for e in report["summary"] if e["decoder"] == "mirror"]
    assert {(e["gamma"], e["kappa"], e["exit_layer"]) for e in mirror} == {(2, 1, 2), (2, 2, 2), (3, 1, 2), (3, 2, 2)}
    assert all(e["predicted_speedup_vs_ar"] is not None and e["all_equal_to_ar"] for e in mirror)
    best = report["best"]
    assert best["speedup_vs_baseline"] == max(e["speedup_vs_baseline"] for e in mirror)
    assert "best mirror setting" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--decoders", "ar,eagle"], "error: unknown decoder"),
    (["--decoders", "ar,sd", "--sweep", "gamma=2"], "error: --sweep varies mirror"),
    (["--sweep", "depth=2"], "error: --sweep takes AXIS=V1,V2"),
    (["--sweep", "gamma=2,x"], "error: --sweep gamma values must be integers"),
    (["--decoders", "ar,hf", "--temperature", "0.7"], "error: the peers are compared greedily; use --temperature 0 or drop hf"),
    (["--repeats", "0"], "error: --repeats must be >= 1"),
])
def test_bench_rejects_bad_flags_with_one_error_line(pairs, tmp_path, capsys, flags, message):
    target, draft = pairs["llama"]
    rc = main(["bench", "--target", target, "--draft", draft, "--prompts", _prompts(tmp_path, 1), "--lane", "inline",
               *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(message) and len(err.splitlines()) == 1


def test_sweep_grid_is_the_product_of_the_axes():
    grid = parse_sweep(["gamma=2,4,6", "kappa=1,2,4", "exit=3,5"], SpecConfig(gamma=4, kappa=4))
    assert len(grid) == 18 and grid[0] == SpecConfig(2, 1, 3) and grid[-1] == SpecConfig(6, 4, 5)
    assert parse_sweep(["kappa=1,8"], SpecConfig(gamma=5)) == (SpecConfig(5, 1), SpecConfig(5, 8))
    assert parse_sweep(None, SpecConfig()) == ()
    assert parse_sweep(["budget=0,6"], SpecConfig()) == (SpecConfig(branch_budget=0), SpecConfig(branch_budget=6))


def _mirror_step(step: int, t: float) -> list[SpanEvent]:
    """One hand-made Mirror-SD step starting at t (ms): prefix 4, readout 1, suffix 4 (draft branches 3
    meanwhile), accept 1, wait 0.5 + step (the fastest reply is 1.5 ms)."""
    ms = 1e-3
    return [SpanEvent("target", "target_prefix", t * ms, (t + 4) * ms, step),
            SpanEvent("target", "exit_readout", (t + 4) * ms, (t + 5) * ms, step),
            SpanEvent("draft", "draft_branches", (t + 5) * ms, (t + 8) * ms, step),
            SpanEvent("target", "target_suffix", (t + 5) * ms, (t + 9) * ms, step),
            SpanEvent("target", "accept", (t + 9) * ms, (t + 10) * ms, step),
            SpanEvent("target", "wait", (t + 10) * ms, (t + 10.5 + step) * ms, step)]


def test_latency_model_and_bounds_on_hand_made_numbers():
    spans = [SpanEvent("draft", "draft_rollout", 0.0, 0.002, 0)] + _mirror_step(1, 10.0) + _mirror_step(2, 30.0)
    steps = [StepRecord(s, (0,) * 5, 4, 2, 7, 3, False, True, t_end=(t + 10.5 + s) * 1e-3)
             for s, t in ((1, 10.0), (2, 30.0))]
    summary = RunSummary(4, steps=4, committed=12, branched_steps=4, hits=3)  # τ = 3.0, FF = 0.25
    model = latency_model_from_events(spans, steps, summary, t_ar=0.006)
    assert model.t_pre == pytest.approx(0.004) and model.delta == pytest.approx(0.004)
    assert model.t_branch == pytest.approx(0.003) and model.t_fresh == pytest.approx(0.002)
    assert model.t_mirror == pytest.approx(0.004 + 0.001 + 0.004 + 0.001)      # the draft fits in Δ: hidden
    assert model.expected_step == pytest.approx(0.010 + 0.25 * 0.002)
    assert model.speedup == pytest.approx(3.0 * 0.006 / 0.0105)
    assert model.t_sd == pytest.approx(0.010) and model.sd_speedup == pytest.approx(1.8)
    assert model.measured_step == pytest.approx((0.0115 + 0.0125) / 2)
    assert verify_time(spans) == pytest.approx(0.009)                          # prefix + readout + suffix
    assert physical_bound(3.0, 0.006, 0.009) == pytest.approx(2.0)
    assert hidden_draft_bound(spans) == pytest.approx(0.010 + 0.0015)           # verify + accept + fastest reply
    assert latency_model_from_events([], [], RunSummary(4), None) is None


def _row(decoder, wall, tokens, summary=None, t_ar=None, t_verify=None, model=None):
    """A row of one hand-made run (times in s, as the engine measures them)."""
    cell = Cell(decoder, SpecConfig(), 4 if decoder in ("sd", "mirror") else None, None, None)
    return measured_row(BenchPrompt("p", "toy", (1,)), cell,
                        [Measurement(tuple(tokens), wall, summary, t_ar, t_verify, model=model)])


def test_derive_picks_the_faster_ar_as_baseline_and_checks_equality():
    sd_summary = RunSummary(4, steps=1, committed=2, ttft_s=0.2)  # τ = 2.0
    rows = derive([_row("ar", 1.0, [1, 2], t_ar=0.005), _row("ar_all", 0.8, [1, 2], RunSummary(4, ttft_s=0.2)),
                   _row("sd", 0.5, [1, 2], sd_summary, t_verify=0.008), _row("hf", 0.4, [1, 3])])
    sd, hf = rows[2], rows[3]
    assert sd.speedup_vs_baseline == pytest.approx(1.6) and sd.speedup_vs_ar == pytest.approx(2.0)
    assert sd.decode_speedup_vs_baseline == pytest.approx((0.8 - 0.2) / (0.5 - 0.2))  # the prefill left out
    assert hf.decode_speedup_vs_baseline is None  # a peer's prefill is not timed apart
    assert sd.bound == pytest.approx(2.0 * 5.0 / 8.0) and sd.equal_to_ar is True
    assert hf.equal_to_ar is False and hf.tau is None and hf.timed_by == "perf_counter around generate()"


def test_rows_and_report_keep_the_json_and_csv_layout_of_the_shipped_reports(tmp_path):
    shipped = os.path.join(ROOT, "docs", "bench", "defaults_chat_8")  # the newest layout (mirror-sd-bench/6)
    with open(os.path.join(shipped, "bench.json"), encoding="utf-8") as f:
        ref = json.load(f)
    with open(os.path.join(ROOT, "docs", "bench", "sweep_draft_ar_128", "bench.json"), encoding="utf-8") as f:
        ref_best = json.load(f)["best"]
    model = LatencyModel(0.004, 0.001, 0.004, 0.003, 0.001, 0.002, ff=0.25, tau=3.0, t_ar=None, measured_step=0.011)
    rows = derive([_row("ar", 1.0, [1, 2, 3], RunSummary(4), t_ar=0.006),
                   _row("mirror", 0.5, [1, 2, 3], RunSummary(4, steps=1, committed=3), t_verify=0.009, model=model),
                   _row("hf", 0.8, [1, 2, 3])])
    ref_mirror = next(r for r in ref["rows"] if r["decoder"] == "mirror")
    for row in rows:
        assert list(row.to_dict()) == list(ref["rows"][0]), row.decoder
    assert list(rows[1].to_dict()["model_ms"]) == list(ref_mirror["model_ms"])
    assert rows[1].predicted_speedup_vs_ar == pytest.approx(3.0 * 6.0 / (1e3 * model.expected_step))
    report = build_report(rows + [replace(rows[1], setting="γ=2")],  # two mirror settings: a best one
                          BenchConfig(("ar", "mirror", "hf"), 3, SamplingConfig(), SpecConfig()), {})
    out = json.loads(json.dumps(report.to_dict()))
    assert list(out) == list(ref) and list(out["summary"][0]) == list(ref["summary"][0])
    assert list(out["best"]) == list(ref_best) and out["rows"] == [r.to_dict() for r in report.rows]
    write_csv(str(tmp_path / "bench.csv"), report.rows)
    with open(tmp_path / "bench.csv", encoding="utf-8") as f, open(os.path.join(shipped, "bench.csv"),
                                                                   encoding="utf-8") as g:
        assert f.readline() == g.readline()


def test_a_report_names_models_and_prompts_without_this_machines_paths(tmp_path):
    """A committed record must read the same on every checkout: a path inside the repository is kept relative to
    it, a registry name or hub id as it is, and any other path by its last two parts; every shipped record too."""
    rows = derive([_row("ar", 1.0, [1, 2, 3], RunSummary(4))])
    info = {"target": "smollm2-135m-instruct", "draft": os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft"),
            "prompts_file": str(tmp_path / "work" / "prompts.jsonl")}
    settings = build_report(rows, BenchConfig(("ar",), 3, SamplingConfig(), SpecConfig()), info).settings
    assert (settings["target"], settings["draft"]) == ("smollm2-135m-instruct", "assets/smollm2_pair/feature_draft")
    assert settings["prompts_file"] == "…/work/prompts.jsonl"
    assert recorded_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" and recorded_path(None) is None
    for folder, _, files in os.walk(os.path.join(ROOT, "docs", "bench")):
        for name in (f for f in files if f.endswith((".json", ".csv"))):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                text = f.read()
            assert ROOT not in text and not re.search(r'"/(home|work|root|tmp|Users)/', text), name


def _gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_bench", os.path.join(ROOT, "scripts", "gpu_bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_script_dry_run_on_cpu_writes_json_and_markdown(tmp_path):
    gpu = _gpu_script()
    assert gpu.main(["--device", "cpu", "--tiny", "--max-new-tokens", "4", "--prompts", "1", "--repeats", "1",
                     "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "gpu_bench.json").read_text())
    random_pair, default_pair = out["results"]
    assert random_pair["replay"]["label"] == "modelled" and random_pair["replay"]["mirror_speedup_vs_ar"] > 0
    assert random_pair["replay"]["tau"] == out["acceptance_replayed"]["tau"]
    assert default_pair["report"]["summary"][2]["all_equal_to_ar"] is True
    assert "Replayed acceptance" in (tmp_path / "gpu_bench.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_gpu_script_fails_fast_without_cuda(tmp_path, capsys):
    assert _gpu_script().main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no CUDA device")
    assert _gpu_script().main(["--device", "cpu", "--out", str(tmp_path)]) == 2


def test_the_llama_cpp_peer_says_how_to_add_it_and_what_it_needs(pairs, tmp_path, monkeypatch, capsys):
    """Optional: without llama-cpp-python one line says how to add it; a target without its own GGUF is refused."""
    from mirror_core.bench.peers import LlamaCppPeer

    target, draft = pairs["llama"]
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where the package is not installed
    rc = main(["bench", "--target", target, "--draft", draft, "--prompts", _prompts(tmp_path, 1), "--max-new-tokens",
               "4", "--repeats", "1", "--warmup", "0", "--lane", "inline", "--decoders", "ar,llama_cpp"])
    assert rc == 2 and "pip install llama-cpp-python==" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "llama_cpp")
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed here")
    from mirror_core.config import MirrorError

    with pytest.raises(MirrorError, match="runs the target's own GGUF"):
        LlamaCppPeer(target, ("llama_cpp",))


def test_llama_cpp_rows_report_agreement_not_equality():
    """llama.cpp is another function: its rows carry the common-prefix share with ar, and no equal_to_ar verdict."""
    def row(decoder: str, tokens: tuple[int, ...]):
        m = Measurement(tokens, 0.1, t_ar=0.004)
        return measured_row(BenchPrompt("p", "", (1,)), Cell(decoder, SpecConfig(), None, None, None), [m])

    rows = {r.decoder: r for r in derive([row("ar", (5, 6, 7, 8)), row("llama_cpp", (5, 6, 9, 9)),
                                          row("ar_all", (5, 6, 7, 8))])}
    assert rows["llama_cpp"].equal_to_ar is None and rows["llama_cpp"].agreement_with_ar == 0.5
    assert rows["ar_all"].equal_to_ar is True and rows["ar_all"].agreement_with_ar == 1.0
    assert rows["llama_cpp"].timed_by == "perf_counter per token" and rows["llama_cpp"].t_ar_ms == 4.0


def test_the_default_decoders_are_those_that_apply_to_the_pair(pairs):
    """Without --decoders the bench runs every decoder that applies: transformers' assisted generation only with a
    draft it can drive (the default pair's feature-reading draft needs the target's hidden states)."""
    from mirror_core.bench.harness import default_decoders
    from mirror_core.config import LaneConfig
    from mirror_core.models.pairs import REAL_FEATURE_DRAFT

    token_only = default_decoders(LaneConfig(), pairs["llama"][1])
    assert "hf_assisted" in token_only and "ar_all" in token_only and "llama_cpp" not in token_only
    assert default_decoders(LaneConfig(), REAL_FEATURE_DRAFT) == tuple(d for d in token_only if d != "hf_assisted")


def test_every_millisecond_of_a_step_is_in_a_named_phase():
    """phases.step_phases: the target lane's stages per phase, 'the rest' what no span covers, adding up to the
    measured step; the wait split into the draft lane's rollouts inside it and the rest (messages, overhead); the
    bench's table prints one line per decoder from the same split."""
    from mirror_core.events import SpanEvent, StepRecord
    from mirror_core.phases import step_phases

    ms = 1e-3
    spans, steps = [], []
    for i in (1, 2):
        t = 10 * ms * i
        spans += [SpanEvent("target", "target_verify", t, t + 3 * ms, i), SpanEvent("target", "accept", t + 3 * ms,
                  t + 3.1 * ms, i), SpanEvent("target", "wait", t + 3.1 * ms, t + 6 * ms, i),
                  SpanEvent("draft", "draft_rollout", t + 4 * ms, t + 5.5 * ms, i)]
        steps.append(StepRecord(i, (5, 5), 1, 1, 6, 2, False, None, t_end=t + 6.2 * ms))
    p = step_phases("sd", spans, steps, 2.0)
    assert [name for name, _ in p.parts] == ["verify", "accept", "wait for the draft", "the rest"]
    assert [round(v, 6) for _, v in p.parts] == [3.0, 0.1, 2.9, 0.2] and p.step_ms == pytest.approx(6.2)
    assert sum(v for _, v in p.parts) == pytest.approx(p.step_ms) and p.draft_in_wait_ms == pytest.approx(1.5)
    d = p.to_dict()
    assert d["messages and draft overhead in the wait"] == pytest.approx(1.4) and d["total"] == pytest.approx(6.2)
    assert step_phases("hf", spans, steps, None) is None and step_phases("sd", [], [], None) is None
    from mirror_core.bench.report import phase_lines

    report = SimpleNamespace(summary=[SimpleNamespace(name="sd", phases_ms=d), SimpleNamespace(name="hf", phases_ms=None)])
    assert phase_lines(report) == ["step by phase, sd: verify 3.00 + accept 0.10 + wait for the draft 2.90 + the rest "
                                   "0.20 = 6.20 ms (the wait: draft rollouts 1.50, messages and draft overhead 1.40)"]
    assert p.overhead_ms == pytest.approx(0.1 + 0.2 + 1.4)  # acceptance, the rest, the wait beyond the rollouts


def test_the_bench_holds_the_loads_prediction_and_mirror_sd_against_sd_by_part():
    from mirror_core.bench.report import load_model_lines, mirror_vs_sd_lines

    sd = {"verify": 5.0, "accept": 0.1, "wait for the draft": 2.0, "the rest": 0.1, "total": 7.2, "tau": 1.8}
    mirror = {"prefix": 4.0, "readout": 1.2, "suffix": 3.0, "verify": 0.0, "accept": 0.1, "wait for the draft": 1.0,
              "the rest": 0.2, "total": 9.5, "tau": 1.8}
    row = lambda name, x, phases: SimpleNamespace(name=name, speedup_vs_baseline=x, phases_ms=phases)  # noqa: E731
    report = SimpleNamespace(summary=[row("ar_all", 1.0, None), row("sd", 1.0, sd), row("sd_raw", 0.9, sd),
                                      row("mirror_raw", 0.8, mirror)],
                             settings={"chosen_settings": {"modelled_sd_speedup": 0.99, "modelled_speedup": 0.72}})
    assert load_model_lines(report) == ["the load's latency model (modelled at load, raw speculation, against the "
                                        "baseline): sd 0.99x modelled vs 0.90x measured (sd_raw, +10%); mirror 0.72x "
                                        "modelled vs 0.80x measured (mirror_raw, -10%)"]
    (line,) = mirror_vs_sd_lines(report)  # the largest excess first: the passes (7.0 vs 5.0), then the readout
    assert line.startswith("mirror_raw vs sd_raw: 5.28 vs 4.00 ms a token") and "the target's passes 7.00 vs 5.00; " \
        "the readout 1.20 vs 0.00; acceptance and the rest 0.30 vs 0.20; the wait for the draft 1.00 vs 2.00" in line
    faster = SimpleNamespace(summary=[row("sd_raw", 0.9, sd), row("mirror_raw", 1.2, {**mirror, "tau": 3.0})],
                             settings={})
    assert mirror_vs_sd_lines(faster) == [] and load_model_lines(faster) == []  # Mirror-SD ahead: no term to name
