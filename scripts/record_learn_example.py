"""Record the Learn tab's example (assets/learn_example/example.json): one real run of AR, vanilla SD and Mirror-SD on
the default pair, so the step player, the branch tree and the what-if open on something before a visitor's first run.

    python scripts/record_learn_example.py [--prompt TEXT] [--max-new 64] [--zero-windows off]
                                           [--out assets/learn_example/example.json]

Windows of zero are off by default here: the example teaches a Mirror-SD step's phases, so every step verifies a
window (raw speculation, as `--zero-windows off` decodes); the page's own runs use the engine's policy.

Kept from the engine's events: every span and step record of the three runs (times relative to each run's start),
their summaries' raw counters, the load-time timings the what-if starts from, the machine it ran on, and the text of
every token id the example shows (the page needs no tokenizer to show it). ui/learn/example.py reads it back.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

FORMAT = "mirror-sd-learn-example/1"


def _ids(steps: list, tokens: tuple) -> set[int]:
    found = set(tokens)
    for r in steps:
        found |= set(r.window) | {r.token} | set(r.target_tokens)
        found |= {t for row in r.topk_ids for t in row} | {t for row in r.branches for t in row}
    return {t for t in found if t >= 0}


def _load_figures(info) -> dict:
    """The load-time timings the what-if starts from (ms), as the pair's calibration measured them."""
    target, draft = info.target_dtype, info.draft_dtype
    out = {"t_ar_ms": target.ms(target.sequence, "step") if target else None,
           "verify_ratio": target.verify_ratio() if target else None,
           "draft_step_ms": draft.ms(draft.sequence, "step") if draft else None,
           "draft_rows_ms": draft.ms(draft.rows, "rows") if draft else None,
           "rows_ms": list(info.roofline.rows_ms) if info.roofline else []}
    if info.spec_choice is not None:
        out["chosen"] = {"gamma": info.spec_choice.gamma, "kappa": info.spec_choice.kappa,
                         "modelled_speedup": info.spec_choice.speedup, "why": info.spec_choice.why}
    return out


def _run(engine, request) -> dict:
    from mirror_core import RunEnd, RunStart, SpanEvent, StepRecord

    events = list(engine.stream(request))
    t0 = next(e.t0 for e in events if isinstance(e, RunStart))
    end = next(e for e in events if isinstance(e, RunEnd))
    spans = [e for e in events if isinstance(e, SpanEvent)]
    steps = [e for e in events if isinstance(e, StepRecord)]
    rel = lambda t: round(t - t0, 7)  # noqa: E731
    return {"spans": [[s.lane, s.stage, rel(s.t0), rel(s.t1), s.step] for s in spans],
            "steps": [asdict(r) | {"t_end": rel(r.t_end)} for r in steps],
            "summary": asdict(end.summary), "token_ids": list(end.token_ids), "_steps": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", default="Write a Python Fibonacci function.")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--zero-windows", choices=("on", "off"), default="off",
                   help="the draft lane's windows of zero (default off: every step of the example verifies a window)")
    p.add_argument("--out", default=os.path.join(HERE, "assets", "learn_example", "example.json"))
    args = p.parse_args(argv)
    from mirror_core import MirrorEngine, Request, SpecConfig, machine
    from mirror_core.models.pairs import default_pair

    pair = default_pair()
    engine = MirrorEngine.load(pair.target, pair.draft)
    try:
        ids = engine.encode(args.prompt)
        spec = engine.info.resolve(SpecConfig(zero_windows=args.zero_windows == "on"))
        for _ in engine.stream(Request(ids, "mirror", 8, spec=spec)):  # warm-up, as the page's loader does
            pass
        runs = {d: _run(engine, Request(ids, d, args.max_new, spec=spec)) for d in ("ar", "sd", "mirror")}
        shown = set().union(*(_ids(r.pop("_steps"), tuple(r["token_ids"])) for r in runs.values()))
        tok = engine.tokenizer
        example = {
            "format": FORMAT, "prompt": args.prompt, "prompt_ids": list(ids), "max_new_tokens": args.max_new,
            "recorded": {"cpu": machine.cpu_model(), "cores": len(machine.usable_cpus()),
                         "date": datetime.date.today().isoformat(), "lanes": engine.info.lanes.kind,
                         "command": "python scripts/record_learn_example.py"
                                    + ("" if args.zero_windows == "off" else " --zero-windows on")},
            "pair": {"target": pair.target, "draft": os.path.relpath(pair.draft, HERE) if pair.draft else None,
                     "num_layers": engine.info.num_layers, "gamma": spec.gamma, "kappa": spec.kappa,
                     "exit_layer": spec.exit_layer, "zero_windows": spec.zero_windows},
            "load": _load_figures(engine.info),
            "tokens": {str(t): tok.decode([t], skip_special_tokens=False) for t in sorted(shown)},
            "runs": runs}
    finally:
        engine.close()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(example, f, ensure_ascii=False, separators=(",", ":"))
    m = runs["mirror"]["summary"]
    print(f"wrote {args.out} ({os.path.getsize(args.out) // 1024} KB): {m['new_tokens']} tokens, {m['steps']} steps, "
          f"ar {runs['ar']['summary']['wall_s']:.3f} s, mirror {m['wall_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
