"""Bench rows → summary, console table, JSON, CSV and a self-contained HTML report (plotly.js inlined)."""
from __future__ import annotations

import csv
import json
import os
import statistics
import time
from dataclasses import asdict

from .harness import BenchConfig, baseline_decoder

NOTES = (
    "Engine decoders (ar, ar_all, sd, mirror) are timed by the engine's own spans: prefill start → last commit, "
    "one monotonic clock for both lanes; loading and tokenisation excluded.",
    "hf and hf_assisted are timed by time.perf_counter around transformers' generate() (torch.cuda.synchronize "
    "first and last on CUDA): prefill and transformers' per-call set-up included, tokenisation excluded; "
    "they run on the target's device, on every core on a CPU.",
    "Each (prompt, decoder, setting) ran `repeats` times, interleaved across decoders, after `warmup` runs of "
    "every cell; wall_s is the median, wall_s_min/max the spread; other per-run values come from the run with "
    "the median wall time.",
    "Speedup = per-token time of the reference / per-token time of the decoder on the same prompt (= the "
    "wall-time ratio when the outputs are equal, hence equally long). Across prompts: the median, with "
    "min/max and the interquartile range.",
    "Baseline = the faster of ar (target only, on the target's lane) and ar_all (target only, every core) "
    "by total median wall time over the suite.",
    "equal_to_ar: identical new-token ids, full length (every decoder stops at the same EOS ids and token "
    "budget).",
    "bound = τ·T_AR/T_verify: the speedup over ar with a free draft (T_AR = median target-only step of the same "
    "prompt's ar run, T_verify = median verification pass of this run).",
    "hidden_bound_ms (mirror) = median(verification + acceptance) + the fastest draft-lane reply in the run; "
    "step_ms is the measured median step (target prefix start → next window in hand).",
    "predicted_speedup_vs_ar = τ·T_AR/E[T_step] with E[T_step] = T_pre + T_rv^ee + max(Δ, T_branch) + T_rv^fv "
    "+ FF·T_fresh (mirror_sd.md §4), every term the mean of this run's spans: modelled, not measured.",
)
_SUMMARY_COLS = (("tok/s", "tokens_per_s", "{:.1f}"), ("×base", "speedup_vs_baseline", "{:.2f}"),
                 ("min–max", "speedup_vs_baseline_range", "{}"), ("×ar", "speedup_vs_ar", "{:.2f}"),
                 ("×ar_all", "speedup_vs_ar_all", "{:.2f}"), ("τ", "tau", "{:.2f}"),
                 ("α", "acceptance_rate", "{:.2f}"),
                 ("hit", "hit_rate", "{:.2f}"), ("hidden", "draft_hidden_fraction", "{:.2f}"),
                 ("bound", "bound", "{:.2f}"), ("pred×ar", "predicted_speedup_vs_ar", "{:.2f}"),
                 ("step/hb", "step_over_hidden_bound", "{:.2f}"), ("=ar", "all_equal_to_ar", "{}"))


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _quartiles(values: list) -> list[float] | None:
    values = sorted(v for v in values if v is not None)
    if len(values) < 2:
        return [values[0], values[0]] if values else None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[2]]


