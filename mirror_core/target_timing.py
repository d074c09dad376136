"""The target's timings, the load phase of MirrorEngine.load (pair.py) that measures it where it runs: its format and
call-shape check (runners/calibrate.py, runners/exactness.py), the whole machine's one-token step beside its lane's
(the baseline ar and sd run on, bounded: records.WholeMachine), and its roofline. Timed again on a loaded pair when its
format changes (MirrorEngine.set_target_format) and, for the whole machine, before each of the page's comparisons
(MirrorEngine.recheck_whole_machine)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from . import machine
from .config import LaneConfig
from .lanes import pinned
from .records import Calibration, Roofline, RowCheck, WholeMachine
from .runners.calibrate import cached_step_is_stale, calibrate_target, lane_read_gbs, step_ms

WHOLE_MACHINE_PAIRS = 4  # the lane's and the whole machine's step, timed alternately this many times at load
WHOLE_MACHINE_TRIES = 3  # timings of both at most, until one lies within its bounds (records.WholeMachine.bounded)


@dataclass(frozen=True)
class TargetTiming:
    dtype: Calibration           # the target lane's dtype and its timings
    rows: RowCheck               # its call-shape check and row plan
    whole: WholeMachine | None   # its step on the lane's cores and on every core (None: the lane has them all)


def time_target(runner, vocab: int, lanes: LaneConfig, config) -> TargetTiming:
    """With the target lane's threads, the kernels it will run: its dtype first, then its call-shape check; then the
    whole machine's step beside the lane's (time_whole_machine)."""
    kernel = runner.kernel.library is not None
    cores = lanes.target_cpus if lanes.target_device == "cpu" else ()
    with pinned(cores, lanes.target_threads, kernel):
        dtype, rows = calibrate_target(runner, vocab, lanes.dtype, config, lanes.keep_formats)
    whole = time_whole_machine(runner, lanes)
    if whole is not None and not whole.busy and cached_step_is_stale(dtype, whole.lane_ms):
        with pinned(cores, lanes.target_threads, kernel):  # a cached table out of step with today's lane: time it anew
            dtype, rows = calibrate_target(runner, vocab, lanes.dtype, config, lanes.keep_formats, retime=True)
    return TargetTiming(dtype, rows, whole)


def time_whole_machine(runner, lanes: LaneConfig, stop: threading.Event | None = None) -> WholeMachine | None:
    """Where the lane has some of the cores (None elsewhere, and where `stop` is set before it ends): the target's
    one-token step there and on all of them, timed alternately; timed again, up to WHOLE_MACHINE_TRIES times, while
    the two lie outside their bounds (WholeMachine.bounded: another process held a core), the last timing kept, out
    of bounds, where none was in."""
    every = machine.usable_cpus()
    if lanes.target_device != "cpu" or not lanes.target_cpus or len(every) <= len(lanes.target_cpus):
        return None
    kernel = runner.kernel.library is not None
    for tries in range(WHOLE_MACHINE_TRIES):
        lane, whole_machine = [], []
        for _ in range(WHOLE_MACHINE_PAIRS):  # alternated, so that a drift of the machine falls on both alike
            if stop is not None and stop.is_set():
                return None
            with pinned(lanes.target_cpus, lanes.target_threads, kernel):
                lane.append(step_ms(runner))
            with pinned(every, len(every), kernel):  # the whole-machine baseline's step (AR on every core)
                whole_machine.append(step_ms(runner))
        whole = WholeMachine(len(lanes.target_cpus), min(lane), len(every), min(whole_machine),
                             tuple(round(a / b, 3) for a, b in zip(whole_machine, lane)),
                             spread=round(max(max(lane) / min(lane), max(whole_machine) / min(whole_machine)), 3),
                             retimed=tries)
        if whole.bounded:
            break
    with pinned(every, len(every), kernel):  # every core's read bandwidth: the whole-machine roofline
        return replace(whole, read_gbs=lane_read_gbs(runner))


def roofline_of(runner, cal: Calibration | None, whole: WholeMachine | None = None) -> Roofline | None:
    """The target's Roofline from its calibration, with the whole machine's step and read bandwidth where they were
    timed (None where the forward by rows was not timed: the generic runner, a forced dtype on a device without
    timings)."""
    rows = () if cal is None else cal.rows_ms(cal.sequence)
    stream = runner.weight_stream
    if not rows or stream is None:
        return None
    machine = {} if whole is None or not whole.read_gbs or not whole.bounded else dict(
        machine_cores=whole.all_cores, machine_read_gbs=whole.read_gbs, machine_step_ms=whole.all_ms)
    return Roofline(runner.kernel.name, runner.kernel.reason, stream.storage, stream.nbytes, cal.read_gbs, rows,
                    stream.params, cal.peak_gflops, **machine)
