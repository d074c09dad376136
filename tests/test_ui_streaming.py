"""The streaming handler on tiny models (inline lanes): full runs, the page held still while a decoder is timed, Stop,
close, errors, engine cache."""
from __future__ import annotations

import json
import os
import time

import pytest

from mirror_core import LaneConfig
from testing.reliability import page_values
from testing.toy_models import build_pair
from ui.views import APPEND_ONLY, OUTPUT_NAMES, STATE, Deltas, refreshed
from ui.loader import EngineLoader, default_presets
from ui.session import Session
from ui.settings import settings_from_ui
from ui.streaming import DONE, RESET, RESULTS, STATUS, TEXT, replay, run_comparison

LANES = LaneConfig(kind="inline", target_threads=1, draft_threads=1)


@pytest.fixture(scope="module")
def pair(pair_root):
    return build_pair(pair_root, "llama")


@pytest.fixture(scope="module")
def loader():
    loader = EngineLoader(LANES)
    yield loader
    loader.close()


def settings(pair, decoders=("ar", "sd", "mirror"), max_new=24, exit_layer=0, target=None, live_plots=True,
             repeats=1, fmt="auto"):
    return settings_from_ui(page_values(prompt="1, 2, 3", target=target or pair[0], draft=pair[1],
                                        decoders=list(decoders), gamma=3, kappa=2, exit_layer=exit_layer,
                                        max_new_tokens=max_new, live_plots=live_plots, repeats=repeats, format=fmt))


def test_measure_then_show_sends_no_plot_record_until_the_runs_have_ended(pair, loader):
    session = Session()
    ticks = list(run_comparison(loader, session, settings(pair, ("ar", "mirror"), live_plots=False), sleep=no_sleep))
    assert ticks[-1].kind == DONE and "Done" in ticks[-1].status
    live = [refreshed(session, t) for t in ticks if t.kind == TEXT and not t.whole]
    assert len(live) == 4 and not any("plots" in out for out in live)  # a first token and a whole run per decoder
    feed = refreshed(session, ticks[-1])["plots"]                       # then every record at once
    assert feed.startswith("R ") and "\nT mirror " in feed and "\nS mirror 1 " in feed and "\nE mirror " in feed
    assert not any(t.replay_at is not None for t in ticks)              # live plots off: no replay at the end


def no_sleep(seconds: float) -> None:
    pass


def test_while_a_decoder_is_timed_the_page_hears_of_it_only_at_its_first_token(pair, loader, monkeypatch):
    """Measure, then show: between a run's first token and its end the generator yields nothing (the events wait in
    a list), so neither the server nor the browser works for the page while the lanes are timed."""
    from ui import streaming

    session, seen = Session(), []
    real = streaming.Session.add

    def add(self, run, event):  # what the session had of the running decoder when the page last heard of it
        real(self, run, event)
        seen.append((run.decoder, len(run.tokens)))

    monkeypatch.setattr(streaming.Session, "add", add)
    shown = []
    for tick in run_comparison(loader, session, settings(pair, ("ar", "mirror"), max_new=24), sleep=no_sleep):
        if tick.kind == TEXT and tick.replay_at is None and not tick.whole:
            shown.append({d: len(r.tokens) for d, r in session.runs.items()})
    assert shown[0] == {"ar": 1} and shown[1] == {"ar": 24}                     # AR: its first token, then whole
    assert shown[2] == {"ar": 24, "mirror": 1} and shown[3] == {"ar": 24, "mirror": 24}
    assert len(shown) == 4


