"""Where the lanes run: the lane plan for this machine (with the reasons for it), and pinning a lane to its cores.

The plan, for the devices not given explicitly:
- two or more accelerators of one family → target on the first, draft on the second (the draft in a process);
- one accelerator (CUDA, XPU, NPU, or Apple's MPS) → target on it, draft on the CPU cores in a process;
  `kind="thread"` with the draft on the same device instead runs it on a stream of its own;
- CPU only → the cores split in half between the target lane and a draft process (one core: inline).
Cores are pinned where the OS can (Linux); elsewhere each lane only gets its thread count.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .. import machine
from ..config import LaneConfig, MirrorError
from ..machine import can_pin, set_affinity, usable_cpus


@dataclass(frozen=True)
class LanePlan:
    lanes: LaneConfig
    reasons: tuple[str, ...]   # one line per decision, in the order they were taken


def plan_lanes(target_device: str | None = None, draft_device: str | None = None, kind: str | None = None,
               runner: str = "auto", dtype: str = "auto") -> LanePlan:
    """The lane mapping for this machine, for the devices given (None = choose), and why."""
    reasons: list[str] = []
    target_device, draft_device, spread = _place_models(target_device, draft_device, kind, reasons)
    cpus = usable_cpus()
    both_cpu = target_device == draft_device == "cpu"
    if kind is None:
        kind = "thread" if target_device == draft_device != "cpu" else (
            "inline" if both_cpu and len(cpus) < 2 else "process")
        reasons.append(f"draft lane: {kind} (" + {
            "thread": "one device: a thread with its own stream",
            "inline": "one core: the draft runs between the target's steps, no overlap",
            "process": "its own process: real overlap, no GIL"}[kind] + ")")
    target_cpus, draft_cpus = _split_cores(target_device, draft_device, kind, cpus, reasons)
    lanes = LaneConfig(target_device, draft_device, kind, target_cpus, draft_cpus,
                       target_threads=len(target_cpus) if target_device == "cpu" else 0,
                       draft_threads=len(draft_cpus) if draft_device == "cpu" else 0, runner=runner,
                       target_devices=spread, dtype=dtype)
    return LanePlan(lanes, tuple(reasons))


def _place_models(target_device: str | None, draft_device: str | None, kind: str | None,
                  reasons: list[str]) -> tuple[str, str, tuple[str, ...]]:
    """(target device, draft device, the devices a spread target uses) for the devices given, with the reasons."""
    accels = [d for d in machine.available() if d != "cpu"]
    families = {}
    for d in accels:
        families.setdefault(d.split(":")[0], []).append(d)
    family = max(families.values(), key=len) if families else []  # the family with the most devices
    spread: tuple[str, ...] = ()
    if target_device is not None and ("," in target_device or target_device == "auto"):
        spread = target_spread(target_device, family)
        target_device = spread[0]
        reasons.append(f"target spread over {', '.join(spread)} (an accelerate device map; the generic runner)")
        family = [d for d in family if d not in spread]  # the draft's accelerator, if one is left
    if target_device is None:
        target_device = family[0] if family else "cpu"
        reasons.append(f"target on {target_device}: " + (f"the first of {len(family)} {target_device.split(':')[0]} "
                       "device(s)" if family else "no accelerator found"))
    else:
        reasons.append(f"target on {target_device}: as asked")
    target_device = machine.canonical(target_device)
    if draft_device is None:
        if spread and family:
            draft_device = family[0]
            reasons.append(f"draft on {draft_device}: an accelerator the target does not use")
        elif len(family) >= 2 and target_device in family:
            draft_device = next(d for d in family if d != target_device)
            reasons.append(f"draft on {draft_device}: a second accelerator, one lane per device")
        elif kind == "thread" and target_device != "cpu":
            draft_device = target_device
            reasons.append(f"draft on {draft_device} too, on a stream of its own (thread lane asked for)")
        else:
            draft_device = "cpu"
            reasons.append("draft on the CPU: " + ("no second accelerator, so the accelerator runs the target and "
                           "the CPU cores the draft" if target_device != "cpu" else "CPU-only machine"))
    else:
        reasons.append(f"draft on {draft_device}: as asked")
    return target_device, machine.canonical(draft_device), spread


def _split_cores(target_device: str, draft_device: str, kind: str, cpus: tuple[int, ...],
                 reasons: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the target lane's cores, the draft lane's): halves on a CPU-only machine with a draft process, one core to
    launch an accelerator's kernels, none where nothing is to be split."""
    target_cpus: tuple[int, ...] = ()
    draft_cpus: tuple[int, ...] = ()
    if target_device == draft_device == "cpu" and len(cpus) >= 2 and kind == "process":
        half = len(cpus) // 2
        target_cpus, draft_cpus = cpus[:half], cpus[half:]
        reasons.append(f"cores split: target {len(target_cpus)}, draft {len(draft_cpus)}")
    elif draft_device == "cpu" != target_device and len(cpus) >= 2:
        target_cpus, draft_cpus = cpus[:1], cpus[1:]
        reasons.append(f"one core launches the target's kernels, {len(draft_cpus)} run the draft")
    elif target_device == "cpu" != draft_device and len(cpus) >= 2:
        target_cpus, draft_cpus = cpus[1:], cpus[:1]
        reasons.append(f"one core launches the draft's kernels, {len(target_cpus)} run the target")
    if (target_cpus or draft_cpus) and not can_pin():
        reasons.append("this OS cannot pin threads to cores: each lane gets its thread count only")
    return target_cpus, draft_cpus


