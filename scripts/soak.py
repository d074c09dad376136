"""Soak: seeded draft faults, the bad-input catalogue on every surface, concurrent clients, browser-like
disconnects and back-to-back runs, on tiny models built from configs (no downloads); one summary line.

    PYTHONPATH=. python scripts/soak.py            # short (the sizes CI runs), a few minutes on 2 cores
    PYTHONPATH=. python scripts/soak.py --long     # 200 faults, 200 back-to-back runs, 3 rounds of 8 clients

Exit status 0 only when everything held (and RSS grew less than 10 %). Details of any failure go to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

SIZES = {  # short: what CI's tests run; long: the full-size soak
    False: dict(faults=54, process_faults=3, clients=8, client_rounds=1, disconnects=1, runs=40, warmup=10),
    True: dict(faults=200, process_faults=10, clients=8, client_rounds=3, disconnects=5, runs=200, warmup=20),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--long", action="store_true", help="the full-size soak (200 faults, 200 runs)")
    args = p.parse_args(argv)
    size = SIZES[args.long]

    import testing.reliability as r
    from ui import EngineLoader

    t0 = time.monotonic()
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as root:
        m = r.build_models(root)
        pair = (m.target, m.draft)
        trials = draft_faults(pair, size, problems)                       # 1. draft faults, each checked against ar
        handled, tried = bad_inputs_on_cli_and_api(m, root, problems)       # 2. the bad-input catalogue
        app = on_the_app(m, root, pair, size, problems)                     # 2. on the app; 3. clients; 4. disconnects
        loader = EngineLoader(r.INLINE)                                     # 5. back-to-back runs, the app's handler
        try:
            soak = r.back_to_back(loader, *pair, runs=size["runs"], warmup=size["warmup"])
        finally:
            loader.close()
        problems += soak.errors
    print(f"soak ({'long' if args.long else 'short'}, {time.monotonic() - t0:.0f} s): "
          f"faults survived {sum(t.ok for t in trials)}/{len(trials)} ({sum(t.mode == 'exit' for t in trials)} "
          f"process kills), bad inputs handled {handled + app['handled']}/{tried + app['tried']}, clients ok "
          f"{app['clients_ok']}/{app['clients_tried']} (max queue position {app['max_rank'] + 1}), disconnects freed "
          f"{app['freed_ok']}/{size['disconnects']}, RSS growth {soak.rss_growth:+.2%} over {soak.runs} runs after "
          f"{size['warmup']} warm-up (threads {soak.threads_left:+d}, processes {soak.children_left:+d})")
    for line in problems:
        print(line, file=sys.stderr)
    held = not problems and soak.rss_growth < 0.10 and soak.threads_left <= 0 and soak.children_left <= 0
    return 0 if held else 1


def draft_faults(pair: tuple[str, str], size: dict, problems: list[str]) -> list:
    """Seeded draft faults on inline and thread lanes, then alternately a killed draft process and a raise."""
    import testing.reliability as r
    from mirror_core import LaneConfig

    lanes = {"inline": r.INLINE, "thread": LaneConfig(kind="thread", target_threads=1, draft_threads=1),
             "process": LaneConfig(kind="process", target_threads=1, draft_threads=1)}
    with r.FaultEngines(*pair, lanes) as engines:
        trials = [r.fault_trial(engines, s, ("inline", "thread")) for s in range(size["faults"])]
        seeds = iter(range(10_000, 20_000))
        for i in range(size["process_faults"]):  # alternately a killed process and a raise, seeded
            mode = "exit" if i % 2 == 0 else "raise"
            seed = next(s for s in seeds if r.process_fault_mode(s) == mode)
            trials.append(r.fault_trial(engines, seed, ("process",)))
    problems += [f"fault seed {t.seed} ({t.kind}/{t.mode}/{t.decoder}@{t.step}): {t.detail}" for t in trials if not t.ok]
    return trials


def bad_inputs_on_cli_and_api(m, root: str, problems: list[str]) -> tuple[int, int]:
    """The bad-input catalogue's CLI and API cases: (handled, tried)."""
    import testing.reliability as r
    from mirror_core import MirrorEngine

    handled = tried = 0
    with MirrorEngine.load(m.tok_target, m.tok_draft, r.INLINE) as engine:
        for case in r.CATALOGUE:
            checks = []
            if case.cli is not None:
                checks.append(("cli", r.cli_case(case, m, os.path.join(root, "trace.json"))))
            if case.api is not None:
                checks.append(("api", r.expect_mirror_error(lambda: case.api(m, engine), case.needle)))
            for surface, err in checks:
                tried += 1
                handled += err is None
                problems += [f"{surface} {case.row}: {err}"] if err else []
    return handled, tried


def on_the_app(m, root: str, pair: tuple[str, str], size: dict, problems: list[str]) -> dict:
    """The catalogue's app cases, concurrent clients and browser-like disconnects on one launched app."""
    import testing.reliability as r
    from testing.net import free_port
    from ui import LAUNCH, EngineLoader, build_demo, default_presets
    from ui.views import by_name

    watch = r.WatchedLoad()
    loader = EngineLoader(r.INLINE, load=watch)
    demo = build_demo(loader, default_presets(os.path.join(root, "none"), m.tok_target, m.tok_draft), [])
    demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    out = dict(handled=0, tried=0, clients_ok=0, clients_tried=0, max_rank=0, freed_ok=0)
    try:
        for case in (c for c in r.CATALOGUE if c.app is not None):
            status = by_name(r.app_run(demo.local_url, r.app_values(m, **case.app(m)), raw=case.app_raw))["status"]
            ok = status.startswith("**Error:**") and case.needle in status
            out["tried"], out["handled"] = out["tried"] + 1, out["handled"] + ok
            problems += [] if ok else [f"app {case.row}: {status!r}"]
        serving = by_name(r.app_run(demo.local_url, r.app_values(m)))["status"]
        problems += [] if "Done" in serving else [f"app stopped serving after the bad inputs: {serving!r}"]
        for round_ in range(size["client_rounds"]):
            res = r.concurrent_clients(demo.local_url, *pair, size["clients"], seed=round_)
            out["clients_ok"], out["clients_tried"] = out["clients_ok"] + res.ok, out["clients_tried"] + res.tried
            out["max_rank"] = max(out["max_rank"], res.max_rank)
            problems += res.errors
        for _ in range(size["disconnects"]):
            values = r.page_values(prompt="1, 2, 3", target=pair[0], draft=pair[1], decoders=["sd", "mirror"],
                                   gamma=1, kappa=1, max_new_tokens=480, branch_budget=0)
            cut = r.disconnect_trial(demo.local_url, watch, r.run_args(values))
            out["freed_ok"] += cut.ok
            problems += [] if cut.ok else [f"disconnect: {cut.detail}"]
    finally:
        r.close_demo(demo)
        loader.close()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
