"""How soon a cancelled or vanished client stops its run: steps and milliseconds on the default pair, via the app.

    PYTHONPATH=. python scripts/cancel_bound.py [--trials 5] [--step 8] [--tokens 400]

Serves the page in this process on the default pair (SmolLM2-135M-Instruct and its feature-reading draft, the app's
own lanes) and runs each trial through the /run endpoint: a Mirror-SD run of --tokens tokens is held at the start
of its step --step (testing/reliability.py, WatchedLoad.hold), then cut, first by gradio_client's cancel (POST
/cancel, what the page's Stop sends through `cancels=`), then by killing a browser-like client process (a closed
tab: Gradio's heartbeat drops and the page's unload handler runs). Prints, per way and trial, the milliseconds from
the cancel to the run's stop flag and to both lanes idle (the held step is run to its end first: a whole step, the
worst case), the steps each lane worked on after the cancel, and the pair's median Mirror-SD step (StepRecord
times). Needs the prepared target (`python -m mirror_core prepare`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5, help="trials of each way to cancel")
    p.add_argument("--step", type=int, default=8, help="the step the run is held at when the cancel is sent")
    p.add_argument("--tokens", type=int, default=400, help="max new tokens of the run (it never gets there)")
    args = p.parse_args(argv)

    import testing.reliability as r
    from mirror_core import StepRecord, auto_lanes
    from mirror_core.models.pairs import default_pair
    from testing.net import free_port
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    pair = default_pair()
    if pair.note:
        print(f"the default pair is not here: {pair.note}")
        return 2
    watch = r.WatchedLoad()
    loader = EngineLoader(auto_lanes(), load=watch)
    demo = build_demo(loader, default_presets(os.path.join(ROOT, "assets", "default_pair"), real=(pair.target,
                                                                                                  pair.draft)), [])
    demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    cuts: dict[str, list] = {"cancel": [], "disconnect": []}
    step_s: list[float] = []
    try:
        loader.get(pair.target, pair.draft)
        values = r.run_args(r.page_values(prompt="Write a long story about a lighthouse keeper.", target=pair.target,
                                          draft=pair.draft, decoders=["mirror"], max_new_tokens=args.tokens))
        for _ in range(args.trials):
            for way, trial in (("cancel", r.cancel_trial), ("disconnect", r.disconnect_trial)):
                cut = trial(demo.local_url, watch, values, decoder="mirror", step=args.step)
                print(f"{way:10s} {cut.detail}", flush=True)
                cuts[way].append(cut)
                ends = [e.t_end for e in watch.last_hold.events if isinstance(e, StepRecord)]
                step_s += [b - a for a, b in zip(ends, ends[1:])]
    finally:
        r.close_demo(demo)
        loader.close()
    print(f"median Mirror-SD step: {statistics.median(step_s) * 1e3:.0f} ms ({len(step_s)} steps)")
    for way, done in cuts.items():
        if not all(c.ok for c in done):
            print(f"{way}: {sum(not c.ok for c in done)} of {len(done)} trials were not cut within one step")
            continue
        flag, freed = [c.flag_ms for c in done], [c.freed_ms for c in done]
        most = {lane: max(c.steps[lane] for c in done) for lane in done[0].steps}
        print(f"{way}: stop flag set {statistics.median(flag):.0f} ms after it (max {max(flag):.0f}), lanes free "
              f"{statistics.median(freed):.0f} ms (max {max(freed):.0f}); steps after it at most {most}")
    return 0 if all(c.ok for done in cuts.values() for c in done) else 1


if __name__ == "__main__":
    raise SystemExit(main())
