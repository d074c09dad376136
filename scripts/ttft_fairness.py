"""Is TTFT fair between decoders on the page? AR's and Mirror-SD's TTFT by whether they ran first or second.

    PYTHONPATH=. python scripts/ttft_fairness.py [--repeats 8] [--tokens 32]

Runs the page's own comparison generator (ui.streaming.run_comparison, the embedded pair on the app's lanes)
with AR + Mirror-SD and `--repeats` repeats (so each decoder runs first in half of them), twice: as shipped
(each timed run preceded by the same request for one token, untimed) and with that warm-up removed. TTFT is
the engine's (RunSummary.ttft_s: run start → first committed token, i.e. the prefill).
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
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args(argv)

    from mirror_core import MirrorEngine, auto_lanes
    from mirror_core.machine import cpu_model
    from testing.reliability import page_values
    from ui import streaming
    from ui.loader import EngineLoader
    from ui.session import Session
    from ui.settings import MAX_REPEATS, load_examples, settings_from_ui

    pair = os.path.join(ROOT, "assets", "default_pair")
    prompt = load_examples(os.path.join(ROOT, "assets", "examples.json"))[0]
    loader = EngineLoader(auto_lanes())
    shipped = MirrorEngine.warm_prefill
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.repeats} repeats of AR + Mirror-SD, "
          f"{args.tokens} new tokens")
    try:
        for label, warm in (("with the one-token warm-up (shipped)", shipped),
                            ("without it", lambda engine, request, stop=None: None)):
            MirrorEngine.warm_prefill = warm
            ttft: dict[tuple[str, int], list[float]] = {}
            done = 0
            while done < args.repeats:
                n = min(MAX_REPEATS - MAX_REPEATS % 2, args.repeats - done)  # an even count: both orders equally
                session = Session()
                settings = settings_from_ui(page_values(
                    prompt=prompt, target=os.path.join(pair, "target"), draft=os.path.join(pair, "draft_ar"),
                    decoders=["ar", "mirror"], max_new_tokens=args.tokens, repeats=n))
                for _ in streaming.run_comparison(loader, session, settings):
                    pass
                for i, run in enumerate(session.history):
                    ttft.setdefault((run.decoder, i % 2), []).append(run.summary.ttft_s * 1e3)
                done += n
            print(f"{label}: median TTFT (ms) [min-max]")
            for (decoder, position), values in sorted(ttft.items()):
                print(f"  {decoder:>6} {'first' if position == 0 else 'second'}: {statistics.median(values):6.2f} "
                      f"[{min(values):.2f}-{max(values):.2f}] over {len(values)}")
    finally:
        MirrorEngine.warm_prefill = shipped
        loader.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
