"""Two execution lanes: the target on the caller's thread, the draft in a process, a thread, or inline.

The lanes exchange only token-channel messages (DraftStart, BranchRequest = M_t, ResolveRequest =
(A_t, c), and the DraftWindow reply with the draft lane's spans). Every lane stamps spans with
time.perf_counter (CLOCK_MONOTONIC: one clock for all processes on the machine).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

from .. import machine
from ..config import FaultPlan, LaneConfig, MirrorError
from ..draft_feature import worker_for
from ..draft_worker import DraftWorker
from ..messages import DraftStart, DraftWindow, ResolveRequest
from ..records import Calibration
from ..runners.mapped import runner_name
from .channel import Channel, ChannelClosed, ChannelHandle, wait_until
from .codec import LaneError, LaneFailed, LaneReady, LaneRest, LaneShutdown, decode, encode
from .placement import pinned


class DraftLane(Protocol):
    """What the decode loops ask of a draft lane, whatever runs it (InlineLane, ThreadLane, ProcessLane)."""

    kind: str                 # "inline", "thread" or "process" (what the run settings and the page say)
    parallel: bool            # the draft works while the target does (False: inline, served when a window is asked)
    calibration: Calibration  # the draft's dtype per shape, timed where it runs
    runner_name: str          # which runner executes the draft

    def start(self, cmd: DraftStart) -> None: ...            # a request's prefill and first rollout, sent
    def branch(self, cmd) -> None: ...                       # M_t (BranchRequest), sent
    def resolve(self, cmd: ResolveRequest) -> DraftWindow: ...  # (A_t, c) → the next window
    def post(self, cmd: ResolveRequest) -> None: ...         # (A_t, c) sent; its window collected later ...
    def collect(self) -> DraftWindow: ...                    # ... here, after the next plain step
    def drain(self) -> None: ...                             # forget what a finished request left in flight
    def close(self) -> None: ...


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
    dtype: str = "auto"  # config.DTYPE_CHOICES (runners/calibrate.py)
    kernel: str = "auto"  # config.KERNEL_CHOICES (kernels/native.py)
    fault: FaultPlan = FaultPlan()  # test hook: fail on purpose at a step (config.FaultPlan)
    feature_floats: int = 0         # a feature-reading draft: the largest features message (context × H floats)


def make_runner(spec: DraftLaneSpec):
    """The draft's runner, loaded on the lane that runs it, in the dtypes calibrated (or forced) there;
    returns the runner and its records.Calibration."""
    from ..models.loading import ModelSpec, load_model, local_folder
    from ..runners import build_runner, choose_kernel
    from ..runners.calibrate import calibrate_draft
    from ..models.vocab import load_vocab_map
    from ..runners.mapped import MappedRunner

    from ..models.feature_draft import is_feature_draft, load_feature_draft
    from ..runners.calibrate import calibrate_feature_draft
    from ..runners.feature import FeatureRunner

    vmap = load_vocab_map(local_folder(spec.source))
    if is_feature_draft(local_folder(spec.source)):
        draft = load_feature_draft(local_folder(spec.source))
        kernel = choose_kernel(spec.kernel, spec.device, draft.embed.dtype)
        runner = FeatureRunner(draft, vmap, spec.device, kernel=kernel)
        return runner, calibrate_feature_draft(runner, spec.dtype)
    model = load_model(ModelSpec(spec.source, spec.device, spec.trust_remote_code), draft=True)
    if vmap is None:
        runner = build_runner(model, spec.vocab_size, spec.runner, kernel=spec.kernel)
    else:  # a reduced-vocabulary draft: its own ids inside, the target's outside
        runner = MappedRunner(build_runner(model, vmap.size + 1, spec.runner, kernel=spec.kernel), vmap)
    return runner, calibrate_draft(runner, spec.dtype, model.config)


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
    parallel = False

    def __init__(self, worker: DraftWorker, calibration: Calibration):
        self.serve, self.calibration = _Serve(worker), calibration
        self.runner_name = runner_name(worker.runner)
        self.queued: list = []

    def start(self, cmd) -> None:
        self.queued.append(cmd)

    branch = post = start

    def resolve(self, cmd: ResolveRequest) -> DraftWindow:
        self.post(cmd)
        return self.collect()

    def collect(self) -> DraftWindow:
        """Serve what was sent, in order; the reply is the ResolveRequest's."""
        queued, self.queued = self.queued, []
        replies = [self.serve(cmd) for cmd in queued]
        return _raise_if_error(next(r for cmd, r in zip(queued, replies) if isinstance(cmd, ResolveRequest)))

    def drain(self) -> None:
        self.queued = []

    def close(self) -> None:
        pass


