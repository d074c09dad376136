"""The prefill of one long prompt: ours (AR's first token on the default pair) against llama.cpp on the same GGUF.

    PYTHONPATH=. python scripts/prefill_rate.py [--tokens 550] [--repeats 3] [--out FILE.json]

The prompt is the first `--tokens` tokens of assets/texts/format_quality.txt, given as raw token ids to both. Ours:
`MirrorEngine` with the default lanes (the prefill on every core the plan gives it), a 1-token AR request, the
prompt's tokens ÷ the engine's TTFT (its own spans: the prefill and the first token's readout). llama.cpp
(`llama-cpp-python`, not in requirements.txt: see mirror_core/bench/peers.py) on every core with n_batch 512, from an
empty cache: the prompt's tokens ÷ the time to its first token. Best of `--repeats` each, alternated, after one
untimed run of each; the CPU model and flags printed beside the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TEXT = os.path.join(ROOT, "assets", "texts", "format_quality.txt")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=550)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the record (JSON) here")
    args = p.parse_args(argv)

    from mirror_core import MirrorEngine, Request
    from mirror_core.bench.peers import LlamaCppPeer
    from mirror_core.machine import cpu_flags, cpu_model
    from mirror_core.models.pairs import default_pair

    print(f"CPU: {cpu_model()}; flags: {' '.join(sorted(cpu_flags()))}", flush=True)
    pair = default_pair()
    with MirrorEngine.load(pair.target, None) as engine:
        with open(TEXT, encoding="utf-8") as f:
            ids = tuple(engine.encode(f.read(), chat=False)[: args.tokens])
        peer = LlamaCppPeer(pair.target, ("llama_cpp",))
        eos = frozenset(engine.eos_ids)

        def ours() -> float:
            return engine.generate(Request(ids, "ar", 1)).summary.ttft_s

        def theirs() -> float:
            return peer.generate("llama_cpp", ids, 1, eos)[1]

        ours(), theirs()  # untimed: each side's one-off costs
        times: dict[str, list[float]] = {"ours": [], "llama_cpp": []}
        for _ in range(args.repeats):
            times["ours"].append(ours())
            times["llama_cpp"].append(theirs())
    rate = {k: round(len(ids) / min(v), 1) for k, v in times.items()}
    record = {"format": "mirror-sd-prefill/1", "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"),
              "command": "PYTHONPATH=. python scripts/prefill_rate.py " + " ".join(argv or sys.argv[1:]),
              "prompt_tokens": len(ids), "seconds": times, "tok_per_s": rate,
              "ours_over_llama_cpp": round(rate["ours"] / rate["llama_cpp"], 2)}
    print(f"prefill of {len(ids)} tokens, best of {args.repeats}: ours {rate['ours']} tok/s, llama.cpp "
          f"{rate['llama_cpp']} tok/s on every core (n_batch 512): {record['ours_over_llama_cpp']}x")
    if args.out:  # the record, for docs/bench/
        pathlib.Path(args.out).write_text(json.dumps(record, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
