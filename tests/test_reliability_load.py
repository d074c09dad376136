"""Load: 8 gradio_client users at once each get their solo output and see their queue position;
back-to-back runs through the app's handler keep RSS, threads and processes flat (short CI version)."""
from __future__ import annotations

import pytest

from testing.net import free_port
from testing.reliability import INLINE, back_to_back, close_demo, concurrent_clients
from testing.toy_models import build_pair

pytestmark = pytest.mark.slow  # concurrency and soak checks (the slow tier)

N_CLIENTS = 8
N_RUNS, N_WARMUP = 40, 10     # scripts/soak.py --long runs 200


@pytest.fixture(scope="module")
def pair(pair_root):
    return build_pair(pair_root, "llama")


def test_eight_concurrent_clients_get_their_solo_outputs_and_queue_positions(pair, tmp_path):
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    loader = EngineLoader(INLINE)
    demo = build_demo(loader, default_presets(str(tmp_path), *pair), [])
    demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    try:
        result = concurrent_clients(demo.local_url, *pair, N_CLIENTS)
        assert result.ok == N_CLIENTS, result.errors
        assert result.max_rank >= 1  # waiting clients were told their place in the queue
    finally:
        close_demo(demo)
        loader.close()


def test_queue_is_bounded_and_shows_its_position_on_the_status_line(pair, tmp_path):
    from ui import EngineLoader, build_demo, default_presets
    from ui.layout import QUEUE_MAX_SIZE

    demo = build_demo(EngineLoader(INLINE), default_presets(str(tmp_path), *pair), [])
    assert demo._queue.max_size == QUEUE_MAX_SIZE
    config = demo.get_config_file()
    run = next(d for d in config["dependencies"] if d["api_name"] == "run")
    status_id = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "mirror-status")
    assert run["show_progress"] != "hidden" and run["show_progress_on"] == [status_id]
    fn = next(f for f in demo.fns.values() if f.api_name == "run")
    assert fn.concurrency_id == "lanes" and fn.concurrency_limit == 1  # one run on the lanes, the rest wait


def test_back_to_back_runs_keep_memory_threads_and_processes_flat(pair):
    from ui import EngineLoader

    loader = EngineLoader(INLINE)
    try:
        result = back_to_back(loader, *pair, runs=N_RUNS, warmup=N_WARMUP)
    finally:
        loader.close()
    assert not result.errors, result.errors[:3]
    assert result.rss_growth < 0.10, f"RSS grew {result.rss_growth:.1%} over {N_RUNS} runs"
    assert result.threads_left <= 0 and result.children_left <= 0
