"""A BenchReport → console table, JSON, CSV and the self-contained HTML page (html_report.py)."""
from __future__ import annotations

import csv
import json
import os

from ..phases import PHASE_KEYS, WAIT_SPLIT, versus_sd
from .rows import BenchRow
from .summary import BenchReport

_SUMMARY_COLS = (("tok/s", "tokens_per_s", "{:.1f}"), ("×base", "speedup_vs_baseline", "{:.2f}"),
                 ("min–max", "speedup_vs_baseline_range", "{}"), ("×base dec", "decode_speedup_vs_baseline", "{:.2f}"),
                 ("×ar", "speedup_vs_ar", "{:.2f}"),
                 ("×ar_all", "speedup_vs_ar_all", "{:.2f}"), ("τ", "tau", "{:.2f}"),
                 ("α", "acceptance_rate", "{:.2f}"),
                 ("hit", "hit_rate", "{:.2f}"), ("zero", "zero_share", "{:.2f}"),
                 ("hidden", "draft_hidden_fraction", "{:.2f}"),
                 ("bound", "bound", "{:.2f}"), ("pred×ar", "predicted_speedup_vs_ar", "{:.2f}"),
                 ("step/hb", "step_over_hidden_bound", "{:.2f}"), ("=ar", "all_equal_to_ar", "{}"),
                 ("agree", "agreement_with_ar", "{:.2f}"), ("step ms", "step_ar_ms", "{:.2f}"))


def _cell(value, fmt: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, tuple):
        return "–".join(f"{v:.2f}" for v in value)
    return fmt.format(value) if isinstance(value, float) else str(value)


def format_table(report: BenchReport) -> str:
    summary = report.summary
    width = max([len(s.name) for s in summary] + [7])
    lines = ["decoder".ljust(width) + "".join(f"{h:>10}" for h, _, _ in _SUMMARY_COLS)]
    for s in summary:
        lines.append(s.name.ljust(width) + "".join(f"{_cell(getattr(s, k), f):>10}" for _, k, f in _SUMMARY_COLS))
    lines.append(f"baseline: {report.baseline or '– (run ar or ar_all)'}; ×base = median speedup over prompts "
                 "(min–max); ×base dec = the same after the first token (the prefill left out); bound = τ·T_AR/T_verify; pred×ar = latency model (modelled); "
                 "zero = steps that took a window of zero (a plain target step) / steps; "
                 "step/hb = mirror step / hidden-draft bound; agree = common prefix with ar's tokens (share); "
                 "step ms = median target-only step (llama.cpp: time between tokens)")
    for dtype, k in (report.settings.get("target_kernel") or {}).items():
        if k.get("note"):
            lines.append(f"target [{dtype}]: {k['note']}")
        if k.get("ar_fastest_format") and k["ar_fastest_format"] != k.get("chosen_format"):
            steps = k["ar_step_ms_by_format"]
            lines.append(f"  note: AR's fastest format here is {k['ar_fastest_format']} ({steps[k['ar_fastest_format']]:.1f} "
                         f"ms a step at load), not the chosen {k['chosen_format']} "
                         f"({steps[k['chosen_format']]:.1f} ms): run --dtype auto,{k['ar_fastest_format']} for "
                         "ar at both, measured")
    lines += phase_lines(report)
    lines += load_model_lines(report) + mirror_vs_sd_lines(report)
    if report.best:
        b = report.best
        lines.append(f"best mirror setting: γ={b.gamma} κ={b.kappa} ℓe={b.exit_layer} "
                     f"branch budget={b.branch_budget or 'all'} "
                     f"({_cell(b.speedup_vs_baseline, '{:.2f}')}× vs baseline, "
                     f"predicted {_cell(b.predicted_speedup_vs_ar, '{:.2f}')}× vs ar)")
    return "\n".join(lines)


def phase_lines(report: BenchReport) -> list[str]:
    """Per engine decoder, its mean step by phase (ms, mean over prompts): the parts, then the wait's split."""
    lines = []
    for s in report.summary:
        p = s.phases_ms
        if not p:
            continue
        split = {*WAIT_SPLIT, "total", "tau"}
        parts = " + ".join(f"{k} {v:.2f}" for k, v in p.items() if k not in split)
        wait = (f" (the wait: draft rollouts {p[WAIT_SPLIT[0]]:.2f}, messages and draft overhead "
                f"{p[WAIT_SPLIT[1]]:.2f})" if WAIT_SPLIT[0] in p else "")
        lines.append(f"step by phase, {s.name}: {parts} = {p['total']:.2f} ms{wait}")
    return lines