def target_spread(spec: str, accelerators: list[str]) -> tuple[str, ...]:
    """'auto' (every accelerator of the machine's main family) or a comma list such as 'cuda:0,cuda:1'."""
    if spec == "auto":
        if len(accelerators) < 2:
            raise MirrorError("--target-device auto spreads the target over two or more accelerators; this machine "
                              f"has {len(accelerators)}: {', '.join(machine.available())}")
        return tuple(accelerators)
    spread = tuple(machine.canonical(d.strip()) for d in spec.split(",") if d.strip())
    if len(spread) < 2:
        raise MirrorError(f"a target device list needs two or more devices, got {spec!r}")
    return spread


def auto_lanes(target_device: str | None = None, draft_device: str | None = None, kind: str | None = None,
               runner: str = "auto", dtype: str = "auto") -> LaneConfig:
    """plan_lanes without the reasons."""
    return plan_lanes(target_device, draft_device, kind, runner, dtype).lanes


def prefill_cpus(lanes: LaneConfig, features: bool, kernel: bool) -> tuple[int, ...]:
    """Where a request's target prefill runs, one kernel thread a core: every core of both CPU lanes where the draft
    is a process that reads the target's features (it prefills only once the prompt's features come, so its cores
    sit idle through the target's prefill) and the target computes on the exact kernel (whose bits do not depend on
    its threads); () elsewhere: the target lane's own cores."""
    if not (features and kernel and lanes.kind == "process" and lanes.target_device == lanes.draft_device == "cpu"
            and lanes.draft_cpus):
        return ()
    return tuple(sorted(set(lanes.target_cpus) | set(lanes.draft_cpus)))


@contextlib.contextmanager
def pinned(cpus: tuple[int, ...], threads: int, kernel: bool = False):
    """Pin the calling thread to `cpus` (where the OS can) and give it `threads` threads for the duration: torch's
    intra-op threads, or with `kernel` (its runner computes on the exact kernel, kernels/native.py) the kernel's pool,
    which inherits this pinning, and one torch thread: torch's small ops around the kernel would otherwise start
    OpenMP workers that keep spinning on the cores the kernel's threads need."""
    from ..runners import kernel_threads, set_kernel_threads

    old_threads, old_cpus, old_kernel = torch.get_num_threads(), usable_cpus(), kernel_threads()
    set_affinity(cpus)
    if threads:
        torch.set_num_threads(1 if kernel else threads)
        set_kernel_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        set_kernel_threads(old_kernel)
        if cpus:
            set_affinity(old_cpus)
