"""Where the lanes run: the automatic lane mapping for this machine, and pinning a lane to its cores."""
from __future__ import annotations

import contextlib
import os

import torch

from ..config import LaneConfig


def auto_lanes(target_device: str | None = None, draft_device: str | None = None, kind: str | None = None,
               runner: str = "auto", dtype: str = "auto") -> LaneConfig:
    """The lane mapping for this machine, for the devices given (None = choose).

    Two GPUs → one each (draft in a process); one GPU → both on it, the draft in a thread with its
    own CUDA stream; GPU + CPU → the draft in a process on all cores but one (that core launches
    the target's kernels); CPU only → the cores split in half, the draft in a pinned process.
    """
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    target_device = _canonical(target_device or ("cuda:0" if n_gpu else "cpu"))
    draft_device = _canonical(draft_device or ("cuda:1" if n_gpu >= 2 else "cuda:0" if n_gpu else "cpu"))
    cpus = sorted(os.sched_getaffinity(0))
    both_cpu = target_device == draft_device == "cpu"
    if kind is None:
        kind = "thread" if target_device == draft_device != "cpu" else (
            "inline" if both_cpu and len(cpus) < 2 else "process")
    target_cpus: tuple[int, ...] = ()
    draft_cpus: tuple[int, ...] = ()
    if both_cpu and len(cpus) >= 2 and kind == "process":
        half = len(cpus) // 2
        target_cpus, draft_cpus = tuple(cpus[:half]), tuple(cpus[half:])
    elif draft_device == "cpu" != target_device and len(cpus) >= 2:
        target_cpus, draft_cpus = (cpus[0],), tuple(cpus[1:])
    elif target_device == "cpu" != draft_device and len(cpus) >= 2:
        target_cpus, draft_cpus = tuple(cpus[1:]), (cpus[0],)
    return LaneConfig(target_device, draft_device, kind, target_cpus, draft_cpus,
                      target_threads=len(target_cpus) if target_device == "cpu" else 0,
                      draft_threads=len(draft_cpus) if draft_device == "cpu" else 0, runner=runner, dtype=dtype)


def _canonical(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


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
