"""AR's decode on a quiet machine and beside a second process decoding on the same cores at the same priority.

    PYTHONPATH=. python scripts/contention.py [--rounds 3] [--max-new 96] [--out docs/bench/contention.json]

Each round runs `python -m mirror_core generate --decoder ar --json` on the default pair twice, alternated: with
`--serial-cores all` (the engine's own plan: AR on every core where the load timed it faster there, else on the
target lane's core) and with `--serial-cores lane` (one core). The rounds run first on a quiet machine, then while a
competitor (this script with --compete: the same pair loaded once, AR on every core, decoding without pause) runs.
Reported per condition and plan: AR's decode speed after the first token ((new tokens − 1) ÷ (wall − TTFT), the
engine's own spans), the median over the rounds, and the load's timing of AR's step on the lane's core and on
every core (`pair.whole_machine`: the best of its alternated timings, their spread, and where AR then ran). What the
goal asks: under contention AR's plan is never slower than one core, and the load's every-core step stays within 2×
of the quiet machine's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _generate(serial: str, max_new: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "mirror_core", "generate", "--decoder", "ar", "--json",
                          "--serial-cores", serial, "--max-new-tokens", str(max_new), "--prompt", PROMPT],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    s = d["stats"]
    decode_s = s["wall_s"] - s["ttft_s"]
    return {"decode_tok_s": round((s["new_tokens"] - 1) / decode_s, 1) if decode_s > 0 else None,
            "new_tokens": s["new_tokens"], "whole_machine": d["pair"]["whole_machine"]}


def _compete() -> int:
    """The competitor: the default pair's target, AR on every core, decoding until killed."""
    from mirror_core import MirrorEngine, Request
    from mirror_core.models.pairs import default_pair

    pair = default_pair()
    with MirrorEngine.load(pair.target, None) as engine:
        ids = engine.encode(PROMPT)
        print("competing", flush=True)
        while True:
            for _ in engine.stream(Request(ids, "ar", 256)):
                pass


def _condition(rounds: int, max_new: int) -> dict:
    runs: dict[str, list[dict]] = {"all": [], "lane": []}
    for _ in range(rounds):
        for serial in ("all", "lane"):
            runs[serial].append(_generate(serial, max_new))
    out = {}
    for serial, rs in runs.items():
        speeds = [r["decode_tok_s"] for r in rs if r["decode_tok_s"]]
        out[serial] = {"decode_tok_s_median": round(statistics.median(speeds), 1) if speeds else None,
                       "decode_tok_s": speeds, "whole_machine": [r["whole_machine"] for r in rs]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--out", default=None, help="write the record (JSON) here")
    p.add_argument("--compete", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compete:
        return _compete()
    from mirror_core.machine import cpu_flags, cpu_model

    print(f"CPU: {cpu_model()}; flags: {' '.join(sorted(cpu_flags()))}", flush=True)
    record = {"format": "mirror-sd-contention/1", "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"),
              "command": "PYTHONPATH=. python scripts/contention.py " + " ".join(argv or sys.argv[1:]),
              "rounds": args.rounds, "max_new_tokens": args.max_new, "load_average_before": os.getloadavg()[0]}
    record["quiet"] = _condition(args.rounds, args.max_new)
    rival = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--compete"], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        rival.stdout.readline()  # "competing": loaded and decoding
        record["contended"] = _condition(args.rounds, args.max_new)
    finally:
        rival.kill()
        rival.wait()
    for name in ("quiet", "contended"):
        c = record[name]
        whole = [w for w in c["all"]["whole_machine"] if w]
        every = statistics.median(w["every_core_step_ms"] for w in whole) if whole else None
        lane = statistics.median(w["lane_step_ms"] for w in whole) if whole else None
        cores = [w["ar_cores"] for w in whole]
        print(f"{name:9}  AR (plan) {c['all']['decode_tok_s_median']} tok/s on {cores} cores · AR (one core) "
              f"{c['lane']['decode_tok_s_median']} tok/s · the load's step on every core {every} ms, on one core "
              f"{lane} ms (busy: {[w['busy'] for w in whole]})")
    q, k = record["quiet"], record["contended"]
    qe = [w["every_core_step_ms"] for w in q["all"]["whole_machine"] if w]
    ke = [w["every_core_step_ms"] for w in k["all"]["whole_machine"] if w]
    if qe and ke:
        record["every_core_step_ratio"] = round(statistics.median(ke) / statistics.median(qe), 2)
    plan, one = k["all"]["decode_tok_s_median"], k["lane"]["decode_tok_s_median"]
    if plan and one:
        record["contended_plan_over_one_core"] = round(plan / one, 2)
    print(f"contended: AR's plan ÷ one core = {record.get('contended_plan_over_one_core')} (goal ≥ 1); the load's "
          f"every-core step, contended ÷ quiet = {record.get('every_core_step_ratio')} (goal ≤ 2)")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
