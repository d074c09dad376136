"""What machine a figure was measured on (printed beside every speed figure: the CPU differs between sessions)."""
from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU model and its wide-vector/bf16 flags, from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line for line in info.splitlines() if line.startswith("flags")).split()
        wide = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"{model} ({', '.join(wide)})"
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()

