"""One device layer: which devices this machine has, how a device is named, and the two things the lanes need
on any backend (synchronise one stream; run a lane on a stream of its own).

Accelerators: CUDA (`cuda:N`), Apple's Metal (`mps`, one device), Intel XPU (`xpu:N`) and Ascend NPU (`npu:N`,
present once the `torch_npu` package is imported). torch builds for one accelerator family at a time and
`torch.accelerator` speaks for that family; the backend modules (`torch.cuda`, `torch.mps`, `torch.xpu`,
`torch.npu`) are asked directly so that a machine's devices are listed however torch was built. Nothing here
is Linux-only; the CPU side (cores, pinning) is mirror_core/machine.py.
"""
from __future__ import annotations

import contextlib
import re

import torch

from .config import DEVICE_NAME, MirrorError
from .machine import cpu_model

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
