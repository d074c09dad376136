"""Per-lane dtype calibration (runners/calibrate.py): the choice follows the timings, is cached, can be forced,
and whatever the target runs in, every decoder still emits exactly what AR emits."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request, SpecConfig
from mirror_core.cli import main
from mirror_core.runners import build_runner
from mirror_core.runners import calibrate as cal_mod
from mirror_core.records import LONG_ROWS, ROOFLINE_ROWS, Calibration, Timing
from mirror_core.runners.calibrate import calibrate_draft, calibrate_target, candidates
from mirror_core.runners.exactness import check_rows
from mirror_core.runners.protocol import KernelChoice, TargetRunner, WeightFormats
from testing.toy_models import prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "assets", "default_pair")


def _runner(path: str):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # as loading.load_model on a CPU
    return model, build_runner(model, int(model.config.vocab_size))


def _expected(cal: Calibration, names: list[str], shape: str) -> str:
    """The fastest timed dtype for the shape, taken over float32 only when at least 5 % faster (timing noise
    otherwise)."""
    names = cal.timed(names)
    fastest = min(names, key=lambda n: cal.ms(n, shape))
    return fastest if cal.ms(fastest, shape) < 0.95 * cal.ms("float32", shape) else "float32"


def test_the_target_takes_the_pairs_format_and_the_next_load_reads_the_cache(pairs, tmp_path, monkeypatch):
    """The target's format is the pair's (a float target's own float32; int8 for a GGUF target on the kernel), the
    same on every machine: only it is timed, so no timing can change the text a prompt gives."""
    monkeypatch.setenv("MIRROR_SD_CACHE", str(tmp_path))
    model, runner = _runner(pairs["llama"][0])
    cal, rows = calibrate_target(runner, runner.vocab_size, "auto", model.config)
    assert cal_mod.pair_format(runner) == "float32" and "pair's format" in cal.note
    timed = {("float32", s) for s in ("step", "window")}
    by_rows = {(cal.sequence, f"rows{m}") for m in (*range(1, ROOFLINE_ROWS + 1), *LONG_ROWS)}  # chosen dtype only
    assert {(t.dtype, t.shape) for t in cal.table} == timed | by_rows
    assert len(cal.rows_ms(cal.sequence)) == ROOFLINE_ROWS and cal.read_gbs > 0 and cal.peak_gflops > 0
    assert {n for n, _ in cal.exact} == {"float32"}  # the row check is kept with it
    assert all(t.ms > 0 for t in cal.table) and not cal.cached and cal.seconds > 0
    assert cal.sequence == cal.rows == "float32"
    assert runner.sequence_dtype == runner.rows_dtype == cal_mod.DTYPES[cal.sequence]
    assert rows.checked and rows.invariant and runner.row_plan == rows.plan
    assert len(os.listdir(os.path.join(tmp_path, "calibration"))) == 1

    model2, runner2 = _runner(pairs["llama"][0])
    again, rows2 = calibrate_target(runner2, runner2.vocab_size, "auto", model2.config)
    assert again.cached and again.seconds == 0 and again.table == cal.table and again.sequence == cal.sequence
    assert rows2.source == "cached" and rows2.plan == rows.plan and rows2.invariant

    (path,) = [os.path.join(tmp_path, "calibration", f) for f in os.listdir(os.path.join(tmp_path, "calibration"))]
    with open(path, "w") as f:
        f.write("{not json")  # a damaged cache file is ignored and rewritten, never an error
    model3, runner3 = _runner(pairs["llama"][0])
    third, _ = calibrate_target(runner3, runner3.vocab_size, "auto", model3.config)
    assert not third.cached and Calibration.from_json(open(path).read()).table == third.table


def test_a_cached_table_out_of_step_with_todays_lane_is_timed_again(pairs, tmp_path, monkeypatch):
    """A table cached while another process held a core (its step 2× today's) is timed anew at the next load, where
    the load's fresh step on the same cores says so; a table within STALE of it either way is read as it is."""
    from mirror_core import target_timing
    from mirror_core.machine import usable_cpus
    from mirror_core.records import WholeMachine
    from mirror_core.target_timing import time_target

    cal = Calibration("target", "auto", "int8", "int8", (Timing("int8", "step", 7.5), Timing("int8", "rows1", 7.4)),
                      cached=True)
    assert cal_mod.cached_step_is_stale(cal, 5.8) and cal_mod.cached_step_is_stale(cal, 12.0)
    assert not cal_mod.cached_step_is_stale(cal, 7.0) and not cal_mod.cached_step_is_stale(replace(cal, cached=False), 5.8)
    cpus = usable_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two usable cores (the lane's step is timed beside the whole machine's)")
    monkeypatch.setenv("MIRROR_SD_CACHE", str(tmp_path))
    lanes = LaneConfig(kind="inline", target_cpus=cpus[:1], draft_cpus=cpus[1:], target_threads=1, draft_threads=1)
    model, runner = _runner(pairs["llama"][0])
    first = time_target(runner, runner.vocab_size, lanes, model.config).dtype
    step = first.ms("float32", "step")  # the load's fresh step, as a quiet machine gives it (a busy one: no re-time)
    monkeypatch.setattr(target_timing, "time_whole_machine", lambda *a: WholeMachine(1, step, len(cpus), step))
    (path,) = [os.path.join(tmp_path, "calibration", f) for f in os.listdir(os.path.join(tmp_path, "calibration"))]
    slow = replace(first, table=tuple(replace(t, ms=2 * t.ms) for t in first.table))  # timed under load
    with open(path, "w") as f:
        f.write(slow.to_json())
    again = time_target(runner, runner.vocab_size, lanes, model.config)
    assert not again.dtype.cached and again.dtype.ms("float32", "step") < slow.ms("float32", "step")
    assert Calibration.from_json(open(path).read()).table == again.dtype.table  # the new table replaces the stale one


def test_the_draft_chooses_per_shape(pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("MIRROR_SD_CACHE", str(tmp_path))
    for path in (pairs["llama"][1], os.path.join(SHIPPED, "draft_ss")):  # an AR draft and an SS draft
        model, runner = _runner(path)
        cal = calibrate_draft(runner, "auto", model.config)
        assert {t.shape for t in cal.table} == {"step", "rows"}
        assert cal.sequence == _expected(cal, candidates(runner), "step")
        assert cal.rows == _expected(cal, candidates(runner), "rows")
        assert runner.sequence_dtype == cal_mod.DTYPES[cal.sequence] and runner.rows_dtype == cal_mod.DTYPES[cal.rows]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_forced_dtype_is_used_alone(pairs, dtype):
    model, runner = _runner(pairs["qwen2"][0])
    cal, rows = calibrate_target(runner, runner.vocab_size, dtype, model.config)
    assert cal.requested == cal.sequence == dtype and {t.dtype for t in cal.table} == {dtype}
    assert runner.sequence_dtype == cal_mod.DTYPES[dtype] and rows.invariant
    # only the matmul weights changed: the residual stream, cache and logits keep the loaded float32
    assert runner.dtype == torch.float32 and runner.forward(runner.new_cache(), [1, 2, 3]).dtype == torch.float32


def test_bfloat16_matmuls_change_the_logits_a_little_and_the_target_stays_one_function(pairs):
    model, runner = _runner(pairs["llama"][0])
    ids = [(5 * i + 1) % 90 for i in range(20)]
    f32 = runner.forward(runner.new_cache(), ids)
    runner.set_dtypes(torch.bfloat16)
    bf16 = runner.forward(runner.new_cache(), ids)
    assert not torch.equal(f32, bf16) and torch.allclose(f32, bf16, atol=0.1)
    assert check_rows(runner, runner.vocab_size).invariant


def test_the_generic_runner_keeps_its_loaded_dtype_or_takes_the_forced_one(pairs):
    model = AutoModelForCausalLM.from_pretrained(pairs["gpt2"][0]).eval()
    runner = build_runner(model, int(model.config.vocab_size))
    cal, _ = calibrate_target(runner, runner.vocab_size, "auto", model.config)
    assert cal.sequence == "float32" and not cal.table and "not timed" in cal.note
    cal, _ = calibrate_target(runner, runner.vocab_size, "bfloat16", model.config)
    assert cal.sequence == "bfloat16" and next(model.parameters()).dtype == torch.bfloat16


def test_each_target_runner_declares_what_it_can_do_and_the_calibration_reads_it(pairs):
    """The fast runner and the generic one declare their kernel, formats, row plans and weight stream (no probing);
    a format a runner does not offer is a clear error (int8 needs a GGUF target's blocks on the kernel)."""
    model = AutoModelForCausalLM.from_pretrained(pairs["llama"][0], dtype=torch.float32).eval()
    fast = build_runner(model, int(model.config.vocab_size), kernel="torch")
    assert isinstance(fast, TargetRunner) and fast.kernel == KernelChoice(None, "asked for: --kernel torch")
    assert fast.formats == WeightFormats((torch.float32, torch.bfloat16, torch.float16)) and fast.plans_rows
    assert fast.weight_stream.storage == "float32" and fast.weight_stream.nbytes == 4 * fast.weight_stream.params
    assert candidates(fast)[:2] == ["float32", "bfloat16"]
    gpt2 = AutoModelForCausalLM.from_pretrained(pairs["gpt2"][0]).eval()
    hf = build_runner(gpt2, int(gpt2.config.vocab_size))
    assert isinstance(hf, TargetRunner) and hf.kernel.library is None and hf.kernel.reason
    assert hf.formats.whole_model and hf.formats.offered[0] == torch.float32 and torch.int8 not in hf.formats.offered
    assert hf.weight_stream is None and not hf.plans_rows and hf.row_plan is None
    with pytest.raises(MirrorError, match="--dtype int8 runs a GGUF target's own blocks"):
        calibrate_target(hf, hf.vocab_size, "int8", gpt2.config)
    assert next(gpt2.parameters()).dtype == torch.float32  # refused before anything moved


@pytest.mark.parametrize("arch,dtype", [("llama", "auto"), ("qwen3", "bfloat16")] + [  # the rest: the slow tier
    pytest.param(a, d, marks=pytest.mark.slow) for a, d in (("llama", "bfloat16"), ("qwen3", "auto"), ("shipped", "auto"),
                                                            ("shipped", "bfloat16"))])
def test_every_decoder_equals_ar_at_the_chosen_dtype(pairs, arch, dtype):
    target, draft = ((os.path.join(SHIPPED, "target"), os.path.join(SHIPPED, "draft_ar")) if arch == "shipped"
                     else pairs[arch])
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype=dtype, target_threads=1)) as engine:
        info = engine.info
        assert info.target_dtype.requested == dtype and info.draft_dtype.requested == dtype
        assert info.target_rows.invariant
        vocab = min(90, info.vocab_size)
        for i, prompt in enumerate(prompts(3, seed=7, vocab=vocab)):
            spec = SpecConfig(gamma=2 + i, kappa=1 + i, exit_layer=1 + i % 2)
            ar = engine.generate(Request(prompt, "ar", 20, spec=spec)).token_ids
            for decoder in ("sd", "mirror"):
                assert engine.generate(Request(prompt, decoder, 20, spec=spec)).token_ids == ar, (decoder, i)


def test_the_format_changes_on_the_loaded_pair_and_every_decoder_follows_it(pairs):
    """MirrorEngine.set_target_format: the target re-timed in another format with the draft lane as it was; the
    tokens are a fresh load's in that format, every decoder AR's; auto goes back to the pair's own. A format the
    target does not offer, or a pair that freed its loaded weights, is refused with one line."""
    target, draft = pairs["llama"]
    lanes = LaneConfig(kind="inline", target_threads=1, draft_threads=1)
    prompt, spec = (3, 1, 4, 1, 5), SpecConfig(gamma=3, kappa=2)
    tokens = lambda e, decoder="ar": e.generate(Request(prompt, decoder, 16, spec=spec)).token_ids  # noqa: E731
    with MirrorEngine.load(target, draft, LaneConfig(**{**lanes.__dict__, "dtype": "bfloat16"})) as fresh:
        bf16 = tokens(fresh)
    with MirrorEngine.load(target, draft, LaneConfig(**{**lanes.__dict__, "keep_formats": True})) as engine:
        info, lane = engine.info, engine.lane
        quantised = {"q8_0"} if engine.target.kernel.library is not None else set()  # a float target on the kernel
        assert info.pair_format == "float32" and set(info.target_formats) == {"float32", "float16", "bfloat16"} | quantised
        f32 = tokens(engine)
        assert engine.format_change("bfloat16") and not engine.format_change("auto") and engine.switches_formats
        engine.set_target_format("bfloat16")
        now = engine.info.target_dtype
        assert engine.lane is lane and engine.info.draft_dtype == info.draft_dtype  # the draft lane as it was
        assert (now.sequence, now.requested, now.note) == ("bfloat16", "bfloat16", cal_mod.ASKED_WHY)
        assert engine.info.target_rows.invariant and engine.info.roofline.weight_format.startswith("bfloat16")
        assert tokens(engine) == bf16 and all(tokens(engine, d) == bf16 for d in ("sd", "mirror"))
        engine.set_target_format("auto")
        assert engine.info.target_dtype.sequence == "float32" and tokens(engine) == f32
        with pytest.raises(MirrorError, match="offers the formats .* not int8 .*GGUF"):
            engine.set_target_format("int8")
        with pytest.raises(MirrorError, match="format must be one of"):
            engine.format_change("float64")
    with MirrorEngine.load(target, None, lanes) as frozen:
        with pytest.raises(MirrorError, match="cannot change its format once loaded"):
            frozen.set_target_format("bfloat16")
        frozen.set_target_format("float32")  # the function it computes already: nothing to do


def test_the_whole_machine_is_timed_again_on_the_loaded_pair_and_the_page_says_so(pairs):
    """MirrorEngine.recheck_whole_machine: the whole machine's step beside the lane's timed again (a comparison on the
    page does it first, and says so), the target's format and row check as they were."""
    from mirror_core.machine import usable_cpus
    from testing.reliability import page_values
    from ui.loader import EngineLoader
    from ui.session import Session
    from ui.settings import settings_from_ui
    from ui.streaming import RECHECK, run_comparison

    cpus = usable_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    lanes = LaneConfig(kind="inline", target_cpus=cpus[:1], draft_cpus=cpus[1:], target_threads=1, draft_threads=1)
    loader = EngineLoader(lanes, warmup=False)
    try:
        engine = loader.get(*pairs["llama"])
        info = engine.info
        assert info.whole_machine is not None and info.whole_machine.lane_cores == 1
        ticks = list(run_comparison(loader, Session(), settings_from_ui(page_values(
            prompt="1, 2, 3", target=pairs["llama"][0], draft=pairs["llama"][1], decoders=["ar"], max_new_tokens=4,
            live_plots=False)), sleep=lambda s: None))
        assert RECHECK in [t.status for t in ticks] and "Done" in ticks[-1].status
        now = engine.info
        assert now.whole_machine is not info.whole_machine and now.whole_machine.all_cores == len(cpus)
        assert now.target_dtype is info.target_dtype and now.target_rows is info.target_rows
    finally:
        loader.close()


def test_the_run_settings_carry_both_lanes_choices(pairs):
    with MirrorEngine.load(*pairs["llama"], LaneConfig(kind="inline", target_threads=1)) as engine:
        start = next(iter(engine.stream(Request((1, 2, 3), "mirror", 4))))
        settings = start.settings
        assert settings.target_dtype == engine.info.target_dtype and settings.draft_dtype == engine.info.draft_dtype
        assert json.loads(json.dumps(settings.to_dict()))["target_dtype"]["sequence"] in cal_mod.DTYPES


def test_the_cli_reports_each_lanes_dtype_and_refuses_a_bad_one(pairs, capsys):
    target, draft = pairs["llama"]
    assert main(["generate", "--target", target, "--draft", draft, "--prompt-ids", "1,2", "--max-new-tokens", "4",
                 "--lane", "inline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["calibration"]["target"]["requested"] == "auto" and out["dtype"]["target"] in cal_mod.DTYPES
    assert out["dtype"]["draft"].split()[0] in cal_mod.DTYPES
    assert main(["generate", "--target", target, "--prompt-ids", "1", "--dtype", "float64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "dtype must be one of auto, float32, bfloat16, float16, int8" in err
    with pytest.raises(MirrorError, match="dtype must be one of"):
        LaneConfig(dtype="half")


def test_window_ms_is_timed_or_linear_between_timed_row_counts():
    """The context draft's cost by rows (PairInfo.window_steps) reads Calibration.window_ms."""
    rows = {**{m: 10.0 + m for m in range(1, ROOFLINE_ROWS + 1)}, 12: 30.0, 17: 50.0}
    cal = Calibration("target", "auto", "float32", "float32",
                      tuple(Timing("float32", f"rows{m}", ms) for m, ms in rows.items()))
    assert cal.window_ms("float32", 5) == 15.0 and cal.window_ms("float32", 17) == 50.0
    assert cal.window_ms("float32", 10) == pytest.approx(18.0 + (30.0 - 18.0) * 2 / 4)
    assert cal.window_ms("float32", 15) == pytest.approx(30.0 + 20.0 * 3 / 5)
    assert cal.window_ms("float32", 18) is None and cal.window_ms("bfloat16", 3) is None


def test_ar_runs_where_the_last_timing_of_the_machine_put_it(pairs):
    """The target lane reads PairInfo.serial_cpus per request: a recheck that finds every core faster moves the next
    ar run there (the page's AR then runs as the CLI's), not only the runs of a pair loaded after it."""
    import os
    from dataclasses import replace

    from mirror_core.machine import usable_cpus

    cpus = usable_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    lanes = LaneConfig(kind="inline", target_cpus=cpus[:1], draft_cpus=cpus[1:], target_threads=1, draft_threads=1,
                       serial_cores="all")
    with MirrorEngine.load(*pairs["llama"], lanes) as engine:
        seen, run = [], engine._run
        engine._run = lambda *a: (seen.append(os.sched_getaffinity(0)), run(*a))
        for serial in ((), tuple(cpus)):
            engine.info = replace(engine.info, serial_cpus=serial)
            list(engine.stream(Request((1, 2, 3), "ar", 2)))
        assert seen == [set(cpus[:1]), set(cpus)]


def test_mirror_borrows_the_draft_lanes_cores_for_the_layers_before_the_exit(pairs):
    """RunSettings.lend_cpus: mirror's target runs layers 1..ℓ_e on every core the draft lane lends and the suffix on
    its own lane's, its tokens ar's all the same; no lent cores, the lane's for both; ar and sd never borrow."""
    import os
    from dataclasses import replace

    from mirror_core.machine import usable_cpus

    cpus = usable_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two usable cores")
    lanes = LaneConfig(kind="inline", target_cpus=cpus[:1], draft_cpus=cpus[1:], target_threads=1, draft_threads=1)
    with MirrorEngine.load(*pairs["llama"], lanes) as engine:
        seen, to_exit, finish = [], engine.target.forward_to_exit, engine.target.finish_pass
        engine.target.forward_to_exit = lambda *a: (seen.append(("exit", os.sched_getaffinity(0))), to_exit(*a))[1]
        engine.target.finish_pass = lambda *a: (seen.append(("suffix", os.sched_getaffinity(0))), finish(*a))[1]
        ar = [e for e in engine.stream(Request((1, 2, 3), "ar", 12))][-1].token_ids
        for lend in ((), tuple(cpus)):
            engine.info = replace(engine.info, lend_cpus=lend)
            seen.clear()
            end = list(engine.stream(Request((1, 2, 3), "mirror", 12, spec=SpecConfig(2, 2))))[-1]
            assert end.token_ids == ar and end.fallback is None
            assert {frozenset(w) for part, w in seen if part == "exit"} == {frozenset(lend or cpus[:1])}, seen
            assert {frozenset(w) for part, w in seen if part == "suffix"} == {frozenset(cpus[:1])}, seen
        seen.clear()
        list(engine.stream(Request((1, 2, 3), "sd", 12, spec=SpecConfig(2, 2))))
        assert {frozenset(w) for _, w in seen} <= {frozenset(cpus[:1])}, seen  # sd: serial_cpus (), the lane's
