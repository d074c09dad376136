"""Two execution lanes: the target on the caller's thread, the draft in a process, a thread, or inline.

The lanes exchange only token-channel messages (DraftStart, BranchRequest = M_t, ResolveRequest =
(A_t, c), and the DraftWindow reply with the draft lane's spans). Every lane stamps spans with
time.perf_counter (CLOCK_MONOTONIC: one clock for all processes on the machine).
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch

from .channel import Channel, ChannelClosed, Message, wait_until
from .config import RULES, LaneConfig, MirrorError, SamplingConfig
from .draft import BranchRequest, DraftStart, DraftWindow, DraftWorker, ResolveRequest
from .events import (STAGE_DRAFT_BRANCHES, STAGE_DRAFT_ROLLOUT, STAGE_PREFILL, STAGE_SELECT_BRANCH)

FAULT_ENV = "MIRROR_FAULT_DRAFT_AT_STEP"        # e.g. 3: the draft lane fails at step 3
FAULT_MODE_ENV = "MIRROR_FAULT_DRAFT_MODE"      # "raise" (default) or "exit" (the process dies)
_STAGES = (STAGE_PREFILL, STAGE_DRAFT_ROLLOUT, STAGE_DRAFT_BRANCHES, STAGE_SELECT_BRANCH)
_START, _BRANCH, _RESOLVE, _WINDOW, _ERROR, _READY, _SHUTDOWN = range(1, 8)


class LaneError(RuntimeError):
    """The draft lane failed (exception, dead process, timeout); the run continues on the target."""


def fault_plan_from_env() -> tuple[int | None, str]:
    step = os.environ.get(FAULT_ENV, "").strip()
    return (int(step) if step else None), os.environ.get(FAULT_MODE_ENV, "raise")


@dataclass(frozen=True)
class DraftLaneSpec:
    """What the draft lane loads and how it runs (picklable, sent to a spawned process)."""
    source: str
    device: str
    vocab_size: int
    threads: int
    cpus: tuple[int, ...]
    trust_remote_code: bool = False
    runner: str = "auto"


def make_runner(spec: DraftLaneSpec):
    """The draft's runner, loaded on the lane that runs it."""
    from .models import ModelSpec, build_runner, load_model

    model = load_model(ModelSpec(spec.source, spec.device, spec.trust_remote_code), draft=True)
    return build_runner(model, spec.vocab_size, spec.runner)


@contextlib.contextmanager
def pinned(cpus: tuple[int, ...], threads: int):
    """Pin the calling thread to `cpus` and set torch's intra-op threads for the duration."""
    old_threads, old_cpus = torch.get_num_threads(), os.sched_getaffinity(0)
    if threads:
        torch.set_num_threads(threads)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        if cpus:
            os.sched_setaffinity(0, old_cpus)


# -- codec: lane dataclasses <-> channel messages ----------------------------------------------
def _msg(kind: int, i64=(), f64=(), f32=None) -> Message:
    return Message(kind, np.asarray(i64, np.int64), np.asarray(f64, np.float64),
                   np.zeros(0, np.float32) if f32 is None else f32)


def encode(cmd) -> Message:
    if isinstance(cmd, DraftStart):
        s = cmd.sampling
        head = [cmd.gamma, s.seed, s.top_k, RULES.index(s.rule), -1 if cmd.fault_at_step is None else cmd.fault_at_step,
                int(cmd.fault_mode == "exit")]
        return _msg(_START, head + list(cmd.prompt_ids), [s.temperature, s.top_p])
    if isinstance(cmd, BranchRequest):
        kappa = max(len(r) for r in cmd.topk_ids)
        flat = [v for r in cmd.topk_ids for v in list(r) + [-1] * (kappa - len(r))]
        return _msg(_BRANCH, [cmd.step, len(cmd.topk_ids), kappa] + flat)
    if isinstance(cmd, ResolveRequest):
        return _msg(_RESOLVE, [cmd.step, cmd.accepted, cmd.token])
    if isinstance(cmd, DraftWindow):
        rows = len(cmd.branches)
        width = len(cmd.branches[0]) if rows else 0
        vocab = 0 if cmd.p_draft is None else cmd.p_draft.shape[-1]
        head = [-1 if cmd.hit is None else int(cmd.hit), -1 if cmd.branch_row is None else cmd.branch_row,
                len(cmd.tokens), cmd.forwards, rows, width, vocab, cmd.produced]
        i64 = head + list(cmd.tokens) + [t for b in cmd.branches for t in b]
        f64 = [x for stage, t0, t1 in cmd.spans for x in (_STAGES.index(stage), t0, t1)]
        f32 = None if cmd.p_draft is None else cmd.p_draft.numpy().astype(np.float32).ravel()
        return _msg(_WINDOW, i64, f64, f32)
    raise TypeError(f"cannot encode {type(cmd).__name__}")


