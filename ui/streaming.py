"""Per-user generators: run the chosen decoders one after another, and replay finished runs side by side.

They yield Ticks that say what the page should refresh; the Run tab maps them to outputs (ui/views.py: refreshed).
Measure, then show: while a decoder is timed the page gets one update, at its first token, and nothing else (no
stream growing, no plot drawn: on a machine that also runs the browser, drawing took CPU from the lanes and slowed
the speculative decoders most). The run's events wait in a list; when it ends its column shows it whole, each
repeat but the last ends with a provisional verdict, and the comparison ends with the runs the verdict reads
replayed side by side at their measured pace. Every number shown comes from the engine's events, never this clock.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mirror_core import MirrorError, RunEnd, TokenEvent
from mirror_core.machine import cpu_times, others_cores
from mirror_core.events import write_trace

from . import plots
from .loader import load_or_stop
from .numbers import speedup
from .render import shown_path
from .session import Session, TokenNamer, plain_text
from .settings import DECODER_TITLES, ComparisonSettings
from .verdict import middle_repeat

TEXT, STATUS, DONE, RESET, RESULTS = "text", "status", "done", "reset", "results"
# While a run is timed the page hears nothing new, but the handler yields its unchanged status this often: Gradio
# sends an empty update (a few hundred bytes), which keeps the client's stream alive, and checks between yields that
# the client is still there (a raw API client whose connection dropped, with no cancel and no tab to unload, is
# closed at the next one). A cancel, Stop and a closed tab do not wait for it: they set the run's stop flag at once
# (ui/cancellable.py, the page's unload handler), and the engine stops between two steps.
HEARTBEAT_S = 0.2
# Pause between a page update and the next timed prefill: the page lays out and paints the update (a column shown
# whole, a provisional verdict, the new plots after RESET) before the lanes are timed again, not during it
# (measured: scripts/page_cost.py, BENCHMARKS.md's history).
PAGE_SETTLE_S = 0.25
# Pause between the pieces of a big page update (a comparison's start and end): each piece is then its own short
# task in the page, laid out and painted before the next arrives (one update that did it all was the longest
# main-thread task of a run: BENCHMARKS.md's history, "The page's start and end in pieces").
PAGE_PIECE_S = 0.05
REPLAY_FPS = 20.0  # frames per second of a replay (the page's pacing only)
RECHECK = ("Checking where AR runs: the target's one-token step on its lane's cores and on every core, timed again "
           "(another process may have come or gone since the load; the baseline every speedup is against) …")
FORMAT_SWITCH = ("Setting the target's format to {} on the loaded pair: its row plan checked and its steps timed as a "
                 "load does (the draft lane stays as it is) …")


@dataclass(frozen=True)
class Tick:
    kind: str     # STATUS: only the status line; TEXT: token views (and, with `plots`, the plots' feed);
                  # RESET: a new comparison starts: token views, plots and step inspector, from an emptied session;
                  # RESULTS: the numbers, latency model, verdict and ran line (provisional between repeats);
                  # DONE: everything
    status: str   # markdown for the status line
    replay_at: float | None = None  # replay: seconds since the runs' starts to show
    active: str | None = None       # the decoder being timed now (None between runs)
    plots: bool = False             # a TEXT tick that also sends the plots' feed (the replay's time cursor)
    whole: bool = False             # the views go out whole, not as deltas (an event's last tick; DONE always)


class _LoadStopped(Exception):
    """Stop was pressed while the comparison's pair was loading."""


