"""The token channel between the target lane and a draft-lane process: shared memory + sequence counters.

Measured on the 2-core dev machine (docs/BENCHMARKS.md, `python -m mirror_core channel`): a round
trip of a 64-id message costs a few µs with shared memory and a sequence counter, against
61–237 µs for multiprocessing pipes and milliseconds for torch queues, so lanes in separate
processes talk through two one-slot mailboxes in one shared-memory block. A writer fills the
payload, then bumps `seq`; the reader sees `seq` change, copies the payload, then sets `ack`.
The writer waits for `ack == seq` before it writes again. (x86 stores are seen in program order;
the counters are written last and read first.)

Every message is (kind, int64 array, float64 array, float32 array); codec.py-style encoding of
the lane's dataclasses lives in lanes.py.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Callable

import numpy as np

HEADER = 8  # int64 words: seq, ack, kind, n_i64, n_f64, n_f32, busy (reader working), reserved
SPIN_S = 0.05   # yield-spin this long before sleeping between polls
SLEEP_S = 0.0002


class ChannelClosed(RuntimeError):
    """The peer died or did not answer in time."""


@dataclass(frozen=True)
class Message:
    kind: int
    i64: np.ndarray
    f64: np.ndarray
    f32: np.ndarray


class Mailbox:
    """One direction of the channel, a view into the shared block."""

    def __init__(self, buf, offset: int, cap_i64: int, cap_f64: int, cap_f32: int):
        self.header = np.ndarray((HEADER,), np.int64, buf, offset)
        offset += HEADER * 8
        self.i64 = np.ndarray((cap_i64,), np.int64, buf, offset)
        offset += cap_i64 * 8
        self.f64 = np.ndarray((cap_f64,), np.float64, buf, offset)
        offset += cap_f64 * 8
        self.f32 = np.ndarray((cap_f32,), np.float32, buf, offset)
        self.end = offset + cap_f32 * 4
        self.last_read = 0

    @staticmethod
    def nbytes(cap_i64: int, cap_f64: int, cap_f32: int) -> int:
        return HEADER * 8 + cap_i64 * 8 + cap_f64 * 8 + cap_f32 * 4

    def send(self, msg: Message, alive: Callable[[], bool], timeout_s: float) -> None:
        h = self.header
        wait_until(lambda: h[1] == h[0], alive, timeout_s)  # the previous message was read
        for name in ("i64", "f64", "f32"):
            data = getattr(msg, name)
            if data.size > getattr(self, name).size:
                raise ValueError(f"message too large for the channel ({name}: {data.size} > {getattr(self, name).size})")
            getattr(self, name)[: data.size] = data
        h[2], h[3], h[4], h[5] = msg.kind, msg.i64.size, msg.f64.size, msg.f32.size
        h[0] = h[0] + 1  # publish last

    def poll(self) -> bool:
        return int(self.header[0]) != self.last_read

    def recv(self, alive: Callable[[], bool], timeout_s: float, mark_busy: bool = False) -> Message:
        """Copy the next message out; mark_busy sets the busy word before acknowledging (see drain)."""
        h = self.header
        wait_until(self.poll, alive, timeout_s)
        msg = Message(int(h[2]), self.i64[: h[3]].copy(), self.f64[: h[4]].copy(), self.f32[: h[5]].copy())
        if mark_busy:
            h[6] = 1
        self.last_read = int(h[0])
        h[1] = self.last_read
        return msg

    def drained(self) -> bool:
        return int(self.header[1]) == int(self.header[0])


def wait_until(ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: float) -> None:
    """Spin (yielding the core) until ready; sleep in short ticks after SPIN_S; check the peer."""
    t0 = time.perf_counter()
    n = 0
    while not ready():
        n += 1
        if n % 256:
            os.sched_yield()
            continue
        waited = time.perf_counter() - t0
        if not alive():
            raise ChannelClosed("the draft lane's process died")
        if waited > timeout_s:
            raise ChannelClosed(f"the draft lane did not answer within {timeout_s:.0f} s")
        if waited > SPIN_S:
            time.sleep(SLEEP_S)


class Channel:
    """Two mailboxes (to the worker, back from it) in one shared-memory block."""

    def __init__(self, cap_i64: int, cap_f32: int, cap_f64: int = 4096, name: str | None = None):
        self.caps = (cap_i64, cap_f64, cap_f32)
        size = 2 * Mailbox.nbytes(*self.caps)
        self.owner = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=self.owner, size=size if self.owner else 0)
        if self.owner:
            np.ndarray((size,), np.uint8, self.shm.buf)[:] = 0
        self.to_worker = Mailbox(self.shm.buf, 0, *self.caps)
        self.to_target = Mailbox(self.shm.buf, self.to_worker.end, *self.caps)

    @property
    def name(self) -> str:
        return self.shm.name

    def close(self) -> None:
        """Release the block (idempotent); the creator also unlinks it."""
        if self.shm is None:
            return
        del self.to_worker, self.to_target
        self.shm.close()
        if self.owner:
            self.shm.unlink()
        self.shm = None


def round_trip_benchmark(n: int = 2000) -> str:
    """`python -m mirror_core channel`: round trip of a 64-id + 64-log-prob message to a spawned process."""
    import multiprocessing as mp

    ch = Channel(cap_i64=1024, cap_f32=1024)
    proc = mp.get_context("spawn").Process(target=_echo, args=(ch.name, n), daemon=True)
    proc.start()
    msg = Message(1, np.arange(64, dtype=np.int64), np.zeros(0), np.zeros(64, np.float32))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ch.to_worker.send(msg, proc.is_alive, 10)
        ch.to_target.recv(proc.is_alive, 10)
        times.append(time.perf_counter() - t0)
    proc.join()
    times.sort()
    ch.close()
    return f"shared-memory round trip: median {times[n // 2] * 1e6:.1f} µs, p99 {times[int(n * 0.99)] * 1e6:.1f} µs (n={n})"


def _echo(name: str, n: int) -> None:
    ch = Channel(1024, 1024, name=name)
    for _ in range(n):
        ch.to_target.send(ch.to_worker.recv(lambda: True, 10), lambda: True, 10)
    ch.close()