def decode(msg: Message):
    i = msg.i64.tolist()
    if msg.kind == _START:
        sampling = SamplingConfig(temperature=float(msg.f64[0]), top_k=i[2], top_p=float(msg.f64[1]), seed=i[1],
                                  rule=RULES[i[3]])
        return DraftStart(tuple(i[6:]), i[0], sampling, None if i[4] < 0 else i[4], "exit" if i[5] else "raise")
    if msg.kind == _BRANCH:
        slots, kappa = i[1], i[2]
        return BranchRequest(i[0], tuple(tuple(i[3 + s * kappa: 3 + (s + 1) * kappa]) for s in range(slots)))
    if msg.kind == _RESOLVE:
        return ResolveRequest(i[0], i[1], i[2])
    if msg.kind == _WINDOW:
        hit, row, n, forwards, rows, width, vocab, produced = i[:8]
        tokens = tuple(i[8: 8 + n])
        flat = i[8 + n:]
        branches = tuple(tuple(flat[r * width:(r + 1) * width]) for r in range(rows))
        spans = [(_STAGES[int(msg.f64[k])], float(msg.f64[k + 1]), float(msg.f64[k + 2])) for k in range(0, msg.f64.size, 3)]
        p_draft = torch.from_numpy(msg.f32.reshape(n, vocab)) if vocab else None
        return DraftWindow(tokens, p_draft, None if hit < 0 else bool(hit), None if row < 0 else row, branches, spans, forwards, produced)
    if msg.kind == _ERROR:
        return LaneError(bytes(msg.i64.astype(np.uint8)).decode("utf-8", "replace"))
    raise ValueError(f"unknown message kind {msg.kind}")


def _error_msg(exc: BaseException) -> Message:
    text = f"{type(exc).__name__}: {exc}".encode("utf-8")[:4000]
    return _msg(_ERROR, list(text))


# -- the worker loop shared by every lane kind ---------------------------------------------------
class _Serve:
    """Runs commands in order; a failure is reported at the next ResolveRequest (the only reply)."""

    def __init__(self, worker: DraftWorker):
        self.worker = worker
        self.error: BaseException | None = None

    def __call__(self, cmd):
        if isinstance(cmd, DraftStart):
            self.error = None
        if self.error is None:
            try:
                reply = self.worker.handle(cmd)
            except Exception as exc:  # reported to the target lane, which finishes the run alone
                self.error = exc
                reply = None
        if isinstance(cmd, ResolveRequest):
            return LaneError(f"{type(self.error).__name__}: {self.error}") if self.error else reply
        return None


class InlineLane:
    """Serial: the draft runs on the caller's thread while the target waits (no overlap; tests, 1-core machines)."""

    kind = "inline"

    def __init__(self, runner):
        self.serve = _Serve(DraftWorker(runner))
        self.queued: list = []

    def start(self, cmd) -> None:
        self.queued.append(cmd)

    branch = start

    def resolve(self, cmd: ResolveRequest) -> DraftWindow:
        queued, self.queued = self.queued, []
        for earlier in queued:
            self.serve(earlier)
        return _raise_if_error(self.serve(cmd))

    def drain(self) -> None:
        self.queued = []

    def close(self) -> None:
        pass


class ThreadLane:
    """A thread of this process (on one CUDA device it gets its own stream); shares the GIL."""

    kind = "thread"

    def __init__(self, runner):
        self.serve = _Serve(DraftWorker(runner))
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.device = runner.device
        self.thread = threading.Thread(target=self._loop, name="draft-lane", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while True:
                cmd = self.inbox.get()
                try:
                    if cmd is None:
                        return
                    reply = self.serve(cmd)
                    if isinstance(cmd, ResolveRequest):
                        self.outbox.put(reply)
                finally:
                    self.inbox.task_done()

    def start(self, cmd) -> None:
        self.inbox.put(cmd)

    branch = start

    def resolve(self, cmd: ResolveRequest) -> DraftWindow:
        self.inbox.put(cmd)
        return _raise_if_error(self.outbox.get())

    def drain(self) -> None:
        self.inbox.join()
        while not self.outbox.empty():
            self.outbox.get_nowait()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=30)


