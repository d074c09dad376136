"""Does watching a run change it? Mirror-SD's speedup over AR with the page open in Chromium vs with no page.

    PYTHONPATH=. python scripts/page_cost.py [--pairs 3] [--tokens 300] [--port 7912]

Starts `python app.py` on the embedded toy pair (`--target/--draft`, the app's own lanes), then alternates, `--pairs` times: one
AR + Mirror-SD comparison through gradio_client with no page open ("closed"), and the same comparison
pressed in headless Chromium on this machine, live plots on ("open"). Each speedup is the engine's own
(AR wall time / Mirror-SD wall time, from the page's numbers table); nothing is timed by the page.
Needs Debian `chromium`.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SPEEDUP = re.compile(r'<span class="mirror-(?:fast|slow)">([0-9.]+)×')
TTFT = re.compile(r"<tr><th>TTFT</th><td>([0-9.]+) ms</td><td>([0-9.]+) ms</td>")  # AR, then Mirror-SD


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="closed/open comparisons, alternated")
    p.add_argument("--tokens", type=int, default=300, help="max new tokens per decoder")
    p.add_argument("--port", type=int, default=7912)
    args = p.parse_args(argv)

    from mirror_core.machine import cpu_model
    from testing.browser import CHROMIUM

    if CHROMIUM is None:
        print("needs chromium (apt-get install -y chromium)")
        return 2
    pair = os.path.join(ROOT, "assets", "default_pair")  # the embedded toy pair: the page's first preset, as typed below
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port), "--target", os.path.join(pair, "target"),
                            "--draft", os.path.join(pair, "draft_ar")], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in app.stdout:
            if line.startswith(("loaded", "note:")):
                break
        speedups, ttft = alternate(f"http://127.0.0.1:{args.port}/", pair, args)
    finally:
        app.terminate()
        app.wait(timeout=30)
    closed, opened = speedups["closed"], speedups["open"]
    c, o = statistics.median(closed), statistics.median(opened)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    print(f"Mirror-SD / AR, {args.tokens} tokens, median of {args.pairs}: page closed {c:.2f}x "
          f"[{min(closed):.2f}-{max(closed):.2f}], page open {o:.2f}x [{min(opened):.2f}-{max(opened):.2f}]; "
          f"open / closed = {o / c:.3f}")
    for where, pairs in ttft.items():
        print(f"TTFT with the page {where}, median: AR {statistics.median(a for a, _ in pairs):.1f} ms, "
              f"Mirror-SD {statistics.median(m for _, m in pairs):.1f} ms (AR runs first)")
    return 0


def alternate(url: str, pair: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list]]:
    """`--pairs` rounds of one comparison through gradio_client (page closed) and one pressed in Chromium (page
    open): the speedups and the (AR, Mirror-SD) TTFTs of each, as the page's numbers table shows them."""
    from gradio_client import Client

    from testing.browser import CHROMIUM, Chromium, measured_run, open_page, set_control
    from testing.reliability import page_values, run_args
    from ui.settings import load_examples
    from ui.views import by_name

    prompt = load_examples(os.path.join(ROOT, "assets", "examples.json"))[0]  # the page's default prompt
    values = page_values(prompt=prompt, target=os.path.join(pair, "target"), draft=os.path.join(pair, "draft_ar"),
                         decoders=["ar", "mirror"], max_new_tokens=args.tokens)
    client = Client(url, verbose=False)
    by_name(client.predict(*run_args({**values, "max_new_tokens": 8}), api_name="/run"))  # load the pair once
    speedups: dict[str, list[float]] = {"closed": [], "open": []}
    ttft: dict[str, list[tuple[float, ...]]] = {"closed": [], "open": []}
    browser = Chromium(CHROMIUM, tempfile.mkdtemp(prefix="mirror-chromium-"))
    try:
        open_page(browser, url)
        set_control(browser, "mirror-max-new-tokens", args.tokens)
        for i in range(args.pairs):
            final = by_name(client.predict(*run_args(values), api_name="/run"))
            run = measured_run(browser)
            html = browser.evaluate('document.getElementById("mirror-numbers").innerHTML')
            for where, numbers in (("closed", final["numbers"]), ("open", html)):
                speedups[where].append(float(SPEEDUP.search(numbers).group(1)))
                ttft[where].append(tuple(float(x) for x in TTFT.search(numbers).groups()))
            print(f"pair {i + 1}: closed {speedups['closed'][-1]:.2f}x, open {speedups['open'][-1]:.2f}x "
                  f"(page: longest task {run['longest_task_ms']:.0f} ms, {run['bytes'] / 1e3:.0f} kB received, "
                  f"chromium used {run['browser_cpu']:.2f} of a core while the runs ran)", flush=True)
    finally:
        browser.close()
    return speedups, ttft


if __name__ == "__main__":
    raise SystemExit(main())