def entries(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped per summary entry: the decoder's name, plus its setting when it ran at several."""
    settings: dict[str, set] = {}
    for r in rows:
        settings.setdefault(r["decoder"], set()).add(r["setting"])
    groups: dict[str, list[dict]] = {}
    for r in rows:
        name = f"{r['decoder']} {r['setting']}" if len(settings[r["decoder"]]) > 1 else r["decoder"]
        groups.setdefault(name, []).append(r)
    return groups


def summarize(rows: list[dict]) -> list[dict]:
    """One entry per decoder (per setting when a decoder ran at several): medians and spread over prompts."""
    out = []
    for name, mine in entries(rows).items():
        col = lambda key: [r[key] for r in mine]  # noqa: E731
        speedups = [v for v in col("speedup_vs_baseline") if v is not None]
        equal = col("equal_to_ar")
        first = mine[0]
        out.append({
            "name": name, "decoder": first["decoder"], "setting": first["setting"], "gamma": first["gamma"],
            "kappa": first["kappa"], "exit_layer": first["exit_layer"], "branch_budget": first.get("branch_budget"),
            "prompts": len(mine),
            "tokens_per_s": _median(col("tokens_per_s")),
            "speedup_vs_baseline": _median(speedups),
            "speedup_vs_baseline_range": [min(speedups), max(speedups)] if speedups else None,
            "speedup_vs_baseline_iqr": _quartiles(speedups),
            "speedup_vs_ar": _median(col("speedup_vs_ar")), "speedup_vs_ar_all": _median(col("speedup_vs_ar_all")),
            "tau": _mean(col("tau")), "acceptance_rate": _mean(col("acceptance_rate")),
            "hit_rate": _mean(col("hit_rate")), "draft_hidden_fraction": _median(col("draft_hidden_fraction")),
            "draft_tokens_per_forward": _mean(col("draft_tokens_per_forward")),
            "bound": _median(col("bound")), "predicted_speedup_vs_ar": _median(col("predicted_speedup_vs_ar")),
            "step_ms": _median(col("step_ms")), "hidden_bound_ms": _median(col("hidden_bound_ms")),
            "step_over_hidden_bound": _median([r["step_ms"] / r["hidden_bound_ms"] for r in mine
                                               if r["step_ms"] and r["hidden_bound_ms"]]),
            "all_equal_to_ar": None if all(e is None for e in equal) else all(e is True for e in equal),
        })
    return out


def best_setting(summary: list[dict]) -> dict | None:
    """The mirror setting with the highest median speedup over the baseline (when mirror ran at several)."""
    mirror = [s for s in summary if s["decoder"] == "mirror" and s["speedup_vs_baseline"] is not None]
    if len(mirror) < 2:
        return None
    best = max(mirror, key=lambda s: s["speedup_vs_baseline"])
    return {k: best[k] for k in ("name", "gamma", "kappa", "exit_layer", "branch_budget", "speedup_vs_baseline",
                                 "predicted_speedup_vs_ar", "speedup_vs_ar")}


def build_report(rows: list[dict], config: BenchConfig, info: dict) -> dict:
    summary = summarize(rows)
    return {"format": "mirror-sd-bench/2", "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "settings": {"max_new_tokens": config.max_new_tokens, "repeats": config.repeats, "warmup": config.warmup,
                         "decoders": list(config.decoders), "spec": asdict(config.spec),
                         "sampling": asdict(config.sampling), "sweep": [asdict(s) for s in config.sweep], **info},
            "baseline": baseline_decoder(rows), "notes": list(NOTES), "summary": summary,
            "best": best_setting(summary), "rows": rows}


def _cell(value, fmt: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, list):
        return "–".join(f"{v:.2f}" for v in value)
    return fmt.format(value) if isinstance(value, float) else str(value)


def format_table(report: dict) -> str:
    summary = report["summary"]
    width = max([len(s["name"]) for s in summary] + [7])
    lines = ["decoder".ljust(width) + "".join(f"{h:>10}" for h, _, _ in _SUMMARY_COLS)]
    for s in summary:
        lines.append(s["name"].ljust(width) + "".join(f"{_cell(s[k], f):>10}" for _, k, f in _SUMMARY_COLS))
    lines.append(f"baseline: {report['baseline'] or '– (run ar or ar_all)'}; ×base = median speedup over prompts "
                 "(min–max); bound = τ·T_AR/T_verify; pred×ar = latency model (modelled); "
                 "step/hb = mirror step / hidden-draft bound")
    if report["best"]:
        b = report["best"]
        lines.append(f"best mirror setting: γ={b['gamma']} κ={b['kappa']} ℓe={b['exit_layer']} "
                     f"branch budget={b['branch_budget'] or 'all'} "
                     f"({_cell(b['speedup_vs_baseline'], '{:.2f}')}× vs baseline, "
                     f"predicted {_cell(b['predicted_speedup_vs_ar'], '{:.2f}')}× vs ar)")
    return "\n".join(lines)


def _flat(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in ("token_ids", "model_ms")}
    for k, v in (row.get("model_ms") or {}).items():
        out[f"model_{k}_ms"] = v
    return out


def write_csv(path: str, rows: list[dict]) -> None:
    flat = [_flat(r) for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(flat)


def write_json(path: str, report: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def write_outputs(report: dict, out: str | None, out_dir: str | None) -> list[str]:
    """--out FILE (JSON) and/or --out-dir DIR (bench.json, bench.csv, bench.html); returns the paths."""
    from .html_report import write_html

    written = []
    if out:
        write_json(out, report)
        written.append(out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        paths = [os.path.join(out_dir, n) for n in ("bench.json", "bench.csv", "bench.html")]
        write_json(paths[0], report)
        write_csv(paths[1], report["rows"])
        write_html(paths[2], report)
        written += paths
    return written