def test_full_comparison_streams_only_what_grew(pair, loader):
    session = Session()
    ticks, last, pieces = [], {}, set()
    for tick in run_comparison(loader, session, settings(pair)):
        ticks.append(tick)
        outputs = refreshed(session, tick)
        assert outputs.keys() <= {*OUTPUT_NAMES, STATE} and "status" in outputs
        if tick.kind == DONE:
            assert outputs.keys() == {*OUTPUT_NAMES, STATE}                      # everything is refreshed
        if tick.kind in (RESET, RESULTS):  # a new comparison clears everything, in two pieces (the end: three)
            assert "plots" in outputs and "inspector" in outputs and "numbers" not in outputs if tick.kind == RESET \
                else outputs.keys() == {"status", "numbers", "latency", "verdict", "ran", "who", "format"}
            pieces |= outputs.keys()
        if tick.kind == TEXT and not tick.plots:  # while the runs are timed the streams only grow at their end:
            grown = {k: v for k, v in outputs.items() if k.endswith(("_tokens", "_text"))}  # Gradio sends what grew
            assert len(grown) == 6 and "plots" not in outputs  # the plots wait for the end
            for name, value in grown.items():
                assert value.startswith(last.get(name, "")), name
            last = grown
    assert [t.kind for t in ticks[:3]] == [STATUS, RESET, RESULTS] and ticks[-1].kind == DONE
    assert "Done" in ticks[-1].status and pieces == {*OUTPUT_NAMES, STATE}
    end = next(i for i, t in enumerate(ticks) if t.plots)  # the end in pieces: the results, the replay, the rest
    assert ticks[end - 1].kind == RESULTS and all(t.replay_at is not None for t in ticks[end:-2])
    assert ticks[-2].kind == TEXT and ticks[-2].whole and ticks[-2].plots and ticks[-2].replay_at is None
    assert {t.active for t in ticks[3:end]} == {"ar", "sd", "mirror", None}  # each run's first token, then its end
    assert sum(t.kind == TEXT and not t.plots for t in ticks) == 6
    runs = session.runs
    assert list(runs) == ["ar", "mirror", "sd"] and all(r.end and not r.end.error for r in runs.values())
    ids = {d: r.end.token_ids for d, r in runs.items()}
    assert len(ids["ar"]) == 24 and ids["ar"] == ids["sd"] == ids["mirror"]    # greedy: lossless
    assert runs["mirror"].steps and any(s.branches for s in runs["mirror"].steps)
    final = refreshed(session, ticks[-1])
    assert final["ar_tokens"] and final["ar_text"].split() == [str(t) for t in ids["ar"]]
    with open(session.trace_path) as f:
        trace = json.load(f)
    starts = [e["decoder"] for e in trace["events"] if e["type"] == "RunStart"]
    assert trace["format"] == "mirror-sd-trace/1" and starts == ["ar", "mirror", "sd"]
    assert trace["text"]["prompt"] == "1, 2, 3" and trace["text"]["output"]["ar"] == final["ar_text"]
    assert session.idle.is_set()
    failed = list(run_comparison(loader, session, settings(pair, exit_layer=9)))   # a bad setting: an error line,
    kept = refreshed(session, failed[-1])                                             # next to the last results
    assert [t.kind for t in failed] == [STATUS, DONE] and "exit layer must be in" in kept["status"]
    assert kept["ar_text"] == final["ar_text"] and os.path.exists(session.trace_path)
    again = run_comparison(loader, session, settings(pair, ("ar",), max_new=4))
    assert next(again).kind == STATUS                                      # loading and checks: nothing cleared yet
    cleared = refreshed(session, next(again))                               # then the new comparison starts empty
    for d in ("ar", "sd", "mirror"):
        assert [cleared[f"{d}_tokens"], cleared[f"{d}_text"]] == ["", ""]
    assert "Numbers appear" in refreshed(session, next(again))["numbers"]   # the results in the second piece
    assert list(again)[-1].kind == DONE


def read_deltas(page: dict[str, str], sent: dict[str, object]) -> None:
    """What ui/delta.js and its readers do with one tick's values, in Python: a delta must start where the page's
    text ends (no update is ever skipped here)."""
    for name in APPEND_ONLY:
        value = sent.get(name)
        if not isinstance(value, str):
            continue
        if value.startswith("+"):
            start, chunk = value[1:].split(" ", 1)
            assert int(start) == len(page[name]), name
            page[name] += chunk
        else:
            page[name] = value


