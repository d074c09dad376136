"""The bench report as one self-contained HTML file: tables plus plotly charts (plotly.js inlined once)."""
from __future__ import annotations

import html
import json

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .rows import SPECULATIVE, entries
from .summary import BenchReport

_TABLE_COLS = (("decoder", "name"), ("prompts", "prompts"), ("tokens/s", "tokens_per_s"),
               ("speedup vs baseline", "speedup_vs_baseline"), ("min–max", "speedup_vs_baseline_range"),
               ("IQR", "speedup_vs_baseline_iqr"), ("vs ar", "speedup_vs_ar"), ("vs ar_all", "speedup_vs_ar_all"),
               ("τ", "tau"), ("α", "acceptance_rate"), ("hit rate", "hit_rate"),
               ("draft-hidden", "draft_hidden_fraction"), ("bound τ·T_AR/T_verify", "bound"),
               ("predicted vs ar (modelled)", "predicted_speedup_vs_ar"), ("step ms", "step_ms"),
               ("hidden-draft bound ms", "hidden_bound_ms"), ("output = ar", "all_equal_to_ar"))


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, tuple):
        return "–".join(f"{x:.2f}" for x in v)
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def speedup_figure(report: BenchReport) -> go.Figure:
    s = [e for e in report.summary if e.speedup_vs_baseline is not None]
    lo = [e.speedup_vs_baseline - e.speedup_vs_baseline_range[0] for e in s]
    hi = [e.speedup_vs_baseline_range[1] - e.speedup_vs_baseline for e in s]
    fig = go.Figure(go.Bar(x=[e.name for e in s], y=[e.speedup_vs_baseline for e in s], name="median",
                           error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo)))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text=f"baseline ({report.baseline})")
    fig.update_layout(title="Speedup vs the baseline (median over prompts; bars: min–max)", yaxis_title="×")
    return fig


def tokens_figure(report: BenchReport) -> go.Figure:
    fig = go.Figure()
    for name, rows in entries(report.rows).items():
        fig.add_trace(go.Bar(x=[r.prompt for r in rows], y=[r.tokens_per_s for r in rows], name=name))
    fig.update_layout(title="Tokens/s per prompt (median over repeats)", barmode="group", yaxis_title="tokens/s")
    return fig


def acceptance_figure(report: BenchReport) -> go.Figure:
    s = [e for e in report.summary if e.tau is not None]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("τ (tokens per verification)", "rates"))
    names = [e.name for e in s]
    fig.add_trace(go.Bar(x=names, y=[e.tau for e in s], name="τ"), row=1, col=1)
    for key, label in (("acceptance_rate", "α"), ("hit_rate", "hit rate"), ("draft_hidden_fraction", "draft-hidden")):
        fig.add_trace(go.Bar(x=names, y=[getattr(e, key) for e in s], name=label), row=1, col=2)
    fig.update_layout(title="Acceptance, hit rate and hidden draft (means over prompts)", barmode="group")
    return fig


def model_figure(report: BenchReport) -> go.Figure:
    s = [e for e in report.summary if e.decoder in SPECULATIVE]
    names = [e.name for e in s]
    fig = go.Figure([go.Bar(x=names, y=[e.speedup_vs_ar for e in s], name="measured vs ar"),
                     go.Bar(x=names, y=[e.predicted_speedup_vs_ar for e in s], name="latency model (modelled)"),
                     go.Scatter(x=names, y=[e.bound for e in s], mode="markers", name="bound τ·T_AR/T_verify",
                                marker=dict(symbol="line-ew-open", size=28, line=dict(width=3)))])
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="Measured vs predicted speedup over ar (docs/ALGORITHM.md §4), with the physical bound",
                      barmode="group", yaxis_title="×")
    return fig


def _table(report: BenchReport) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in _TABLE_COLS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(getattr(e, k)))}</td>" for _, k in _TABLE_COLS) + "</tr>"
                   for e in report.summary)
    return f"<table><tr>{head}</tr>{body}</table>"


def report_html(report: BenchReport) -> str:
    figures = [speedup_figure(report), tokens_figure(report), acceptance_figure(report)]
    if any(e.decoder in SPECULATIVE for e in report.summary):
        figures.append(model_figure(report))
    charts = "".join(f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures))
    best = report.best
    best_html = (f"<p><b>Best mirror setting:</b> {html.escape(best.name)}: "
                 f"{_fmt(best.speedup_vs_baseline)}× vs baseline</p>" if best else "")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    settings = html.escape(json.dumps(report.settings, indent=1, ensure_ascii=False))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Mirror-SD bench</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>"
            f"<h1>Mirror-SD bench ({html.escape(report.time)})</h1>"
            f"<p>Baseline: <b>{html.escape(str(report.baseline))}</b></p>{best_html}{_table(report)}"
            f"{charts}<h2>How it was measured</h2><ul>{notes}</ul><h2>Settings</h2><pre>{settings}</pre>"
            "</body></html>")


def write_html(path: str, report: BenchReport) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(report_html(report))
