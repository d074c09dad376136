"""The token channel between the target lane and a draft-lane process: shared memory + sequence counters.

Measured on the 2-core dev machine (BENCHMARKS.md's history, `python -m mirror_core channel`): a round trip of a 64-id
message costs about 15 µs with shared memory and a sequence counter, against 61–237 µs for
multiprocessing pipes and milliseconds for torch queues, so lanes in separate processes talk
through two one-slot mailboxes in one shared-memory block. A writer fills the payload, then bumps
SEQ; the reader sees SEQ change, copies the payload, then sets ACK. The writer waits for
ACK == SEQ before it writes again. BUSY says the reader is still working on what it acknowledged.

Memory ordering. Without locks the protocol is correct only where another core sees one core's
stores in program order and loads are not reordered with loads (x86 and x86-64, "total store
order"): the payload is written before SEQ and read after it, and BUSY is set before ACK. On
other hosts (ARM, POWER, RISC-V) a peer may see the new SEQ before the payload, so there each
mailbox gets a lock from `multiprocessing` that the writer holds while it publishes and the reader
holds while it copies out and acknowledges; the lock's acquire and release are the fences. The
counters are still polled without it, as hints. `Channel(ordered_stores=...)` picks the mode
(default: ORDERED_STORES, from the host), so both paths run in the tests on an x86 machine.

Waiting. A reader yield-spins for SPIN_S (a run exchanges messages every few milliseconds), then
sleeps in short ticks, and once idle for IDLE_S (between runs) sets DOZING and blocks on the mailbox's
doorbell, a semaphore the writer releases after publishing when it sees DOZING. Each side puts a full
barrier between its store and its load of the other's flag (x86 may let a load pass an earlier store), so
no ring is lost; DOZE_S, the doze's timeout, only bounds a wait whose writer died. An idle draft lane thus
costs almost no CPU, and the first message after a pause arrives within a fraction of a millisecond
(measured: BENCHMARKS.md's history, `python -m mirror_core channel`). A reader whose cores the target is
using meanwhile waits asleep at once (recv(asleep=True)): spinning there would take them from the target (sd
on ar's cores, Mirror-SD's plain steps, and Mirror-SD's layers before the early exit where the draft lane lends
its cores: LaneConfig.lend_cores).

Every message is (kind, int64 array, float64 array, float32 array); codec.py lays the lanes'
dataclasses out in it.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ..machine import yield_cpu

# The mailbox header: int64 words at these indices, then the payload arrays.
SEQ = 0      # messages published so far (the writer bumps it last)
ACK = 1      # messages copied out so far (the reader sets it = SEQ after copying)
KIND = 2     # the message's kind (codec.FRAMES)
N_I64 = 3    # int64 words in the message
N_F64 = 4    # float64 words in the message
N_F32 = 5    # float32 words in the message
BUSY = 6     # 1 while the reader works on a message it acknowledged (mark_busy / mark_idle)
DOZING = 7   # 1 while the reader sleeps on the mailbox's doorbell (idle for IDLE_S): the writer rings it
HEADER = 8   # words in the header

SPIN_S = 0.05   # a waiting reader yield-spins this long (µs latency while a run exchanges messages),
SLEEP_S = 0.0002  # then sleeps this long between polls,
IDLE_S = 1.0      # and after this long without a message blocks on the mailbox's doorbell (a semaphore the
DOZE_S = 0.1      # writer rings after publishing), re-polling at least every DOZE_S: an idle lane costs ~0 CPU
LOCK_TIMEOUT_S = 10.0  # a mailbox lock is held for microseconds; longer means its holder died inside it

# Hosts whose cores see each other's stores in program order (x86 TSO); platform.machine() spellings.
TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i486", "i586", "i686", "x86"})
ORDERED_STORES = platform.machine().lower() in TSO_MACHINES  # this host: publish with plain stores


_BARRIER = threading.Lock()


def full_barrier() -> None:
    """A full memory barrier (an uncontended lock's atomic read-modify-write): the store before it is seen by the
    other cores before the load after it is made, which x86's ordered stores alone do not promise."""
    with _BARRIER:
        pass


class ChannelClosed(RuntimeError):
    """The peer died or did not answer in time."""


@dataclass(frozen=True)
class Message:
    """One frame on the channel; codec.py maps the lanes' dataclasses to and from it."""
    kind: int         # which dataclass (codec.FRAMES); 0 is never sent
    i64: np.ndarray   # [n_i64] int64: ints, bools, lengths, shapes, UTF-8 bytes
    f64: np.ndarray   # [n_f64] float64: floats (sampling settings, span times)
    f32: np.ndarray   # [n_f32] float32: tensors, flattened row-major (p_draft)


@dataclass(frozen=True)
class ChannelHandle:
    """What a spawned process needs to attach to a channel (picklable while spawning: it may carry locks)."""
    name: str                                  # the shared-memory block's name
    caps: tuple[int, int, int]                 # (int64, float64, float32) words per mailbox
    locks: tuple[Any, Any] | None = None       # (to_worker, to_target) spawn-context locks; None: plain stores
    bells: tuple[Any, Any] | None = None       # (to_worker, to_target) doorbell semaphores; None: sleep instead


class Mailbox:
    """One direction of the channel, a view into the shared block; `lock` None means the host orders stores."""

    def __init__(self, buf, offset: int, cap_i64: int, cap_f64: int, cap_f32: int, lock=None, bell=None):
        self.header = np.ndarray((HEADER,), np.int64, buf, offset)
        offset += HEADER * 8
        self.i64 = np.ndarray((cap_i64,), np.int64, buf, offset)
        offset += cap_i64 * 8
        self.f64 = np.ndarray((cap_f64,), np.float64, buf, offset)
        offset += cap_f64 * 8
        self.f32 = np.ndarray((cap_f32,), np.float32, buf, offset)
        self.end = offset + cap_f32 * 4
        self.last_read = 0
        self._fenced = contextlib.nullcontext() if lock is None else _Fence(lock)
        self.bell = bell

    @staticmethod
    def nbytes(cap_i64: int, cap_f64: int, cap_f32: int) -> int:
        return HEADER * 8 + cap_i64 * 8 + cap_f64 * 8 + cap_f32 * 4

    def send(self, msg: Message, alive: Callable[[], bool], timeout_s: float) -> None:
        for data, box, name in ((msg.i64, self.i64, "int64"), (msg.f64, self.f64, "float64"),
                                (msg.f32, self.f32, "float32")):
            if data.size > box.size:
                raise ValueError(f"message too large for the channel: frame kind {msg.kind} has {data.size} "
                                 f"{name} words, the mailbox holds {box.size}")
        h = self.header
        wait_until(lambda: h[ACK] == h[SEQ], alive, timeout_s)  # the previous message was read
        with self._fenced:
            self.i64[: msg.i64.size] = msg.i64
            self.f64[: msg.f64.size] = msg.f64
            self.f32[: msg.f32.size] = msg.f32
            h[KIND], h[N_I64], h[N_F64], h[N_F32] = msg.kind, msg.i64.size, msg.f64.size, msg.f32.size
            h[SEQ] = h[SEQ] + 1  # publish last
        full_barrier()  # SEQ's store before DOZING's load
        if h[DOZING] and self.bell is not None:  # a reader sleeps on the doorbell: wake it
            self.bell.release()

    def poll(self) -> bool:
        return int(self.header[SEQ]) != self.last_read

    def recv(self, alive: Callable[[], bool], timeout_s: float, busy: bool = False, asleep: bool = False) -> Message:
        """Copy the next message out; busy=True marks the mailbox busy before acknowledging, so idle() never
        reports a command the reader has taken but not finished (the reader calls mark_idle when done); asleep=True
        waits on the doorbell at once instead of spinning first (the target is using the reader's cores)."""
        h = self.header
        wait_until(self.poll, alive, timeout_s, None if self.bell is None else self._doze, asleep)
        with self._fenced:
            msg = Message(int(h[KIND]), self.i64[: h[N_I64]].copy(), self.f64[: h[N_F64]].copy(),
                          self.f32[: h[N_F32]].copy())
            if busy:
                h[BUSY] = 1
            self.last_read = int(h[SEQ])
            h[ACK] = self.last_read
        return msg

    def _doze(self) -> None:
        """Idle: sleep until the writer rings (or DOZE_S passes: a ring lost to a race costs at most that)."""
        self.header[DOZING] = 1
        try:
            full_barrier()  # DOZING's store before SEQ's load
            if not self.poll():
                self.bell.acquire(timeout=DOZE_S)
        finally:
            self.header[DOZING] = 0

    def mark_busy(self) -> None:
        with self._fenced:
            self.header[BUSY] = 1

    def mark_idle(self) -> None:
        with self._fenced:
            self.header[BUSY] = 0

    @property
    def busy(self) -> bool:
        with self._fenced:
            return bool(self.header[BUSY])

    def drained(self) -> bool:
        """Every message sent has been copied out (the reader may still be working on the last)."""
        with self._fenced:
            return int(self.header[ACK]) == int(self.header[SEQ])

    def idle(self) -> bool:
        """Drained and the reader has finished with what it took (ACK, SEQ and BUSY read together)."""
        with self._fenced:
            return int(self.header[ACK]) == int(self.header[SEQ]) and not self.header[BUSY]


class _Fence:
    """A mailbox's lock (hosts without ordered stores), given up on if its holder died inside it."""

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self) -> None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise ChannelClosed(f"the channel's lock was held for over {LOCK_TIMEOUT_S:.0f} s (its holder died)")

    def __exit__(self, *exc) -> None:
        self.lock.release()


