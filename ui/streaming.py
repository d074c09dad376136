"""Per-user generators: run the chosen decoders one after another, and replay finished runs side by side.

They yield Ticks that say what the page should refresh; the Run tab maps them to outputs (ui/views.py: refreshed).
A tick goes out at most every `every_s` while tokens arrive (page pacing only: every number shown comes from
the engine's events, never from this clock); what it carries is only what grew since the last one.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from mirror_core import MirrorError, RunEnd, StepRecord, TokenEvent
from mirror_core.events import write_trace

from . import plots
from .loader import load_or_stop
from .numbers import speedup
from .render import shown_path
from .session import Session, TokenNamer, plain_text
from .settings import DECODER_TITLES, ComparisonSettings

TEXT, STATUS, DONE, RESET, RESULTS = "text", "status", "done", "reset", "results"
# Pause between telling the page that a decoder starts and starting it: the page's redraw (after RESET it builds
# new plots) would otherwise run beside the first decoder's prefill on a machine that also runs the lanes, and
# only the first decoder's TTFT would pay for it (measured: scripts/page_cost.py, docs/BENCHMARKS.md).
PAGE_SETTLE_S = 0.15
# Pause between the pieces of a big page update (a comparison's start and end): each piece is then its own short
# task in the page, laid out and painted before the next arrives (one update that did it all was the longest
# main-thread task of a run: docs/BENCHMARKS.md, "The page's start and end in pieces").
PAGE_PIECE_S = 0.05


@dataclass(frozen=True)
class Tick:
    kind: str     # STATUS: only the status line; TEXT: token views and (with live plots) the plots' feed;
                  # RESET: a new comparison starts: token views, plots and step inspector, from an emptied session;
                  # RESULTS: the numbers, latency model, verdict and ran line; DONE: everything
    status: str   # markdown for the status line
    replay_at: float | None = None  # replay: seconds since the runs' starts to show
    active: str | None = None       # the decoder running now: the other token views need no refresh
    plots: bool = False             # a TEXT tick that also sends the plots' feed (the replay's time cursor)
    whole: bool = False             # the views go out whole, not as deltas (an event's last tick; DONE always)


class Throttle:
    """Decides whether a new event is worth a page update yet (at most one per `every_s`)."""

    def __init__(self, clock: Callable[[], float], every_s: float):
        self.clock, self.every_s = clock, every_s
        self.last = -1e9

    def __call__(self) -> bool:
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            return True
        return False


class _LoadStopped(Exception):
    """Stop was pressed while the comparison's pair was loading."""


def run_comparison(loader, session: Session, settings: ComparisonSettings, *,
                   clock: Callable[[], float] = time.monotonic, every_s: float = 0.15,
                   settle_s: float = PAGE_SETTLE_S, sleep: Callable[[float], None] = time.sleep) -> Iterator[Tick]:
    """Load the pair (cached) and check every setting, then stream each decoder in turn with the lanes to itself,
    `settings.repeats` times (every other repeat in reverse order).

    Before each timed run the same request runs untimed for one token (prefill only), so that no decoder's
    TTFT pays for being first. The previous comparison stays on the page until the new one has loaded and
    passed its checks, so a failed load or a bad setting shows its error next to the last results instead of
    erasing them.
    """
    generation = session.begin_comparison()
    cleared = False  # the previous comparison's views were cleared (this one started)
    try:
        pair = (settings.target, settings.draft)
        session.status = load_status(loader, settings) if loader.loaded() != pair else "Starting …"
        yield Tick(STATUS, session.status)
        engine = load_or_stop(loader, settings.target, settings.draft, session.stop)
        if engine is None:  # Stop during the load: the page is free at once (the load ends in the background)
            raise _LoadStopped
        requests = [engine.validate(r)  # every setting checked (and what it left out decided) before anything runs
                    for r in settings.requests(engine.encode(settings.prompt, chat=not settings.raw_prompt))]
        session.clear_results()
        session.prompt, session.live_plots = settings.prompt, settings.live_plots
        per_repeat = len(settings.decoders)
        yield Tick(RESET, session.status)  # clears the previous comparison's views, in two pieces
        cleared = True
        sleep(PAGE_PIECE_S)
        yield Tick(RESULTS, session.status)
        sleep(PAGE_PIECE_S)  # then the first decoder's tick, which builds the plots
        namer = TokenNamer(engine.tokenizer)
        throttle = Throttle(clock, every_s)
        for i, request in enumerate(requests):
            if session.stop.is_set():
                session.skipped = True
                break
            repeat = i // per_repeat
            if i % per_repeat == 0:  # a repeat starts: the plots start over with its decoders, in its run order
                order = [r.decoder for r in requests[i: i + per_repeat]]
                session.feed.add(plots.reset_line(session.generation * 100 + repeat, order))
            of = f", repeat {repeat + 1}/{settings.repeats}" if settings.repeats > 1 else ""
            session.status = f"Running {DECODER_TITLES[request.decoder]} ({i % per_repeat + 1}/{per_repeat}{of}) …"
            yield from _run_decoder(engine, session, request, namer, throttle, settle_s)
        for d, run in session.runs.items():  # the race legend names each run with its speedup over AR
            session.feed.add(plots.end_line(d, speedup(session.runs.get("ar"), run)))
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


