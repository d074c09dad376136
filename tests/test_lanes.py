"""Two lanes: real overlap in CPU+CPU process mode, stop within a step, draft faults fall back to the target."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from mirror_core import (
    FaultPlan,
    LaneConfig,
    MirrorEngine,
    MirrorError,
    Request,
    SpecConfig,
    StepRecord,
    TokenEvent,
)
from mirror_core.lanes.channel import Channel, Message
from mirror_core.lanes.placement import auto_lanes
from mirror_core.metrics import interval_overlap
from testing.toy_models import build_pair, hf_greedy


@pytest.fixture(scope="module")
def heavy_pair(pair_root):
    """A target much heavier than its draft, so the branch batch can hide inside the target suffix."""
    return build_pair(pair_root, "llama", target_layers=8, hidden=256, seed=2)


@pytest.fixture(scope="module")
def process_engine(heavy_pair):
    lanes = auto_lanes(kind="process", dtype="float32")  # compared with transformers' float32 greedy
    with MirrorEngine.load(*heavy_pair, lanes) as engine:
        yield engine


def test_cpu_lanes_overlap_in_time(process_engine):
    spec = SpecConfig(3, 2, 4, zero_windows=False)  # a window every step: the branch batches to hide are every step's
    events = list(process_engine.stream(Request((1, 2, 3, 4), "mirror", 48, spec=spec)))
    end = events[-1]
    spans = [e for e in events if type(e).__name__ == "SpanEvent"]
    suffix = [(s.t0, s.t1) for s in spans if s.stage == "target_suffix"]
    branches = [(s.t0, s.t1) for s in spans if s.stage == "draft_branches"]
    assert branches and suffix
    assert interval_overlap(suffix, branches) > 0.0       # the draft ran while the target ran its suffix
    assert end.summary.draft_hidden_fraction > 0.05
    assert end.fallback is None


def test_automatic_lane_mapping_splits_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    cpu = auto_lanes()
    assert (cpu.kind, cpu.target_cpus, cpu.draft_cpus, cpu.target_threads) == ("process", (0, 1), (2, 3), 2)
    gpu_cpu = auto_lanes("cuda:0", "cpu")
    assert gpu_cpu.kind == "process" and gpu_cpu.target_cpus == (0,) and gpu_cpu.draft_cpus == (1, 2, 3)
    one_gpu = auto_lanes("cuda", "cuda:0")
    assert one_gpu.kind == "thread" and one_gpu.target_device == "cuda:0"
    two_gpu = auto_lanes("cuda:0", "cuda:1")
    assert two_gpu.kind == "process" and not two_gpu.target_cpus
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert auto_lanes().kind == "inline"


def test_stop_flag_ends_the_run_within_one_step(process_engine, heavy_pair):
    import threading

    stop = threading.Event()
    steps = 0
    tokens = []
    # every step a window (each waits for the draft lane), so the target lane cannot run many steps ahead of this
    # consumer: plain steps on a toy target take microseconds, and their records queue faster than they are read
    spec = SpecConfig(3, 2, 4, zero_windows=False)
    for event in process_engine.stream(Request((1, 2, 3), "mirror", 200, spec=spec), stop):
        if isinstance(event, StepRecord):
            steps += 1
            if steps == 2:
                stop.set()
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
        last = event
    assert last.stopped and last.summary.steps <= 3
    assert tokens == hf_greedy(heavy_pair[0], (1, 2, 3), len(tokens))
    _assert_lane_idle(process_engine)


def test_closing_the_generator_frees_the_lanes(process_engine):
    stream = process_engine.stream(Request((4, 5, 6), "mirror", 200, spec=SpecConfig(3, 2, 4)))
    for event in stream:
        if isinstance(event, StepRecord):
            break
    stream.close()
    _assert_lane_idle(process_engine)
    end = process_engine.generate(Request((4, 5, 6), "mirror", 8))  # the engine still serves
    assert len(end.token_ids) == 8


def _assert_lane_idle(engine):
    box = engine.lane.channel.to_worker
    assert box.idle() and engine.lane.outstanding == 0


@pytest.mark.parametrize("kind,mode", [("inline", "raise"), ("thread", "raise"),
                                       pytest.param("process", "raise", marks=pytest.mark.slow),  # a respawn: slow tier
                                       pytest.param("process", "exit", marks=pytest.mark.slow)])
def test_draft_fault_finishes_on_the_target_alone(pairs, kind, mode):
    target, draft = pairs["llama"]
    ref = hf_greedy(target, (7, 8, 9), 40)
    for fault_step in (0, 1, 3) if mode == "raise" else (2,):  # each "exit" costs a process respawn
        with MirrorEngine.load(target, draft, LaneConfig(kind=kind, dtype="float32", fault=FaultPlan(fault_step, mode))) as engine:
            for decoder in ("sd", "mirror", "mirror"):  # the lane recovers for each request (an exited one respawns)
                end = engine.generate(Request((7, 8, 9), decoder, 40, spec=SpecConfig(3, 2, 2)))
                assert list(end.token_ids) == ref
                assert end.fallback and "draft lane failed" in end.fallback
    with MirrorEngine.load(target, draft, LaneConfig(kind=kind, dtype="float32")) as engine:
        end = engine.generate(Request((7, 8, 9), "mirror", 40, spec=SpecConfig(3, 2, 2)))
        assert list(end.token_ids) == ref and end.fallback is None


def test_the_fault_hook_is_read_from_the_environment_once_when_an_engine_loads(pairs, monkeypatch):
    target, draft = pairs["llama"]
    monkeypatch.setenv("MIRROR_FAULT_DRAFT_AT_STEP", "1")
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline")) as engine:
        assert engine.info.lanes.fault == FaultPlan(1, "raise")
        monkeypatch.delenv("MIRROR_FAULT_DRAFT_AT_STEP")  # too late: the plan was fixed at load
        end = engine.generate(Request((7, 8, 9), "mirror", 20, spec=SpecConfig(3, 2, 2)))
        assert end.fallback and "draft lane failed at step 1" in end.fallback
    monkeypatch.setenv("MIRROR_FAULT_DRAFT_AT_STEP", "soon")
    with pytest.raises(MirrorError, match="MIRROR_FAULT_DRAFT_AT_STEP must be a step number"):
        MirrorEngine.load(target, draft, LaneConfig(kind="inline"))


def test_shared_memory_channel_delivers_in_order():
    ch = Channel(cap_i64=16, cap_f32=4)
    peer = Channel(16, 4, name=ch.name)
    try:
        for k in range(5):
            ch.to_worker.send(Message(1, np.arange(k, dtype=np.int64), np.zeros(0), np.zeros(0, np.float32)),
                              lambda: True, 1)
            msg = peer.to_worker.recv(lambda: True, 1)
            assert msg.i64.tolist() == list(range(k))
        with pytest.raises(ValueError):
            ch.to_worker.send(Message(1, np.arange(17, dtype=np.int64), np.zeros(0), np.zeros(0, np.float32)),
                              lambda: True, 1)
    finally:
        peer.close()
        ch.close()


def test_an_idle_reader_dozes_on_the_doorbell_and_the_writer_rings_it(monkeypatch):
    """wait_until spins, then sleeps, then (idle for IDLE_S) dozes; a send to a dozing reader rings its bell."""
    from mirror_core.lanes import channel

    clock = iter([0.0, channel.SPIN_S / 2, channel.SPIN_S * 2, channel.IDLE_S + 1, channel.IDLE_S + 2])
    phases: list[str] = []
    fake_time = SimpleNamespace(perf_counter=lambda: next(clock), sleep=lambda s: phases.append(f"sleep {s}"))
    monkeypatch.setattr(channel, "time", fake_time)  # the channel module's clock only
    monkeypatch.setattr(channel, "yield_cpu", lambda: phases.append("spin"))
    checks = iter([False, False, False, False, True])
    channel.wait_until(lambda: next(checks), lambda: True, 60, doze=lambda: phases.append("doze"))
    assert phases == ["spin", f"sleep {channel.SLEEP_S}", "doze", "doze"]
    phases.clear()  # a reader whose cores the target is using (recv(asleep=True)): the doorbell at once, no spin
    clock, checks = iter([0.0, 0.001, 0.002]), iter([False, False, True])
    channel.wait_until(lambda: next(checks), lambda: True, 60, doze=lambda: phases.append("doze"), asleep=True)
    assert phases == ["doze", "doze"]
    monkeypatch.undo()

    ch = channel.Channel(16, 4)
    try:
        box = ch.to_worker
        box.header[channel.DOZING] = 1  # as _doze sets it before blocking on the bell
        box.send(Message(1, np.arange(3), np.zeros(0), np.zeros(0, np.float32)), lambda: True, 1)
        assert box.bell.acquire(timeout=5)  # the writer rang
        box.header[channel.DOZING] = 0
        assert box.recv(lambda: True, 1).i64.tolist() == [0, 1, 2]
    finally:
        ch.close()


def test_a_reader_asleep_is_woken_by_every_message_without_a_lost_ring():
    """recv(asleep=True) sleeps on the doorbell at once; the barriers on both sides (channel.full_barrier) mean no ring
    is lost to the race between DOZING and SEQ, so no round trip waits out DOZE_S (300 round trips, as a run's)."""
    import threading

    from mirror_core.lanes import channel

    ch = channel.Channel(16, 4)
    empty = (np.zeros(0), np.zeros(0, np.float32))

    def reader():
        for _ in range(300):
            msg = ch.to_worker.recv(lambda: True, 5, asleep=True)
            ch.to_target.send(Message(2, msg.i64 + 1, *empty), lambda: True, 5)

    worker = threading.Thread(target=reader, daemon=True)
    worker.start()
    try:
        worst = 0.0
        for i in range(300):
            time.sleep(0.0005 * (i % 3))  # the reader is spinning, dozing or about to doze when the message comes
            t0 = time.perf_counter()
            ch.to_worker.send(Message(1, np.array([i]), *empty), lambda: True, 5)
            assert ch.to_target.recv(lambda: True, 5).i64.tolist() == [i + 1]
            worst = max(worst, time.perf_counter() - t0)
        assert worst < channel.DOZE_S / 2, worst
    finally:
        worker.join(5)
        ch.close()


def test_ar_and_sd_take_every_core_only_where_the_load_measured_it_faster():
    """LaneConfig.serial_cores "all" runs ar and sd on every core when every alternated pair of timings at load put
    the whole machine ahead of the target lane; a split verdict, a slower machine or "lane" keeps the lane's cores."""
    from mirror_core.config import LaneConfig
    from mirror_core.pair import _serial_cpus
    from mirror_core.machine import usable_cpus
    from mirror_core.records import WholeMachine

    lanes = LaneConfig(target_cpus=(0,), draft_cpus=(1,))
    faster = WholeMachine(1, 6.0, 2, 3.5, (0.55, 0.6, 0.58, 0.6))
    assert _serial_cpus(lanes, faster) == usable_cpus()
    assert _serial_cpus(lanes, WholeMachine(1, 6.0, 2, 5.9, (0.9, 1.1, 0.95, 1.05))) == ()  # not settled
    assert _serial_cpus(lanes, WholeMachine(1, 6.0, 2, 7.0, (1.1, 1.2, 1.15, 1.2))) == ()   # slower
    assert _serial_cpus(LaneConfig(target_cpus=(0,), serial_cores="lane"), faster) == ()
    assert _serial_cpus(lanes, None) == ()
    held = WholeMachine(1, 3.2, 2, 1.0, (0.31, 0.3, 0.32, 0.3))  # 3.2× faster on 2 cores: the lane's timing held up
    assert held.settled and not held.bounded and _serial_cpus(lanes, held) == ()
    assert not WholeMachine(1, 3.2, 2, 270.8, (84.0, 83.0)).bounded and faster.bounded


def test_the_prefill_takes_the_draft_lanes_cores_only_while_they_wait_for_its_features():
    """A feature-reading draft in a process on the CPU prefills only on the prompt's features, so the target's
    prefill on the exact kernel runs on both lanes' cores; a token draft (it prefills at once), a torch target (its
    bits may follow its threads), a thread lane or an accelerator keep the target lane's own cores."""
    from dataclasses import replace

    from mirror_core.lanes import prefill_cpus

    lanes = LaneConfig(target_cpus=(0,), draft_cpus=(1,))
    assert prefill_cpus(lanes, features=True, kernel=True) == (0, 1)
    assert prefill_cpus(lanes, features=False, kernel=True) == ()
    assert prefill_cpus(lanes, features=True, kernel=False) == ()
    assert prefill_cpus(replace(lanes, kind="thread"), features=True, kernel=True) == ()
    assert prefill_cpus(replace(lanes, draft_device="cuda:0", draft_cpus=()), features=True, kernel=True) == ()


def test_the_whole_machine_is_timed_again_while_it_lies_outside_its_bounds(monkeypatch):
    """time_whole_machine: a timing where the whole machine's step is more than WHOLE_MACHINE_BOUND times the lane's
    (another process held a core) is timed again, up to WHOLE_MACHINE_TRIES times; the first within the bounds is
    kept; none within: the last one, marked out of bounds (so no baseline or correction is read from it)."""
    from types import SimpleNamespace

    from mirror_core import target_timing
    from mirror_core.config import LaneConfig
    from mirror_core.machine import usable_cpus

    if len(usable_cpus()) < 2:
        pytest.skip("needs two usable cores")
    lanes = LaneConfig(target_cpus=usable_cpus()[:1], draft_cpus=usable_cpus()[1:], target_threads=1)
    runner = SimpleNamespace(kernel=SimpleNamespace(library=None))
    monkeypatch.setattr(target_timing, "lane_read_gbs", lambda runner: 20.0)
    for steps, kept, bounded in (([3.0, 270.0] * 4 + [3.0, 2.0] * 4, 1, True),   # held, then clean
                                 ([3.0, 270.0] * 12, 2, False)):                  # held every time
        ms = iter(steps)
        monkeypatch.setattr(target_timing, "step_ms", lambda runner: next(ms))
        whole = target_timing.time_whole_machine(runner, lanes)
        assert (whole.retimed, whole.bounded, whole.read_gbs) == (kept, bounded, 20.0)
        assert next(ms, None) is None  # every try ran its pairs, and none more
