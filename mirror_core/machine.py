"""What machine this is: printed beside every speed figure (the CPU differs between sessions) and part of the
key under which a lane's dtype calibration is cached; the user's cache folder; and the CPU cores, portably
(core pinning exists on Linux only: elsewhere the lanes set thread counts and nothing else)."""
from __future__ import annotations

import functools
import os
import platform
import time

# the CPU flags that decide which matmul kernels are fast (and so which dtype a lane calibrates to)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")


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


def yield_cpu() -> None:
    """Give the core away for a moment while spinning (sched_yield where it exists; Windows: sleep(0))."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:
        time.sleep(0)
