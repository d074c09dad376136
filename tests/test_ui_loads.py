"""The page's loads: a pair that cannot load (a typo, a model not found offline) fails at once and leaves the loaded
pair loaded; Stop ends the wait for a load at once and leaves the loaded pair as it was (the load finishes in the
background and is dropped, unless a Run asks for that pair again meanwhile); a pair loaded again after another
replaced it is not called a first use."""
from __future__ import annotations

import threading
import time

import pytest

from mirror_core import MirrorError
from mirror_core.models import loading
from testing.reliability import INLINE, page_values
from ui.loader import EngineLoader, load_or_stop
from ui.session import Session
from ui.settings import settings_from_ui
from ui.streaming import DONE, STATUS, load_status, run_comparison

# An unknown id's failure and Stop during a load answer at once, not after the hub client's ~30 s of retries:
# the hub probe gives up after 1.5 s (HUB_PROBE_S), Stop frees the page within 0.1 s (docs/RELIABILITY.md)
OFFLINE_BOUND_S = 2.0


@pytest.fixture
def unreachable_hub(monkeypatch):
    """A hub endpoint that refuses connections (port 9 on this machine), with no probe remembered."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "_probes", {})


def test_an_unknown_hub_id_offline_fails_at_once_and_keeps_the_loaded_pair(pairs, unreachable_hub):
    """The loader's check (MirrorEngine.check_pair: configs and tokenizers, no weights) runs before the loaded pair
    is closed; the load itself is a stand-in here (tests/test_ui_phone.py loads a real pair from the page)."""
    target, draft = pairs["llama"]
    closed: list = []
    loader = EngineLoader(INLINE, load=lambda t, d, lanes: _Engine(closed), warmup=False)
    engine = loader.get(target, draft)
    for typo in (("someone/no-such-model", draft), (target, "someone/no-such-draft")):
        t0 = time.monotonic()
        with pytest.raises(MirrorError, match="not found offline.*cannot be reached"):
            loader.get(*typo)
        assert time.monotonic() - t0 <= OFFLINE_BOUND_S
        assert loader.loaded() == (target, draft) and not closed  # still loaded
    with pytest.raises(MirrorError, match="does not exist"):  # a mistyped folder: the same
        loader.get(target + "-typo", draft)
    assert loader.get(target, draft) is engine and not closed


def test_hf_hub_offline_fails_an_uncached_id_without_probing(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(loading, "hub_reachable", lambda *a: pytest.fail("probed although HF_HUB_OFFLINE is set"))
    with pytest.raises(MirrorError, match="not found offline.*HF_HUB_OFFLINE is set"):
        loading.hub_access("someone/no-such-model")
    assert loading.hub_access("./some/folder") == {}  # folders never ask the hub


def test_a_cached_id_loads_from_the_cache_when_the_hub_cannot_be_reached(monkeypatch, unreachable_hub):
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    assert loading.hub_access("org/cached") == {"local_files_only": True}


class _SlowLoad:
    """A load that waits for `release` (a stand-in for a pair that takes a minute to load)."""

    def __init__(self):
        self.release, self.closed = threading.Event(), []

    def __call__(self, target, draft, lanes):
        self.release.wait(30)
        return _Engine(self.closed)


class _Engine:
    def __init__(self, closed):
        self.closed = closed

    def close(self):
        self.closed.append(self)


def _loaded(loader, pair, timeout=10):
    deadline = time.monotonic() + timeout
    while loader.loading() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return loader.loaded() == pair


def _working():
    """A slow load, a loader with ("t", "d") loaded through it, and that engine (the next load waits for release)."""
    slow = _SlowLoad()
    loader = EngineLoader(INLINE, load=slow, warmup=False, check=None)
    slow.release.set()
    working = loader.get("t", "d")
    slow.release.clear()
    return slow, loader, working


def test_stop_ends_the_wait_for_a_load_and_keeps_the_working_pair():
    slow, loader, working = _working()
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert load_or_stop(loader, "t", "other", stop) is None
    assert time.monotonic() - t0 <= OFFLINE_BOUND_S
    assert loader.loaded() == ("t", "d") and loader.loading() == ("t", "other")  # the working pair serves meanwhile
    slow.release.set()
    assert _loaded(loader, ("t", "d"))  # the stopped load ended in the background and was dropped
    assert slow.closed and working not in slow.closed
    assert load_or_stop(loader, "t", "d", threading.Event()) is working


def test_a_run_that_asks_for_a_stopped_load_again_picks_it_up():
    slow = _SlowLoad()
    loader = EngineLoader(INLINE, load=slow, warmup=False, check=None)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert load_or_stop(loader, "t", "d", stop) is None
    again: list = []
    asker = threading.Thread(target=lambda: again.append(loader.get("t", "d", threading.Event())))
    asker.start()
    time.sleep(0.2)
    slow.release.set()
    asker.join(10)
    assert loader.loaded() == ("t", "d") and again[0] is not None and not slow.closed  # loaded once, kept


def test_stop_during_a_comparisons_load_says_so_and_frees_the_page():
    slow = _SlowLoad()
    loader = EngineLoader(INLINE, load=slow, warmup=False, check=None)
    session = Session()
    settings = settings_from_ui(page_values(prompt="1, 2", target="t", draft="d", decoders=["ar"], gamma=3, kappa=2,
                                            max_new_tokens=8))
    ticks = run_comparison(loader, session, settings)
    first = next(ticks)
    assert first.kind == STATUS and "first use of this pair" in first.status and "Stop ends the wait" in first.status
    t0 = time.monotonic()
    session.stop.set()
    last = list(ticks)[-1]
    assert time.monotonic() - t0 <= OFFLINE_BOUND_S and session.idle.is_set()
    assert last.kind == DONE and "Stopped** while the pair was loading" in last.status and session.error is None
    assert "the pair that was loaded stays loaded" in last.status
    slow.release.set()


def test_a_pair_loaded_again_is_not_called_a_first_use():
    loader = EngineLoader(INLINE, load=lambda t, d, lanes: _Engine([]), warmup=False, check=None)
    first = settings_from_ui(page_values(prompt="1", target="t", draft="d", decoders=["ar"], gamma=3, kappa=2,
                                         max_new_tokens=8))
    assert "first use" in load_status(loader, first)
    loader.get("t", "d")
    loader.get("t", "other")
    assert "loaded before" in load_status(loader, first) and "first use" not in load_status(loader, first)


def test_closing_stops_what_runs_and_does_not_wait_for_a_load():
    """The server shutting down: every run, replay and sweep the loader holds is stopped, and close does not wait
    for a load under way (its engine is dropped if it ends)."""
    slow, loader, working = _working()
    run = threading.Event()
    with loader.holding(run):
        loader.stop_runs()
    assert run.is_set()
    threading.Thread(target=lambda: loader.get("t", "other"), daemon=True).start()
    time.sleep(0.2)
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 1.0 and working in slow.closed and loader.loaded() is None
    slow.release.set()
    time.sleep(0.2)
    assert loader.loaded() is None and len(slow.closed) == 2  # the load ended after the close: dropped
