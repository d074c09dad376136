"""Faults: ≥ 50 seeded draft-lane faults each equal `ar`; a failing target lane keeps its committed tokens;
a client that goes away frees the lanes within one step."""
from __future__ import annotations

import threading

import pytest

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig, StepRecord
from testing.reliability import (
    INLINE,
    FaultEngines,
    TargetFault,
    WatchedLoad,
    cancel_trial,
    close_demo,
    disconnect_trial,
    fault_trial,
    page_values,
    process_fault_mode,
    run_args,
)
from testing.net import free_port
from testing.toy_models import build_pair

pytestmark = pytest.mark.slow  # fault injection and process respawns (the slow tier)

N_FAULTS = 54          # seeded trials on inline/thread lanes (injected raises)


@pytest.fixture(scope="module")
def pair(pair_root):
    return build_pair(pair_root, "llama")


@pytest.fixture(scope="module")
def engines(pair):
    with (MirrorEngine.load(*pair, INLINE) as inline,
          MirrorEngine.load(*pair, LaneConfig(kind="thread", target_threads=1, draft_threads=1)) as thread):
        yield {"inline": inline, "thread": thread}


def test_seeded_draft_faults_finish_on_the_target_with_the_ar_output(pair):
    lanes = {"inline": INLINE, "thread": LaneConfig(kind="thread", target_threads=1, draft_threads=1)}
    with FaultEngines(*pair, lanes) as engines:
        trials = [fault_trial(engines, seed, ("inline", "thread")) for seed in range(N_FAULTS)]
    failed = [t for t in trials if not t.ok]
    assert not failed, failed[:3]
    assert {t.kind for t in trials} == {"inline", "thread"} and {t.decoder for t in trials} == {"sd", "mirror"}
    assert len({t.step for t in trials}) == 4


def test_draft_process_faults_and_kills_match_ar(pair):
    """A real draft process: one seeded kill (the process exits) and one seeded raise; the killed lane respawns."""
    with FaultEngines(*pair, {"process": LaneConfig(kind="process", target_threads=1, draft_threads=1)}) as engines:
        trials = []
        for mode in ("exit", "raise"):  # each kill costs a respawn (seconds), so one of each here; the soak does more
            seed = next(s for s in range(1000) if process_fault_mode(s) == mode)
            trials.append(fault_trial(engines, seed, ("process",)))
        assert all(t.ok for t in trials), trials
        killed = next(e for (_, plan), e in engines.engines.items() if plan.mode == "exit")
        end = killed.generate(Request((1, 2, 3), "mirror", 1))  # one token: no step reaches the fault
        assert end.fallback is None and killed.lane.proc.is_alive()  # respawned for the next request


def test_target_lane_failure_stops_with_an_error_and_keeps_the_committed_tokens(engines):
    engine = engines["inline"]
    ref = engine.generate(Request((5, 6, 7), "ar", 30, stop_at_eos=False))
    for decoder in ("ar", "sd", "mirror"):
        with TargetFault(engine, at_call=4):
            end = engine.generate(Request((5, 6, 7), decoder, 30, spec=SpecConfig(3, 2), stop_at_eos=False))
        assert end.error and "injected target-lane fault" in end.error
        assert 0 < len(end.token_ids) < 30 and list(end.token_ids) == list(ref.token_ids[:len(end.token_ids)])
    assert engine.generate(Request((5, 6, 7), "mirror", 30, stop_at_eos=False)).token_ids == ref.token_ids


def test_target_lane_failure_in_the_app_shows_the_error_and_the_kept_tokens(pair):
    from ui import EngineLoader
    from ui.session import Session
    from ui.settings import settings_from_ui
    from ui.streaming import run_comparison

    loader = EngineLoader(INLINE)
    try:
        engine = loader.get(*pair)
        settings = settings_from_ui(page_values(prompt="5, 6, 7", target=pair[0], draft=pair[1],
                                                decoders=["ar", "mirror"], gamma=3, kappa=2, max_new_tokens=30))
        session = Session()
        with TargetFault(engine, at_call=6):
            list(run_comparison(loader, session, settings))
        ar = session.runs["ar"]
        kept = len(ar.end.token_ids)
        assert ar.end.error and 0 < kept < 30 and len(ar.pieces) == kept          # shown in the token view
        assert "target lane failed" in session.status and f"{kept} tokens committed" in session.status
        assert "Mirror-SD" not in session.status and session.runs["mirror"].end.error is None  # the next decoder ran
        assert session.trace_path is not None                                      # what ran is exported
        session.close()
    finally:
        loader.close()


def test_a_cancelled_or_disconnected_client_frees_the_lanes_within_one_step(pair):
    """gradio_client cancel, then a client process killed mid-run, each sent while the run is held at a known step
    (WatchedLoad.hold: the run cannot end before the cancel arrives, however fast the CPU): the run is cut, each lane
    works on at most the step in flight after the cancel, and the lanes are free."""
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    watch = WatchedLoad()
    loader = EngineLoader(INLINE, load=watch, warmup=False)
    demo = build_demo(loader, default_presets("/nonexistent", *pair), [])
    demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    try:
        engine = loader.get(*pair)
        long_run = page_values(prompt="1, 2, 3", target=pair[0], draft=pair[1], decoders=["sd", "mirror"], gamma=1,
                               kappa=1, max_new_tokens=480)
        cut = cancel_trial(demo.local_url, watch, run_args(long_run), decoder="sd", step=5)
        assert cut.ok, cut.detail                                       # gradio_client's cancel
        assert not engine._lock.locked() and engine._jobs.empty()
        assert len(engine.generate(Request((1, 2), "mirror", 8)).token_ids) == 8
        cut = disconnect_trial(demo.local_url, watch, run_args({**long_run, "decoders": ["mirror"], "branch_budget": 0}),
                               decoder="mirror")
        assert cut.ok, cut.detail                                       # a client process killed mid-run
    finally:
        close_demo(demo)
        loader.close()


def test_stop_flag_checked_every_step_leaves_no_thread_behind(engines):
    before = set(threading.enumerate())
    stop = threading.Event()
    for event in engines["thread"].stream(Request((1, 2), "mirror", 500, stop_at_eos=False), stop):
        if isinstance(event, StepRecord) and event.step == 3:
            stop.set()
        last = event
    assert last.stopped and last.summary.steps <= 4
    assert not set(threading.enumerate()) - before  # the run started no thread that outlives it
