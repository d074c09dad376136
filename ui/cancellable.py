"""A sync generator behind an async one, so that Gradio's cancel reaches the work the generator is doing."""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_END = object()  # next()'s default: the generator has ended


async def cancellable(items: Iterator[T], cancel: Callable[[], None]) -> AsyncIterator[T]:
    """`items`, pulled one next() at a time on a worker thread of its own; a cancel calls `cancel()` at once.

    Gradio cancels an event (Stop's `cancels=`, a client's POST /cancel) by cancelling the asyncio task that awaits
    its handler. A sync generator handler hears of that only at its next yield, and a timed run yields rarely (the
    page holds still while the lanes are timed), so on a fast CPU a cancelled run could finish first. Here the cancel
    calls `cancel()` (it sets the run's stop flag, which the engine checks between two steps), waits for the
    next() in flight to return (the engine ends the step it is in), closes `items` (its `finally` frees the lanes)
    and re-raises the cancel: Gradio's cancel returns with the lanes free. Each next() runs in the awaiting task's
    context (gr.Warning and gr.Request read Gradio's context variables)."""
    loop = asyncio.get_running_loop()
    worker = ThreadPoolExecutor(1, thread_name_prefix="mirror-run")
    pending = None
    try:
        while True:
            pending = loop.run_in_executor(worker, contextvars.copy_context().run, next, items, _END)
            try:
                item = await asyncio.shield(pending)  # a cancel leaves the next() in flight running
            except asyncio.CancelledError:
                cancel()
                await asyncio.wait([pending])
                raise
            if item is _END:
                return
            yield item
    finally:
        # (a second cancel can leave a next() running: `items` is then closed when it is dropped)
        closing = loop.run_in_executor(worker, items.close) if pending is None or pending.done() else None
        worker.shutdown(wait=False)  # its thread ends once what was given to it has run
        if closing is not None:
            await closing