def test_streams_and_the_feed_go_out_as_what_grew_and_whole_at_the_end(pair, loader):
    """The Run tab's wire format (views.Deltas): while the runs stream, each append-only view's value is only what
    it gained since the event's previous value; read in order they rebuild every tick's whole text; an event's
    first and last values are whole (what an API client gets), and a replay starts whole again."""
    session, deltas, page = Session(), Deltas(), {}
    delta_chars = whole_chars = grown = 0
    for tick in run_comparison(loader, session, settings(pair, repeats=2)):  # each repeat starts over
        outputs = refreshed(session, tick)
        sent = deltas(dict(outputs), tick)
        read_deltas(page, sent)
        for name in APPEND_ONLY:
            if name in outputs:
                assert page[name] == outputs[name], name
                delta_chars += len(sent[name])
                whole_chars += len(outputs[name])
                grown += sent[name].startswith("+")
        if tick.kind == DONE:
            assert not any(sent[name].startswith("+") for name in APPEND_ONLY) and sent == outputs
    assert grown >= 6 and whole_chars > delta_chars  # what grew, not the whole stream, on each later tick
    assert page["mirror_tokens"].count('class="mirror-tok') == 24 and page["plots"].count("\nE mirror ") == 1
    again = Deltas()
    first = True
    for tick in replay(session, speed=1.0, fps=200.0, sleep=lambda s: None):
        outputs = refreshed(session, tick)
        sent = again(dict(outputs), tick)
        assert (first or tick.whole) != sent["plots"].startswith("+")  # whole on a new event's first tick and last
        first = False
        read_deltas(page, sent)
        assert page["plots"] == outputs["plots"] and page["mirror_tokens"] == outputs["mirror_tokens"]
    assert tick.whole
    ticks = replay(session, speed=1.0, fps=200.0, sleep=lambda s: None)
    next(ticks)
    session.begin_comparison()  # as a new Run does: the replay ends at once and leaves the views to it
    assert list(ticks) == [] and session.feed.text().endswith("C 0.0\n")


def test_repeats_alternate_the_order_show_a_provisional_verdict_then_the_middle_repeat(pair, loader):
    """Each repeat but the last ends with a provisional verdict; at the end the views (streams, numbers, plots,
    inspector) show the repeat the verdict reads, the middle one by Mirror ÷ AR."""
    from ui.numbers import speedup
    from ui.verdict import middle_repeat

    session, provisional = Session(), []
    for tick in run_comparison(loader, session, settings(pair, ("ar", "mirror"), max_new=20, repeats=3),
                               sleep=no_sleep):
        if tick.kind == RESULTS and not session.idle.is_set():
            provisional.append(refreshed(session, tick)["verdict"])
    assert "3 times" in tick.status
    assert [r.decoder for r in session.history] == ["ar", "mirror", "mirror", "ar", "ar", "mirror"]
    assert all(len(r.tokens) == 20 for r in session.history)
    timed = [v for v in provisional if "× AR" in v]
    assert len(timed) == 2 and "Provisional</b> (1 of 3 repeats timed" in timed[0] and "(2 of 3" in timed[1]
    final = refreshed(session, tick)
    assert "Provisional" not in final["verdict"] and "3 repeats, every other one in reverse order" in final["verdict"]
    middle = middle_repeat(session.history)
    h = session.history  # repeats in run order: (ar, mirror), (mirror, ar), (ar, mirror)
    ratios = sorted(speedup(ar, mirror)[0] for ar, mirror in ((h[0], h[1]), (h[3], h[2]), (h[4], h[5])))
    assert speedup(middle["ar"], middle["mirror"])[0] == ratios[1]
    assert set(session.runs) == {"ar", "mirror"} and all(session.runs[d] is middle[d] for d in middle)
    assert "Over the repeats" in final["numbers"] and "(n = 3)" in final["numbers"]
    lines = final["plots"].splitlines()
    assert sum(x.startswith("R ") for x in lines) == 1 and sum(x.startswith("T ar ") for x in lines) == 20
    assert "\nE mirror " in final["plots"]
    with open(session.trace_path) as f:
        assert sum(e["type"] == "RunStart" for e in json.load(f)["events"]) == 6      # the trace has every run