class ProcessLane:
    """The draft model in its own spawned process, pinned to its cores, talking through shared memory."""

    kind = "process"

    def __init__(self, spec: DraftLaneSpec, timeout_s: float):
        self.spec, self.timeout_s = spec, timeout_s
        self.proc = None
        self._spawn()

    def _spawn(self) -> None:
        self.channel = Channel(cap_i64=1 << 18, cap_f32=_f32_capacity(self.spec.vocab_size))
        self.proc = mp.get_context("spawn").Process(target=_process_main, args=(self.spec, self.channel.name),
                                                    name="mirror-draft-lane", daemon=True)
        self.proc.start()
        try:
            reply = self.channel.to_target.recv(self.proc.is_alive, 600)
        except ChannelClosed as exc:
            self._reap()
            raise MirrorError(f"the draft lane did not start: {exc}") from None
        if reply.kind != _READY:
            err = decode(reply)
            self._reap()
            raise MirrorError(f"the draft lane did not start: {err}")
        self.outstanding = 0

    def _send(self, cmd) -> None:
        try:
            self.channel.to_worker.send(encode(cmd), self.proc.is_alive, self.timeout_s)
        except ChannelClosed as exc:
            raise LaneError(str(exc)) from None

    def start(self, cmd: DraftStart) -> None:
        if not self.proc.is_alive():  # a previous request killed it (fault injection or crash)
            self._reap()
            try:
                self._spawn()
            except MirrorError as exc:
                raise LaneError(str(exc)) from None
        self.drain()
        self._send(cmd)

    branch = _send

    def resolve(self, cmd: ResolveRequest) -> DraftWindow:
        self._send(cmd)
        self.outstanding += 1
        try:
            msg = self.channel.to_target.recv(self.proc.is_alive, self.timeout_s)
        except ChannelClosed as exc:
            raise LaneError(str(exc)) from None
        self.outstanding -= 1
        return _raise_if_error(decode(msg))

    def drain(self) -> None:
        """Wait until the worker has finished every command sent (at most one step of work)."""
        if not self.proc.is_alive():
            return
        try:
            while self.outstanding:
                self.channel.to_target.recv(self.proc.is_alive, self.timeout_s)
                self.outstanding -= 1
            box = self.channel.to_worker
            wait_until(lambda: box.drained() and box.header[6] == 0, self.proc.is_alive, self.timeout_s)
        except ChannelClosed:
            pass

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.drain()
                self.channel.to_worker.send(_msg(_SHUTDOWN), self.proc.is_alive, 5)
            except ChannelClosed:
                pass
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=5)
        self.channel.close()


def _f32_capacity(vocab: int) -> int:
    from .config import MAX_GAMMA
    return MAX_GAMMA * vocab  # p_draft of one window


def _raise_if_error(reply):
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _process_main(spec: DraftLaneSpec, channel_name: str) -> None:
    """Entry point of the draft lane's process: pinned to its cores for its whole life."""
    parent = os.getppid()
    alive = lambda: os.getppid() == parent  # noqa: E731
    ch = Channel(cap_i64=1 << 18, cap_f32=_f32_capacity(spec.vocab_size), name=channel_name)
    with pinned(spec.cpus, spec.threads):
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            serve = _Serve(DraftWorker(make_runner(spec)))
        except Exception as exc:
            ch.to_target.send(_error_msg(exc), alive, 60)
            return
        ch.to_target.send(_msg(_READY), alive, 60)
        _serve_commands(ch, serve, alive)


def _serve_commands(ch: Channel, serve: _Serve, alive) -> None:
    box = ch.to_worker
    while True:
        try:
            msg = box.recv(alive, float("inf"), mark_busy=True)
        except ChannelClosed:
            return
        if msg.kind == _SHUTDOWN:
            box.header[6] = 0
            return
        reply = serve(decode(msg))
        box.header[6] = 0
        if msg.kind == _RESOLVE:
            ch.to_target.send(_error_msg(reply) if isinstance(reply, BaseException) else encode(reply), alive, 600)


def make_draft_lane(lanes: LaneConfig, spec: DraftLaneSpec):
    """The draft lane for this mapping (the one place lane kinds are chosen)."""
    if lanes.kind == "process":
        return ProcessLane(spec, lanes.reply_timeout_s)
    runner = make_runner(spec)
    return ThreadLane(runner) if lanes.kind == "thread" else InlineLane(runner)
