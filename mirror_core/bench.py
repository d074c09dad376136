"""`python -m mirror_core bench`: prompts × decoders on one loaded pair → a table and a JSON report.

Every decoder runs on the same prompts, lengths and settings, one after another with the lanes to
themselves, after a warm-up; each (prompt, decoder) is repeated and the median taken. Every
speculative decoder's greedy output is checked equal to `ar`'s, and the report says so. Timings
are the engine's own (decode wall time from the first target forward to the last commit).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from .api import MirrorEngine
from .config import MirrorError, Request, SamplingConfig, SpecConfig


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    category: str
    prompt_ids: tuple[int, ...]


def load_prompts(path: str, tokenizer, limit: int | None = None) -> list[BenchPrompt]:
    """Spec-Bench question.jsonl lines ({"question_id", "category", "turns": [...]}); the first turn is
    the prompt. A "prompt_ids" field (our extension) serves models without a tokenizer."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            if "prompt_ids" in row:
                ids = tuple(int(t) for t in row["prompt_ids"])
            elif tokenizer is None:
                raise MirrorError(f"{path}: line {n + 1} has text but the target has no tokenizer; add prompt_ids")
            else:
                ids = tuple(tokenizer.encode(row["turns"][0]))
            out.append(BenchPrompt(str(row.get("question_id", n)), str(row.get("category", "")), ids))
    return out[:limit] if limit else out


def run_bench(engine: MirrorEngine, prompts: list[BenchPrompt], decoders: list[str], max_new_tokens: int,
              spec: SpecConfig, sampling: SamplingConfig, repeats: int, warmup: int, progress=print) -> dict:
    rows = []
    for p in prompts[:1]:
        for _ in range(warmup):
            for decoder in decoders:
                engine.generate(Request(p.prompt_ids, decoder, max_new_tokens, sampling, spec))
    for i, p in enumerate(prompts):
        reference = None
        for decoder in decoders:
            runs = [engine.generate(Request(p.prompt_ids, decoder, max_new_tokens, sampling, spec))
                    for _ in range(repeats)]
            stats = [r.stats for r in runs]
            tokens = runs[0].token_ids
            reference = tokens if decoder == "ar" else reference
            rows.append({
                "prompt": p.name, "category": p.category, "decoder": decoder, "new_tokens": len(tokens),
                "wall_s": statistics.median(s["wall_s"] for s in stats),
                "wall_s_spread": [min(s["wall_s"] for s in stats), max(s["wall_s"] for s in stats)],
                "tau": stats[0]["tau"], "acceptance_rate": stats[0]["acceptance_rate"],
                "hit_rate": stats[0]["hit_rate"], "draft_hidden_fraction": statistics.median(
                    s["draft_hidden_fraction"] for s in stats) if stats[0]["draft_hidden_fraction"] is not None else None,
                "draft_tokens_per_forward": stats[0].get("draft_tokens_per_forward"),
                "target_busy_s": statistics.median(s["target_busy_s"] for s in stats),
                "steps": stats[0]["steps"], "fallback": runs[0].fallback,
                "equal_to_ar": None if reference is None or decoder == "ar" else tokens == reference,
            })
        progress(f"[{i + 1}/{len(prompts)}] {p.name}")
    return {"rows": rows, "summary": summarize_rows(rows, decoders), "settings": {
        "max_new_tokens": max_new_tokens, "gamma": spec.gamma, "kappa": spec.kappa, "exit_layer": spec.exit_layer,
        "temperature": sampling.temperature, "repeats": repeats, "warmup": warmup,
        "target": engine.info.target, "draft": engine.info.draft, "lanes": engine.info.lanes.__dict__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S")}}


def summarize_rows(rows: list[dict], decoders: list[str]) -> dict:
    """Per decoder: median tokens/s, median speedup over ar on the same prompt, mean τ/hit/hidden."""
    by = {(r["prompt"], r["decoder"]): r for r in rows}
    out = {}
    for decoder in decoders:
        mine = [r for r in rows if r["decoder"] == decoder]
        speedups = [by[(r["prompt"], "ar")]["wall_s"] / r["wall_s"] for r in mine if (r["prompt"], "ar") in by]
        mean = lambda key: _mean([r[key] for r in mine])  # noqa: E731
        out[decoder] = {
            "tokens_per_s": statistics.median(r["new_tokens"] / r["wall_s"] for r in mine),
            "speedup_vs_ar": statistics.median(speedups) if speedups else None,
            "tau": mean("tau"), "acceptance_rate": mean("acceptance_rate"), "hit_rate": mean("hit_rate"),
            "draft_hidden_fraction": mean("draft_hidden_fraction"),
            "draft_tokens_per_forward": mean("draft_tokens_per_forward"),
            "all_equal_to_ar": None if decoder == "ar" else all(r["equal_to_ar"] for r in mine),
        }
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def format_table(summary: dict) -> str:
    cols = ("tokens_per_s", "speedup_vs_ar", "tau", "acceptance_rate", "hit_rate", "draft_hidden_fraction",
            "draft_tokens_per_forward", "all_equal_to_ar")
    lines = ["decoder  " + "  ".join(f"{c:>12.12}" for c in cols)]
    for decoder, s in summary.items():
        cells = [f"{s[c]:12.3f}" if isinstance(s[c], float) else f"{str(s[c]):>12}" for c in cols]
        lines.append(f"{decoder:8} " + "  ".join(cells))
    return "\n".join(lines)