def run_comparison(loader, session: Session, settings: ComparisonSettings, *, settle_s: float = PAGE_SETTLE_S,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[Tick]:
    """Load the pair (cached) and check every setting, then time each decoder in turn with the lanes to itself,
    `settings.repeats` times (every other repeat in reverse order), the page held still while each one runs.

    Before each timed run the same request runs untimed for one token (prefill only), so that no decoder's
    TTFT pays for being first. The previous comparison stays on the page until the new one has loaded and
    passed its checks, so a failed load or a bad setting shows its error next to the last results instead of
    erasing them. At the end the views show the repeat the verdict reads (the middle one by Mirror ÷ AR).
    """
    generation = session.begin_comparison()
    with loader.holding(session.stop):  # a server shutting down stops the comparison within one step
        yield from _comparison(loader, session, settings, generation, settle_s, sleep)


def _comparison(loader, session: Session, settings: ComparisonSettings, generation: int, settle_s: float,
                sleep: Callable[[float], None]) -> Iterator[Tick]:
    """run_comparison's body: its ticks from the load to DONE, the trace written and the session idle at the end."""
    cleared = False  # the previous comparison's views were cleared (this one started)
    try:
        engine, requests = yield from _prepare(loader, session, settings)
        session.clear_results()
        session.prompt, session.live_plots, session.planned_repeats = (settings.prompt, settings.live_plots,
                                                                       settings.repeats)
        session.pair_info = engine.info
        yield Tick(RESET, session.status)  # clears the previous comparison's views, in two pieces
        cleared = True
        sleep(PAGE_PIECE_S)
        yield Tick(RESULTS, session.status)
        yield from _timed_runs(engine, session, settings, requests, settle_s, sleep)
        session.status = final_status(session)
    except _LoadStopped:
        session.load_stopped = True
        session.status = final_status(session)
    except MirrorError as exc:
        session.error = str(exc)
        session.status = f"**Error:** {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure is shown on the page; the app keeps serving
        session.error = f"{type(exc).__name__}: {exc}"
        session.status = f"**Error:** {session.error}"
    finally:
        finish(session, generation)
    if cleared:
        yield from _ending(session, sleep)
    yield Tick(DONE, session.status)


def _prepare(loader, session: Session, settings: ComparisonSettings):
    """The pair (loaded unless it is the loaded one; Stop ends the wait) and every request, checked and decided by
    the pair (γ, κ, ℓ_e) before anything runs: (engine, requests). A generator: it yields the loading status."""
    pair, busy = (settings.target, settings.draft), loader.loading()
    session.status = (load_status(loader, settings) if loader.loaded() != pair
                      else f"Waiting for a stopped load of `{shown_path(busy[0])}` to end (it runs on in the "
                           "background and is dropped when it ends; the loaded pair stays, and is timed with the "
                           "machine to itself; Stop ends the wait) …" if busy not in (None, pair)
                      else FORMAT_SWITCH.format(settings.format) if settings.format != loader.target_format()
                      else "Starting …")
    yield Tick(STATUS, session.status)
    engine = load_or_stop(loader, settings.target, settings.draft, session.stop, fmt=settings.format)
    if engine is None:  # Stop during the load: the page is free at once (the loaded pair stays)
        raise _LoadStopped
    if engine.info.whole_machine is not None:  # where AR runs, and its baseline: as the machine is now
        session.status = RECHECK
        yield Tick(STATUS, session.status)
        engine.recheck_whole_machine(session.stop)
    prompt_ids = engine.encode(settings.prompt, chat=not settings.raw_prompt)
    return engine, [engine.validate(r) for r in settings.requests(prompt_ids)]


def _timed_runs(engine, session: Session, settings: ComparisonSettings, requests: list, settle_s: float,
                sleep: Callable[[float], None]) -> Iterator[Tick]:
    """Every run in turn; after each repeat but the last, the results so far (a provisional verdict)."""
    per_repeat = len(settings.decoders)
    namer = TokenNamer(engine.tokenizer)
    for i, request in enumerate(requests):
        if session.stop.is_set():
            session.skipped = True
            return
        repeat = i // per_repeat
        of = f", repeat {repeat + 1}/{settings.repeats}" if settings.repeats > 1 else ""
        session.status = (f"Timing {DECODER_TITLES[request.decoder]} ({i % per_repeat + 1}/{per_repeat}{of}): the "
                          "page holds still while it runs, then shows it …")
        yield from _run_decoder(engine, session, request, namer, settle_s)
        if (i + 1) % per_repeat == 0 and i + 1 < len(requests) and not session.stop.is_set():
            yield Tick(RESULTS, session.status)  # a provisional verdict from the repeats timed so far
            sleep(settle_s)


def _ending(session: Session, sleep: Callable[[float], None]) -> Iterator[Tick]:
    """Before DONE, so that no one page update does it all: the results, then the views whole (the last token, the
    plots' legend), or with live plots the runs replayed side by side at their measured pace, ending whole. The
    views go just before DONE, which repeats them: Gradio sends a value equal to the same view's previous one as an
    empty diff."""
    replaying = session.live_plots and not session.error and not session.stopped
    yield Tick(RESULTS, "Timed. Replaying the runs the verdict reads at their measured pace …" if replaying
               else session.status)
    sleep(PAGE_PIECE_S)
    if replaying:
        yield from _replayed(session, 1.0, REPLAY_FPS, sleep, session.stop, session.status)
    else:
        yield Tick(TEXT, session.status, plots=True, whole=True)
    sleep(PAGE_PIECE_S)


def load_status(loader, settings: ComparisonSettings) -> str:
    """The status line while a pair loads: a first use, or a reload of a pair another one replaced."""
    again = loader.loaded_before(settings.target, settings.draft)
    why = "loaded before, then replaced by another pair: loading it again" if again else "first use of this pair"
    return (f"Loading `{shown_path(settings.target)}` + `{shown_path(settings.draft) or 'no draft'}` ({why}; Stop ends "
            "the wait) …")


def _run_decoder(engine, session: Session, request, namer: TokenNamer, settle_s: float) -> Iterator[Tick]:
    """One decoder's timed run into the session (after an untimed warm prefill). The page hears of it twice: at
    its first token, and when it ends (its column whole); in between its events wait in a list, so that neither
    this process nor the browser works for the page while the lanes are timed. A target-lane failure keeps what it
    committed and is added to the session's error."""
    yield Tick(STATUS, session.status)
    time.sleep(settle_s)  # the page settles (the last update laid out and painted) before the timed prefill
    engine.warm_prefill(request, session.stop)  # untimed, not shown: as the CLI's generate warms up
    run = session.begin(request.decoder, namer)
    held: list = []
    before = cpu_times()  # the noise meter: what other processes use while this run is timed
    stream = engine.stream(request, session.stop)
    beat = time.monotonic()
    try:
        for event in stream:
            if run.tokens:
                held.append(event)
                if time.monotonic() - beat >= HEARTBEAT_S:  # an unchanged status: an empty update that keeps
                    beat = time.monotonic()                 # the client's stream alive
                    yield Tick(STATUS, session.status)
                continue
            session.add(run, event)
            if isinstance(event, TokenEvent):  # the first token (the prefill's: no rejected draft goes before it)
                run.view.release()            # shown at once
                yield Tick(TEXT, session.status, active=request.decoder)
    finally:
        stream.close()  # closed early (Stop, page gone): the engine stops within one step
        run.others = others_cores(before, cpu_times())
        for event in held:
            session.add(run, event)
    yield Tick(TEXT, session.status)  # the run whole in its column
    if isinstance(run.end, RunEnd) and run.end.error:  # the target lane failed: keep what it committed
        failed = (f"{DECODER_TITLES[request.decoder]} stopped: the target lane failed ({run.end.error}); "
                  f"the {len(run.end.token_ids)} tokens committed before the failure are kept and shown")
        session.error = f"{session.error}; {failed}" if session.error else failed


def finish(session: Session, generation: int) -> None:
    """Show the repeat the verdict reads and write the trace (whatever ran), then mark the session idle; also runs
    when the generator is closed."""
    if generation != session.generation:
        return  # a newer comparison already owns the session
    try:
        events = session.all_events()
        if events and session.trace_path is None:  # None: this comparison ran (a failed one keeps the last trace)
            _show_verdicts_repeat(session, generation)
            fd, path = tempfile.mkstemp(prefix="mirror-sd-trace-", suffix=".json")
            os.close(fd)
            write_trace(path, events, {"prompt": session.prompt,
                                       "output": {d: plain_text(run) for d, run in session.runs.items()}})
            session.trace_path = path
    finally:
        session.idle.set()


def _show_verdicts_repeat(session: Session, generation: int) -> None:
    """The views show the repeat the verdict reads (the middle one by Mirror ÷ AR; the last one where there is no
    verdict or the comparison was stopped), its plots ending with each run's speedup over AR in the race legend."""
    middle = None if session.stopped else middle_repeat(session.history)
    session.show(middle or session.runs, generation)
    for d, run in session.runs.items():
        session.feed.add(plots.end_line(d, speedup(session.runs.get("ar"), run)))


def final_status(session: Session) -> str:
    if session.error:
        return f"**Error:** {session.error}"
    if session.load_stopped:
        shown = " The results below are the previous comparison's." if session.runs else ""
        return ("**Stopped** while the pair was loading: the pair that was loaded stays loaded and ready. The stopped "
                "load ends in the background and is dropped then (pressing Run for that pair before it ends picks it "
                f"up).{shown}")
    names = [DECODER_TITLES[d] for d in session.runs]
    repeats = len(session.history) // max(len(session.runs), 1)
    if session.stopped:
        if not names:
            return "**Stopped** before any decoder ran."
        return f"**Stopped.** Showing what {', '.join(names)} committed before the stop."
    if len(names) == 1:
        return f"**Done.** {names[0]} ran with both lanes to itself."
    times = f", {repeats} times (every other time in reverse order)" if repeats > 1 else ""
    return f"**Done.** {', '.join(names)} ran one after another, each with both lanes to itself{times}."


def replay(session: Session, *, speed: float = 1.0, fps: float = REPLAY_FPS,
           sleep: Callable[[float], None] = time.sleep, stopped: threading.Event | None = None) -> Iterator[Tick]:
    """Re-animate the finished runs side by side at their measured commit times (TokenEvent.t − RunStart.t0);
    `stopped` (a fresh flag by default) ends it."""
    if not session.idle.is_set():  # a live run owns the views until it ends
        yield Tick(STATUS, "A comparison is running: replay it when it has finished.")
        return
    stopped = session.replay_stop = stopped or threading.Event()  # set by Stop, and by a new comparison
    if not any(r.tokens for r in session.runs.values()):
        yield Tick(STATUS, "Nothing to replay yet: run a comparison first.")
        return
    end = yield from _replayed(session, speed, fps, sleep, stopped)
    if session.idle.is_set():
        yield Tick(TEXT, f"Replay finished ({end * 1e3:.0f} ms of decoding, measured by the engine).", plots=True,
                   whole=True)


def _replayed(session: Session, speed: float, fps: float, sleep: Callable[[float], None], stopped: threading.Event,
              done: str | None = None) -> Iterator[Tick]:
    """The replay's frames: the streams cut at t and the plots' time cursor, t advancing `speed` × real time; then
    the cursor hidden (the last frame whole, with `done` as its status, when given). Returns the replay's length."""
    end = max((r.token_times()[-1] for r in session.runs.values() if r.tokens), default=0.0)
    t = 0.0
    while t < end and not stopped.is_set():
        pace = "measured speed" if speed == 1.0 else f"{speed:g}× measured speed"
        session.feed.add(plots.cursor_line(t))  # the time cursor on the race and the lane timeline
        yield Tick(TEXT, f"Replaying at {pace}: t = {t * 1e3:.0f} ms of {end * 1e3:.0f} ms", replay_at=t, plots=True)
        sleep(1.0 / fps)
        t += speed / fps
    if not session.idle.is_set():  # a new comparison started: its own events own the views now
        return end
    session.feed.add(plots.cursor_line(None))
    if done is not None:
        yield Tick(TEXT, done, plots=True, whole=True)
    return end