def test_stop_ends_the_run_within_one_step_and_skips_the_rest(pair, loader):
    session = Session()
    gen = run_comparison(loader, session, settings(pair, ("sd", "mirror"), max_new=400))
    for _ in gen:
        run = session.runs.get("mirror")  # mirror runs before sd
        if run is not None and run.tokens:  # its first token: the page hears of nothing else until it ends
            t_stop = time.perf_counter()  # the engine's clock
            session.stop.set()
            break
    ticks = list(gen)
    mirror = session.runs["mirror"]
    assert mirror.end.stopped and len(mirror.tokens) < 400
    assert sum(s.t_end > t_stop for s in mirror.steps) <= 1  # the engine finished at most the step it was in
    assert "sd" not in session.runs and ticks[-1].kind == DONE and "Stopped" in ticks[-1].status


def test_closing_the_generator_cleans_up_and_the_engine_keeps_serving(pair, loader):
    session = Session()
    gen = run_comparison(loader, session, settings(pair, ("mirror",), max_new=400))
    for _ in gen:
        if session.runs.get("mirror") and session.runs["mirror"].tokens:
            break
    gen.close()                                                    # what Gradio does on cancel
    assert session.idle.is_set() and session.trace_path and session.stopped
    again = Session()
    ticks = list(run_comparison(loader, again, settings(pair, ("mirror",), max_new=8)))
    assert "Done" in ticks[-1].status and len(again.runs["mirror"].tokens) == 8


def test_errors_are_readable_and_the_loader_recovers(pair, loader, tmp_path):
    session = Session()
    ticks = list(run_comparison(loader, session, settings(pair, target=str(tmp_path / "missing"))))
    assert ticks[-1].kind == DONE and "**Error:**" in ticks[-1].status and "does not exist" in ticks[-1].status
    ticks = list(run_comparison(loader, session, settings(pair, exit_layer=9)))
    assert "exit layer must be in 1..3" in ticks[-1].status and session.runs == {}  # nothing had run yet
    ticks = list(run_comparison(loader, session, settings(pair, ("ar",), max_new=600)))  # a 512-token context
    assert "exceeds the models' context" in ticks[-1].status and "at most 504 with this prompt" in ticks[-1].status
    ticks = list(run_comparison(loader, session, settings(pair, ("ar",), max_new=4)))
    assert "Done" in ticks[-1].status


def test_replay_follows_measured_commit_times(pair, loader):
    session = Session()
    list(run_comparison(loader, session, settings(pair, ("ar", "mirror"), max_new=12)))
    before = len(session.feed.text())  # (the comparison ended with a replay of its own)
    ticks = list(replay(session, speed=1.0, fps=1000.0, sleep=lambda s: None))
    shown = [session.runs["ar"].count_until(t.replay_at) for t in ticks if t.replay_at is not None]
    assert shown == sorted(shown) and ticks[-1].replay_at is None
    cursor = [line for line in session.feed.text()[before:].splitlines() if line.startswith("C ")]  # the time cursor
    assert len(cursor) == len(shown) + 1 and cursor[-1] == "C -" and cursor[0] == "C 0.0"
    assert all(refreshed(session, t)["plots"] == session.feed.text() for t in ticks[-1:])  # sent with the ticks
    assert refreshed(session, ticks[-1])["ar_text"].split() == [str(t) for t in session.runs["ar"].end.token_ids]
    session.idle.clear()  # as while a comparison runs: the live run owns the views
    assert [t.kind for t in replay(session, sleep=lambda s: None)] == [STATUS]


class FakeEngine:
    def __init__(self, key):
        self.key, self.closed = key, False

    def close(self):
        self.closed = True