def mirror_vs_sd_lines(report: BenchReport) -> list[str]:
    """Where vanilla SD's step costs less a token than Mirror-SD's, the terms that separate them (each decoder's mean
    step by phase, ms), the largest first: the target's passes (Mirror-SD's on its lane beside the draft, SD's on ar's
    cores), the readout SD does not have, each one's wait for the draft, and acceptance with the rest."""
    by_name = {s.name: s for s in report.summary}
    for mirror_name, sd_name in (("mirror_raw", "sd_raw"), ("mirror", "sd")):
        m, s = (by_name.get(n) for n in (mirror_name, sd_name))
        if m is None or s is None or not m.phases_ms or not s.phases_ms:
            continue
        pm, ps = m.phases_ms, s.phases_ms
        if pm["total"] / pm["tau"] <= ps["total"] / ps["tau"]:
            return []
        names = {"passes": "the target's passes", "readout": "the readout", "wait": "the wait for the draft",
                 "accept": "acceptance and the rest"}
        terms = [(names[k], a, b) for k, (a, b) in versus_sd(pm, ps).items()]
        terms.sort(key=lambda t: -(t[1] - t[2]))
        said = "; ".join(f"{name} {a:.2f} vs {b:.2f}" for name, a, b in terms)
        return [f"{mirror_name} vs {sd_name}: {pm['total'] / pm['tau']:.2f} vs {ps['total'] / ps['tau']:.2f} ms a "
                f"token; a step by part, the largest excess first (ms): {said}"]
    return []


def load_model_lines(report: BenchReport) -> list[str]:
    """The load's latency model (γ, κ chosen with it) against what the run measured: each speculative decoder's
    modelled speedup over the baseline beside its measured median, raw speculation's (sd_raw, mirror_raw: every step
    a window, as the model has it) where those ran, and how far apart they are."""
    chosen = report.settings.get("chosen_settings") or {}
    by_name = {s.name: s for s in report.summary}
    said = []
    for decoder, key in (("sd", "modelled_sd_speedup"), ("mirror", "modelled_speedup")):
        run = by_name.get(f"{decoder}_raw") or by_name.get(decoder)
        modelled = chosen.get(key)
        if run is None or modelled is None or not run.speedup_vs_baseline:
            continue
        off = modelled / run.speedup_vs_baseline - 1
        said.append(f"{decoder} {modelled:.2f}x modelled vs {run.speedup_vs_baseline:.2f}x measured ({run.name}, "
                    f"{off:+.0%})")
    if not said:
        return []
    return ["the load's latency model (modelled at load, raw speculation, against the baseline): " + "; ".join(said)]


def _flat(row: BenchRow) -> dict:
    """One CSV line: the JSON row without token_ids, model_ms spread over model_<term>_ms columns and phases_ms over
    phase_<name> columns."""
    d = row.to_dict()
    out = {k: v for k, v in d.items() if k not in ("token_ids", "model_ms", "phases_ms")}
    for k, v in (d["model_ms"] or {}).items():
        out[f"model_{k}_ms"] = v
    for k in PHASE_KEYS:  # every phase column on every row, so the header is the same whatever ran
        out["phase_" + k.replace(" ", "_")] = (d["phases_ms"] or {}).get(k)
    return out


def write_csv(path: str, rows: tuple[BenchRow, ...]) -> None:
    flat = [_flat(r) for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(flat)


def write_json(path: str, report: BenchReport) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report.to_dict(), f, indent=1)


def write_outputs(report: BenchReport, out: str | None, out_dir: str | None) -> list[str]:
    """--out FILE (JSON) and/or --out-dir DIR (bench.json, bench.csv, bench.html); returns the paths."""
    written = []
    if out:
        write_json(out, report)
        written.append(out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        paths = [os.path.join(out_dir, n) for n in ("bench.json", "bench.csv", "bench.html")]
        write_json(paths[0], report)
        write_csv(paths[1], report.rows)
        from .html_report import write_html  # plotly is imported only when an HTML report is written

        write_html(paths[2], report)
        written += paths
    return written
