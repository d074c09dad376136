"""This machine: what is printed beside every speed figure and keys the dtype calibration, and what the lanes run on.

- The CPU: its model and kernel flags (one checkout runs on many CPU kinds), its cores, and pinning, portably (core
  pinning exists on Linux only: elsewhere the lanes set thread counts and nothing else); the user's cache folder.
- Its devices, one layer for every backend: which devices exist, how a device is named, and the two things the
  lanes need anywhere (synchronise one stream; run a lane on a stream of its own). Accelerators: CUDA
  (`cuda:N`), Apple's Metal (`mps`, one device), Intel XPU (`xpu:N`) and Ascend NPU (`npu:N`, present once the
  `torch_npu` package is imported). torch builds for one accelerator family at a time and `torch.accelerator`
  speaks for that family; the backend modules (`torch.cuda`, `torch.mps`, `torch.xpu`, `torch.npu`) are asked
  directly so that a machine's devices are listed however torch was built.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass

import torch

from .config import DEVICE_NAME, MirrorError

# the CPU flags that decide which matmul kernels are fast (and so which dtype a lane calibrates to)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_int8", "amx_tile")


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = frozenset(next(line for line in lines if line.startswith("flags")).split(":", 1)[1].split())
        return model, flags
    except (OSError, StopIteration, IndexError):
        return None


def cpu_flags() -> tuple[str, ...]:
    """The KERNEL_FLAGS this CPU has (Linux's /proc/cpuinfo; empty where it cannot be read)."""
    info = _cpuinfo()
    return tuple(f for f in KERNEL_FLAGS if info and f in info[1])


def has_cpu_flags(*flags: str) -> bool:
    """Whether /proc/cpuinfo lists every one of these flags (False where it cannot be read)."""
    info = _cpuinfo()
    return info is not None and all(f in info[1] for f in flags)


def cxx_compiler() -> str | None:
    """The C++ compiler the kernels are built with: $CXX where it names one on PATH, else g++, c++ or clang++."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cpu_model() -> str:
    """The CPU model and its wide-vector/bf16 flags, from /proc/cpuinfo (Linux), else what platform knows."""
    info = _cpuinfo()
    if info is None:
        return platform.processor() or platform.machine()
    return f"{info[0]} ({', '.join(cpu_flags())})"


def cache_dir(*parts: str) -> str:
    """A folder under the user's cache ($MIRROR_SD_CACHE, else $XDG_CACHE_HOME/mirror_sd, else ~/.cache/mirror_sd)."""
    root = os.environ.get("MIRROR_SD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mirror_sd")
    path = os.path.join(root, *parts)
    os.makedirs(path, exist_ok=True)
    return path


# -- cores: affinity where the OS has it (Linux), thread counts everywhere --------------------------------
def usable_cpus() -> tuple[int, ...]:
    """The cores this process may run on: its affinity mask where the OS has one (Linux), else every core."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def can_pin() -> bool:
    """Whether threads can be pinned to cores here (Linux); macOS and Windows set thread counts only."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def set_affinity(cpus: tuple[int, ...]) -> None:
    """Pin the calling thread to `cpus` where the OS can; a no-op elsewhere."""
    if cpus and can_pin():
        os.sched_setaffinity(0, cpus)


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds at one moment: every core's busy time, and this process's with its children's (a draft lane's)."""

    machine_s: float   # user, nice, system, irq, softirq and steal time of every core (psutil; Linux's /proc/stat)
    own_s: float       # this process's user + system time, and its live children's
    at: float          # time.monotonic() when read


def cpu_times() -> CpuTimes:
    """The machine's and this process tree's CPU seconds now: two readings give the noise meter (others_cores)."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
    me = psutil.Process()
    c = me.cpu_times()
    own = c.user + c.system + c.children_user + c.children_system  # children that ended and were waited for
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child that ended meanwhile
            c = child.cpu_times()
            own += c.user + c.system
    return CpuTimes(busy, own, time.monotonic())


def others_cores(before: CpuTimes, after: CpuTimes) -> float:
    """Cores' worth of CPU time other processes used between two readings (the machine's busy time less this process
    tree's, over the time between): 0.85 = 85 % of one core; never below 0 (the counters tick in 10 ms steps)."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        return 0.0
    return max(0.0, ((after.machine_s - before.machine_s) - (after.own_s - before.own_s)) / elapsed)


def yield_cpu() -> None:
    """Give the core away for a moment while spinning (sched_yield where it exists; Windows: sleep(0))."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:
        time.sleep(0)


# -- devices -------------------------------------------------------------------------------------------------
ACCELERATORS = ("cuda", "mps", "xpu", "npu")
_NAME = re.compile(DEVICE_NAME)


def _backend(kind: str):
    """torch's module for an accelerator family, or None where this torch has none (npu: without torch_npu)."""
    return getattr(torch, kind, None)


def device_count(kind: str) -> int:
    """How many devices of this family the machine has (0 where the backend is absent or unusable)."""
    backend = _backend(kind)
    try:
        if kind == "mps":
            return 1 if backend is not None and torch.backends.mps.is_available() else 0
        return int(backend.device_count()) if backend is not None and backend.is_available() else 0
    except Exception:  # a backend that cannot even count (no driver) has no devices
        return 0


def available() -> list[str]:
    """Every device name this machine accepts: 'cpu' first, then each accelerator."""
    out = ["cpu"]
    for kind in ACCELERATORS:
        n = device_count(kind)
        out += ["mps"] if kind == "mps" and n else [f"{kind}:{i}" for i in range(n)]
    return out


def canonical(name: str) -> str:
    """'cuda' → 'cuda:0' (likewise xpu, npu); other well-formed names unchanged; MirrorError for a malformed one."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise MirrorError(f"device must be cpu, cuda[:N], mps, xpu[:N] or npu[:N], got {name!r}")
    return f"{name}:0" if name in ("cuda", "xpu", "npu") else name


def check(name: str) -> torch.device:
    """The torch.device for a name this machine has, or a MirrorError that lists what it has."""
    name = canonical(name)
    if name != "cpu" and name not in available():
        hint = " (Ascend NPUs need the torch_npu package)" if name.startswith("npu") else ""
        raise MirrorError(f"device {name!r} is not available on this machine{hint}; it has: {', '.join(available())}")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on the calling thread's current stream of `device` (never another lane's stream);
    nothing to do on the CPU."""
    if device.type == "cpu":
        return
    backend = _backend(device.type)
    if device.type != "mps" and hasattr(backend, "current_stream"):
        backend.current_stream(device).synchronize()
    else:  # MPS has one queue per process
        backend.synchronize()


def own_stream(device: torch.device):
    """A context in which the calling thread's work on `device` goes to a stream of its own (a thread lane sharing
    the target's device); the CPU and MPS (one queue) have none."""
    backend = _backend(device.type)
    if device.type in ("cpu", "mps") or not hasattr(backend, "Stream"):
        return contextlib.nullcontext()
    return backend.stream(backend.Stream(device))


def describe(device: str) -> str:
    """A device's human name for the plan and the page's header."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return cpu_model()
    if dev.type == "mps":
        return "Apple GPU (Metal)"
    backend = _backend(dev.type)
    try:
        return str(backend.get_device_name(dev))
    except Exception:
        return device
