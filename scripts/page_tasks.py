"""The page's main-thread work while a comparison streams: the longest tasks, the tasks over 50 ms, the visible updates.

    PYTHONPATH=. python scripts/page_tasks.py [--tokens 900] [--throttle 2] [--repeats 3]

What tests/test_ui_browser.py's 900-token test measures, with a DevTools trace beside it: the embedded toy pair on
the app's own lanes in this process, headless Debian Chromium (1280x800) on this machine, AR and Mirror-SD (one
repeat), `--repeats` comparisons in one page. `--throttle N` slows the page's CPU N times (DevTools
Emulation.setCPUThrottlingRate): a stand-in for a slower or busier machine, where the lanes take the cores from the
page (the test's 100 ms bound failed at 107 and 196 ms on CI's 2 cores while passing here). Per comparison: the
longest main-thread task and the count over 50 ms (Long Tasks API), the visible updates per stream, the renderer
main thread's busy time (the trace's RunTask events) and its six longest tasks. Needs Debian `chromium`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=900, help="max new tokens per decoder")
    p.add_argument("--throttle", type=float, default=1.0, help="slow the page's CPU this many times (1: not at all)")
    p.add_argument("--repeats", type=int, default=3, help="comparisons, one after another in one page")
    args = p.parse_args(argv)

    from mirror_core.machine import cpu_model
    from testing.browser import CHROMIUM, UNTICK_SD_JS, measured_run, set_control, toy_pair_page

    if CHROMIUM is None:
        print("needs chromium (apt-get install -y chromium)")
        return 2
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; the page's CPU throttled {args.throttle:g}x")
    with toy_pair_page() as (browser, _):
        set_control(browser, "mirror-repeats", 1)
        browser.evaluate(UNTICK_SD_JS)  # AR and Mirror-SD, as the test
        set_control(browser, "mirror-max-new-tokens", args.tokens)
        if args.throttle > 1:
            browser.send("Emulation.setCPUThrottlingRate", {"rate": args.throttle})
        for i in range(args.repeats):
            browser.send("Tracing.start", {"categories": "devtools.timeline,disabled-by-default-devtools.timeline",
                                           "transferMode": "ReportEvents"})
            first = len(browser.events)
            run = measured_run(browser)
            tasks = _main_thread_tasks(browser, first)
            print(f"comparison {i + 1}: longest task {run['longest_task_ms']:.0f} ms, {run['long_tasks']} over 50 ms, "
                  f"visible updates {json.dumps(run['updates'])}, renderer busy {sum(tasks):.0f} ms in {len(tasks)} "
                  f"tasks, longest {sorted(round(t) for t in tasks)[-6:]} ms", flush=True)
    return 0


def _main_thread_tasks(browser, first: int) -> list[float]:
    """Ends the trace; the durations (ms) of the renderer main thread's tasks (the thread that ran the page's JS)."""
    browser.send("Tracing.end")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(e.get("method") == "Tracing.tracingComplete"
                                                  for e in browser.events[first:]):
        browser.evaluate("1")  # reading the pipe collects the trace's events
        time.sleep(0.2)
    events = [x for e in browser.events[first:] if e.get("method") == "Tracing.dataCollected"
              for x in e["params"]["value"]]
    calls: dict[tuple, int] = {}
    for e in events:
        if e.get("name") == "FunctionCall":
            calls[(e["pid"], e["tid"])] = calls.get((e["pid"], e["tid"]), 0) + 1
    main = max(calls, key=calls.get)
    return [e.get("dur", 0) / 1e3 for e in events if e.get("name") == "RunTask" and (e["pid"], e["tid"]) == main]


if __name__ == "__main__":  # the draft lane is a spawned process: the main module must be importable
    sys.exit(main())