class ThreadLane:
    """A thread of this process (on one CUDA device it gets its own stream); shares the GIL."""

    kind = "thread"
    parallel = True

    def __init__(self, worker: DraftWorker, calibration: Calibration):
        self.serve, self.calibration = _Serve(worker), calibration
        self.runner_name = runner_name(worker.runner)
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.device = worker.runner.device
        self.thread = threading.Thread(target=self._loop, name="draft-lane", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        with machine.own_stream(self.device):
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

    branch = post = start

    def resolve(self, cmd: ResolveRequest) -> DraftWindow:
        self.post(cmd)
        return self.collect()

    def collect(self) -> DraftWindow:
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
    parallel = True

    def __init__(self, spec: DraftLaneSpec, timeout_s: float):
        self.spec, self.timeout_s = spec, timeout_s
        self.proc = None
        self._spawn()

    def _spawn(self) -> None:
        self.channel = Channel(cap_i64=1 << 18, cap_f32=max(_f32_capacity(self.spec.vocab_size),
                                                             self.spec.feature_floats))
        self.proc = mp.get_context("spawn").Process(target=_process_main, args=(self.spec, self.channel.handle),
                                                    name="mirror-draft-lane", daemon=True)
        self.proc.start()
        try:
            reply = decode(self.channel.to_target.recv(self.proc.is_alive, 600))
        except ChannelClosed as exc:
            self._reap()
            raise MirrorError(f"the draft lane did not start: {exc}") from None
        if not isinstance(reply, LaneReady):
            self._reap()
            raise MirrorError(f"the draft lane did not start: {_lane_error(reply)}")
        self.calibration = Calibration.from_json(reply.calibration)
        self.runner_name = reply.runner
        self.outstanding = 0
        self.resting = False  # the worker was last told to rest (LaneRest), nothing sent since

    def _send(self, cmd) -> None:
        try:
            self.channel.to_worker.send(encode(cmd), self.proc.is_alive, self.timeout_s)
        except ChannelClosed as exc:
            raise LaneError(str(exc)) from None
        self.resting = isinstance(cmd, LaneRest)

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
        self.post(cmd)
        return self.collect()

    def post(self, cmd: ResolveRequest) -> None:
        self._send(cmd)
        self.outstanding += 1

    def collect(self) -> DraftWindow:
        try:
            msg = self.channel.to_target.recv(self.proc.is_alive, self.timeout_s)
        except ChannelClosed as exc:
            raise LaneError(str(exc)) from None
        self.outstanding -= 1
        return _raise_if_error(_lane_error(decode(msg)))

    def drain(self) -> None:
        """Wait until the worker has finished every command sent (at most one step of work); then it rests (LaneRest)
        until the next request."""
        if not self.proc.is_alive():
            return
        try:
            while self.outstanding:
                self.channel.to_target.recv(self.proc.is_alive, self.timeout_s)
                self.outstanding -= 1
            if not self.resting:
                self._send(LaneRest())
            wait_until(self.channel.to_worker.idle, self.proc.is_alive, self.timeout_s)
        except (ChannelClosed, LaneError):
            pass

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.drain()
                self.channel.to_worker.send(encode(LaneShutdown()), self.proc.is_alive, 5)
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
    from ..config import MAX_GAMMA
    return MAX_GAMMA * vocab  # p_draft of one window


def _raise_if_error(reply):
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _lane_error(reply):
    """A LaneFailed frame from the process lane as the LaneError the other lanes' _Serve returns."""
    return LaneError(reply.text) if isinstance(reply, LaneFailed) else reply


def _process_main(spec: DraftLaneSpec, channel: ChannelHandle) -> None:
    """Entry point of the draft lane's process: pinned to its cores for its whole life."""
    parent = os.getppid()
    alive = lambda: os.getppid() == parent  # noqa: E731
    ch = Channel.attach(channel)
    with pinned(spec.cpus, spec.threads):
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            runner, calibration = make_runner(spec)
            serve = _Serve(worker_for(runner, spec.fault))
        except Exception as exc:
            ch.to_target.send(encode(LaneFailed.of(exc)), alive, 60)
            return
        ch.to_target.send(encode(LaneReady(calibration.to_json(), runner_name(runner))), alive, 60)
        _serve_commands(ch, serve, alive)


def _serve_commands(ch: Channel, serve: _Serve, alive) -> None:
    box, resting = ch.to_worker, False
    while True:
        try:  # asleep between requests, and where the target's next step uses this lane's cores (DraftStart.shared)
            cmd = decode(box.recv(alive, float("inf"), busy=True, asleep=resting or serve.worker.asleep))
        except ChannelClosed:
            return
        if isinstance(cmd, LaneShutdown):
            box.mark_idle()
            return
        resting = isinstance(cmd, LaneRest)
        if resting:
            box.mark_idle()
            continue
        reply = serve(cmd)
        box.mark_idle()
        if isinstance(cmd, ResolveRequest):
            ch.to_target.send(encode(LaneFailed.of(reply) if isinstance(reply, BaseException) else reply), alive, 600)


def make_draft_lane(lanes: LaneConfig, spec: DraftLaneSpec):
    """The draft lane for this mapping (the one place lane kinds are chosen)."""
    if lanes.kind == "process":
        return ProcessLane(spec, lanes.reply_timeout_s)
    runner, calibration = make_runner(spec)
    return (ThreadLane if lanes.kind == "thread" else InlineLane)(worker_for(runner, spec.fault), calibration)
