"""A free TCP port for a server a test or script starts (no torch, no engine: scripts/dockerfile_check.py uses it)."""
from __future__ import annotations

import socket


def free_port(preferred: int = 0, host: str = "127.0.0.1") -> int:
    """`preferred` when it is free on `host`, else a port the OS picks (preferred 0: always the OS's pick)."""
    for port in dict.fromkeys((preferred, 0)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return s.getsockname()[1]
            except OSError:
                continue
    raise RuntimeError("no free port")