def wait_until(ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: float,
               doze: Callable[[], None] | None = None, asleep: bool = False) -> None:
    """Poll until ready: yield-spin for SPIN_S, then sleep SLEEP_S between polls; a reader with a doorbell calls
    doze() instead once idle for IDLE_S, or at once when `asleep`. Waits without one (a writer waiting for ACK,
    drain) keep the short ticks, so they never add more than SLEEP_S. The peer's liveness and the timeout are
    checked every 256 spins and after every sleep."""
    t0 = time.perf_counter()
    spins = 0
    while not ready():
        waited = time.perf_counter() - t0
        if asleep and doze is not None:
            doze()
        elif waited < SPIN_S:
            yield_cpu()
            spins += 1
            if spins % 256:
                continue
        elif waited < IDLE_S or doze is None:
            time.sleep(SLEEP_S)
        else:
            doze()
        if not alive():
            raise ChannelClosed("the draft lane's process died")
        if waited > timeout_s:
            raise ChannelClosed(f"the draft lane did not answer within {timeout_s:.0f} s")


class Channel:
    """Two mailboxes (to the worker, back from it) in one shared-memory block; the creator (name None) owns it.

    ordered_stores=False publishes under a lock per mailbox (the mode for hosts other than x86; see
    the module docstring). A peer attaches by name; a spawned peer uses Channel.attach(channel.handle),
    which also carries the locks.
    """

    def __init__(self, cap_i64: int, cap_f32: int, cap_f64: int = 4096, name: str | None = None, *,
                 ordered_stores: bool = ORDERED_STORES, locks: tuple[Any, Any] | None = None,
                 bells: tuple[Any, Any] | None = None):
        self.caps = (cap_i64, cap_f64, cap_f32)
        size = 2 * Mailbox.nbytes(*self.caps)
        self.owner = name is None
        if self.owner and locks is None and not ordered_stores:
            ctx = mp.get_context("spawn")  # the peers are spawned; a fork-context lock cannot travel to them
            locks = (ctx.Lock(), ctx.Lock())
        if ordered_stores != (locks is None):
            raise ValueError("a channel without ordered stores needs its creator's locks at both ends (attach "
                             "with Channel.attach(channel.handle)); one with ordered stores takes none")
        if self.owner and bells is None:
            ctx = mp.get_context("spawn")
            bells = (ctx.Semaphore(0), ctx.Semaphore(0))
        self.locks, self.bells = locks, bells
        self.shm = shared_memory.SharedMemory(name=name, create=self.owner, size=size if self.owner else 0)
        if self.owner:
            np.ndarray((size,), np.uint8, self.shm.buf)[:] = 0
        to_worker_lock, to_target_lock = locks or (None, None)
        to_worker_bell, to_target_bell = bells or (None, None)
        self.to_worker = Mailbox(self.shm.buf, 0, *self.caps, lock=to_worker_lock, bell=to_worker_bell)
        self.to_target = Mailbox(self.shm.buf, self.to_worker.end, *self.caps, lock=to_target_lock,
                                 bell=to_target_bell)

    @classmethod
    def attach(cls, handle: ChannelHandle) -> Channel:
        """The peer's view of a channel another process created (it never unlinks the block)."""
        cap_i64, cap_f64, cap_f32 = handle.caps
        return cls(cap_i64, cap_f32, cap_f64, handle.name, ordered_stores=handle.locks is None, locks=handle.locks,
                   bells=handle.bells)

    @property
    def name(self) -> str:
        return self.shm.name

    @property
    def ordered_stores(self) -> bool:
        return self.locks is None

    @property
    def handle(self) -> ChannelHandle:
        return ChannelHandle(self.shm.name, self.caps, self.locks, self.bells)

    def close(self) -> None:
        """Release the block (idempotent); the creator also unlinks it."""
        if self.shm is None:
            return
        del self.to_worker, self.to_target
        self.shm.close()
        if self.owner:
            self.shm.unlink()
        self.shm = None