def _ending(session: Session, sleep: Callable[[float], None]) -> Iterator[Tick]:
    """Before DONE, so that no one page update does it all: the results, then the views whole (the last token, the
    plots' legend). The views go just before DONE, which repeats them: Gradio sends a value equal to the same view's
    previous one as an empty diff."""
    yield Tick(RESULTS, session.status)
    sleep(PAGE_PIECE_S)
    yield Tick(TEXT, session.status, plots=True, whole=True)
    sleep(PAGE_PIECE_S)


def load_status(loader, settings: ComparisonSettings) -> str:
    """The status line while a pair loads: a first use, or a reload of a pair another one replaced."""
    again = loader.loaded_before(settings.target, settings.draft)
    why = "loaded before, then replaced by another pair: loading it again" if again else "first use of this pair"
    return (f"Loading `{shown_path(settings.target)}` + `{shown_path(settings.draft) or 'no draft'}` ({why}; Stop ends "
            "the wait) …")


def _run_decoder(engine, session: Session, request, namer: TokenNamer, throttle: Throttle,
                 settle_s: float) -> Iterator[Tick]:
    """One decoder's timed run into the session (after an untimed warm prefill), a TEXT tick as the throttle allows;
    a target-lane failure keeps what it committed and is added to the session's error."""
    yield Tick(TEXT, session.status, active=request.decoder)
    time.sleep(settle_s)  # the page redraws (most after RESET: new plots) before the timed prefill, not during it
    _warm_prefill(engine, request, session.stop)
    run = session.begin(request.decoder, namer)
    stream = engine.stream(request, session.stop)
    try:
        for event in stream:
            session.add(run, event)
            if isinstance(event, (TokenEvent, StepRecord)) and throttle():
                yield Tick(TEXT, session.status, active=request.decoder)
    finally:
        stream.close()  # closed early (Stop, page gone): the engine stops within one step
    if isinstance(run.end, RunEnd) and run.end.error:  # the target lane failed: keep what it committed
        failed = (f"{DECODER_TITLES[request.decoder]} stopped: the target lane failed ({run.end.error}); "
                  f"the {len(run.end.token_ids)} tokens committed before the failure are kept and shown")
        session.error = f"{session.error}; {failed}" if session.error else failed


def _warm_prefill(engine, request, stop: threading.Event) -> None:
    """The same request for one token, untimed and not shown: both lanes' prefill paths are warm when the timed
    run starts, whichever decoder runs first (AR was always first and its TTFT was always higher)."""
    for _ in engine.stream(replace(request, max_new_tokens=1), stop):
        pass


def finish(session: Session, generation: int) -> None:
    """Write the trace (whatever ran) and mark the session idle; also runs when the generator is closed."""
    if generation != session.generation:
        return  # a newer comparison already owns the session
    try:
        events = session.all_events()
        if events and session.trace_path is None:  # None: this comparison ran (a failed one keeps the last trace)
            fd, path = tempfile.mkstemp(prefix="mirror-sd-trace-", suffix=".json")
            os.close(fd)
            write_trace(path, events, {"prompt": session.prompt,
                                       "output": {d: plain_text(run) for d, run in session.runs.items()}})
            session.trace_path = path
    finally:
        session.idle.set()


def final_status(session: Session) -> str:
    if session.error:
        return f"**Error:** {session.error}"
    if session.load_stopped:
        shown = " The results below are the previous comparison's." if session.runs else ""
        return ("**Stopped** while the pair was loading: it goes on loading in the background and is kept for the "
                f"next Run.{shown}")
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


def replay(session: Session, *, speed: float = 1.0, fps: float = 20.0,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[Tick]:
    """Re-animate the finished runs side by side at their measured commit times (TokenEvent.t − RunStart.t0)."""
    if not session.idle.is_set():  # a live run owns the views until it ends
        yield Tick(STATUS, "A comparison is running: replay it when it has finished.")
        return
    runs = [r for r in session.runs.values() if r.tokens]
    if not runs:
        yield Tick(STATUS, "Nothing to replay yet: run a comparison first.")
        return
    stopped = session.replay_stop = threading.Event()  # set by Stop, and by a new comparison (begin_comparison)
    end = max(r.token_times()[-1] for r in runs)
    t = 0.0
    while t < end and not stopped.is_set():
        pace = "measured speed" if speed == 1.0 else f"{speed:g}× measured speed"
        session.feed.add(plots.cursor_line(t))  # the time cursor on the race and the lane timeline
        yield Tick(TEXT, f"Replaying at {pace}: t = {t * 1e3:.0f} ms of {end * 1e3:.0f} ms", replay_at=t, plots=True)
        sleep(1.0 / fps)
        t += speed / fps
    if not session.idle.is_set():  # a new comparison started: its own events own the views now
        return
    session.feed.add(plots.cursor_line(None))
    yield Tick(TEXT, f"Replay finished ({end * 1e3:.0f} ms of decoding, measured by the engine).", replay_at=None,
               plots=True, whole=True)