def test_loader_caches_one_engine_per_pair_and_closes_on_switch(tmp_path):
    made = []

    def load(target, draft, lanes):
        made.append(FakeEngine((target, draft)))
        return made[-1]

    loader = EngineLoader(LANES, load=load, warmup=False, check=None)
    a = loader.get("t", "d")
    assert loader.get("t", "d") is a and len(made) == 1
    b = loader.get("t", "d2")
    assert a.closed and not b.closed and loader.loaded() == ("t", "d2")
    loader.close()
    assert b.closed and loader.loaded() is None
    presets = default_presets(str(tmp_path), "my/target", None)
    assert presets[0].label == "Command-line pair" and not any(p.available for p in presets[1:])


def test_the_numbers_say_how_the_target_was_made_one_function(pair, loader):
    session = Session()
    ticks = list(run_comparison(loader, session, settings(pair, ("ar", "mirror"), max_new=8)))
    numbers = refreshed(session, ticks[-1])["numbers"]
    rows = loader.get(*pair).info.target_rows
    assert "Target: FastLlamaRunner" in numbers
    assert rows.invariant
    if rows.plan is not None:  # this machine's kernels needed measured call shapes: the panel names them
        assert "one function by measured call shapes" in numbers and "bit-identical now" in numbers
        assert rows.plan.label.split(";")[0] in numbers.replace("&#x27;", "'")
    else:
        assert "bit-exact as it is" in numbers


def test_a_cancel_sets_the_flag_at_once_and_closes_the_work_before_it_ends():
    """ui/cancellable.py (the Run handler's driver): a task cancelled while its sync generator works between two
    yields (a timed run) calls `cancel` at once, not at the next yield; the work sees the flag, and the generator is
    closed (its finally: the lanes freed) before the cancelled task ends."""
    import asyncio
    import threading

    from ui.cancellable import cancellable

    stop, log = threading.Event(), []

    def timed_run():
        try:
            yield "first token"
            log.append(("the flag seen", stop.wait(timeout=30)))  # no yield while it works: the page holds still
            yield "the run whole"
        finally:
            log.append("closed")

    async def main():
        async def handler():
            async for tick in cancellable(timed_run(), lambda: (log.append("cancel"), stop.set())):
                log.append(tick)

        task = asyncio.create_task(handler())
        while "first token" not in log:  # then the handler awaits the next tick, its next() on the worker thread
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        log.append("cancelled")

    asyncio.run(main())
    assert log == ["first token", "cancel", ("the flag seen", True), "closed", "cancelled"]


def test_the_format_switch_keeps_the_pair_loaded_and_names_the_function_that_wrote_the_text(pair, loader):
    """Format on the page: the loaded engine changes its target's format in place (the same engine, the same draft
    lane), the status says so while it does, the columns agree in that format, and "Who wrote this" names its
    function in the CLI's words; the Format control then lists the formats the target offers."""
    from mirror_core.kernels.formats import FUNCTIONS
    from mirror_core.models.pairs import target_function
    from mirror_core import MirrorError

    engine = loader.get(*pair, fmt="auto")
    session = Session()
    ticks = list(run_comparison(loader, session, settings(pair, ("ar", "mirror"), max_new=8, fmt="bfloat16"),
                                sleep=no_sleep))
    assert ticks[0].status.startswith("Setting the target's format to bfloat16 on the loaded pair")
    assert loader.get(*pair) is engine and engine.info.target_dtype.sequence == "bfloat16"
    assert loader.target_format() == "bfloat16" and ticks[-1].kind == DONE and "Done" in ticks[-1].status
    ar, mirror = (session.runs[d].end.token_ids for d in ("ar", "mirror"))
    assert ar == mirror
    out = refreshed(session, ticks[-1])
    said = target_function(session.runs["ar"].start.settings)
    assert said.format == "bfloat16" and said.computes == FUNCTIONS["bfloat16"] and said.line in out["who"]
    offered = [value for _, value in out["format"].choices]
    assert offered[0] == "auto" and set(offered[1:]) == set(engine.info.target_formats) and "bfloat16" in offered
    with pytest.raises(MirrorError, match="offers the formats"):  # one the target lacks: refused, the pair stays
        loader.get(*pair, fmt="int8")
    assert loader.get(*pair, fmt="auto") is engine and engine.info.target_dtype.sequence == "float32"