def round_trip_benchmark(n: int = 2000, ordered_stores: bool = ORDERED_STORES, idle_trials: int = 3) -> str:
    """`python -m mirror_core channel`: round trips of a 64-id + 64-log-prob message to a spawned process,
    back to back, then after IDLE_S + 3.1 s of silence each (the first message of a run), with the CPU the
    idle peer used over the last 3 s of each silence."""
    ch = Channel(cap_i64=1024, cap_f32=1024, ordered_stores=ordered_stores)
    proc = mp.get_context("spawn").Process(target=echo, args=(ch.handle, n + idle_trials), daemon=True)
    proc.start()
    msg = Message(1, np.arange(64, dtype=np.int64), np.zeros(0), np.zeros(64, np.float32))

    def round_trip() -> float:
        t0 = time.perf_counter()
        ch.to_worker.send(msg, proc.is_alive, 10)
        ch.to_target.recv(proc.is_alive, 10)
        return time.perf_counter() - t0

    times = sorted(round_trip() for _ in range(n))
    idle, cpu = [], []
    for _ in range(idle_trials):
        time.sleep(IDLE_S + 0.1)  # the peer is past its spinning and short-sleep phases: dozing
        cpu_before, t0 = _cpu_seconds(proc.pid), time.perf_counter()
        time.sleep(3.0)  # CPU times tick in 10 ms: a long window
        if cpu_before is not None:
            cpu.append((_cpu_seconds(proc.pid) - cpu_before) / (time.perf_counter() - t0))
        idle.append(round_trip())
    proc.join()
    ch.close()
    idle.sort()
    line = (f"shared-memory round trip: median {times[n // 2] * 1e6:.1f} µs, p99 {times[int(n * 0.99)] * 1e6:.1f} µs "
            f"(n={n}); after {IDLE_S + 3.1:.1f} s idle: median {idle[len(idle) // 2] * 1e6:.0f} µs, "
            f"max {idle[-1] * 1e6:.0f} µs (n={idle_trials})")
    if cpu:
        line += f"; the idle peer used {100 * max(cpu):.2f} % of a core at most"
    return line


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used (None where psutil is missing)."""
    try:
        import psutil
    except ImportError:
        return None
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def echo(handle: ChannelHandle, n: int) -> None:
    """A spawned peer that sends back each of the next n messages (the benchmark's and the tests' far end)."""
    ch = Channel.attach(handle)
    for _ in range(n):
        ch.to_target.send(ch.to_worker.recv(lambda: True, 10), lambda: True, 10)
    ch.close()
