"""Idle CPU of `python app.py`: the app process and its draft-lane process, after one comparison has run.

    PYTHONPATH=. python scripts/idle_cpu.py [--seconds 10] [--port 7911]

Starts the app on the embedded pair, runs one AR + Mirror-SD comparison through the /run endpoint,
waits 3 s (past the lanes' spinning phase), then reports the CPU each process used over the next
`--seconds` (user + system time / wall time, from psutil; it ticks in 10 ms).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="idle window to measure")
    p.add_argument("--port", type=int, default=7911)
    args = p.parse_args(argv)

    from gradio_client import Client

    from testing.reliability import page_values, run_args
    from ui.views import by_name

    app = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port)], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in app.stdout:
            if line.startswith(("loaded", "note:")):
                break
        client = Client(f"http://127.0.0.1:{args.port}/", verbose=False)
        pair = os.path.join(ROOT, "assets", "default_pair")
        values = page_values(prompt="def add(a, b):", target=os.path.join(pair, "target"),
                             draft=os.path.join(pair, "draft_ar"), decoders=["ar", "mirror"], max_new_tokens=32)
        status = by_name(client.predict(*run_args(values), api_name="/run"))["status"]
        print(f"comparison: {status}")
        time.sleep(3.0)
        tree = [psutil.Process(app.pid), *psutil.Process(app.pid).children(recursive=True)]
        before = {q.pid: sum(q.cpu_times()[:2]) for q in tree}
        t0 = time.perf_counter()
        time.sleep(args.seconds)
        wall = time.perf_counter() - t0
        used = {q.pid: sum(q.cpu_times()[:2]) - before[q.pid] for q in tree}
    finally:
        app.terminate()
        app.wait(timeout=30)
    print(f"CPU: {platform.processor() or platform.machine()}; idle window {wall:.1f} s")
    for q in tree:
        print(f"  pid {q.pid} ({'app' if q.pid == app.pid else 'child'}): {100 * used[q.pid] / wall:.2f} % of a core")
    print(f"whole app: {100 * sum(used.values()) / wall:.2f} % of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
