"""Pure figure builders: DecoderRun events → plotly figure dicts. Every time comes from the engine's spans/events.

The figures are plain plotly JSON dicts ({"data": [...], "layout": {...}}), not graph_objects: plotly
validates every property of every trace, which is costly per live update in the app's process,
next to the engine's target lane (measured: docs/BENCHMARKS.md, "Figures behind design choices").
`go.Figure(fig)` validates a dict when a test wants it to.
"""
from __future__ import annotations

import json

from mirror_core.metrics import summarize

from .session import DecoderRun
from .settings import DECODER_TITLES

SHORT_NAMES = {"ar": "AR", "sd": "SD", "mirror": "Mirror-SD"}
DECODER_COLORS = {"ar": "#64748b", "sd": "#3b82f6", "mirror": "#ef4444"}
# Colours keep one meaning across the page: grey = the target alone (as in the token views), blues = the
# target's verification (dark whole pass, mid prefix, pale suffix), cyan = a reused branch (as the
# "accepted · reused branch" tokens), pink = the draft's branch batch, red = a fresh draft rollout.
STAGE_STYLE = {  # stage → (legend name, colour)
    "prefill": ("prefill", "#334155"),
    "target_step": ("target AR step", "#94a3b8"),
    "target_verify": ("target verify (no early exit)", "#1e3a8a"),
    "target_prefix": ("target prefix 1..ℓ_e", "#3b82f6"),
    "exit_readout": ("early-exit readout + send top-κ", "#facc15"),
    "target_suffix": ("target suffix ℓ_e+1..N (Δ)", "#bfdbfe"),
    "accept": ("acceptance", "#0f172a"),
    "wait": ("target waits for next window", "#e5e7eb"),
    "draft_branches": ("draft branch rollouts", "#db2777"),
    "draft_rollout": ("draft fresh rollout", "#b91c1c"),
    "select_branch": ("adopt branch KV", "#06b6d4"),
}
HIT_MARKS = ((True, "hit at t: c ∈ TopK, window t+1 is a reused branch", "circle", "#0891b2"),
             (False, "miss at t: window t+1 rolled out afresh", "x", "#b91c1c"))


def to_json(fig: dict) -> str:
    """The JSON string gr.Plot sends to the page (see layout.as_plot)."""
    return json.dumps(fig, separators=(",", ":"))


def _layout(title: str, height: int = 380, **extra) -> dict:
    # The legend sits at the bottom of the figure (container coordinates), below the x-axis title.
    layout = {"title": {"text": title, "font": {"size": 15}}, "height": height, "plot_bgcolor": "#ffffff",
              "margin": {"l": 60, "r": 20, "t": 60, "b": 120}, "font": {"size": 12},
              "legend": {"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0.01, "x": 0}}
    for key, value in extra.items():
        is_axis = key.startswith(("xaxis", "yaxis"))
        layout[key] = {"gridcolor": "#e5e7eb", "zerolinecolor": "#d1d5db", "automargin": True, **value} if is_axis else value
    for key in ("xaxis", "yaxis"):
        layout.setdefault(key, {"gridcolor": "#e5e7eb", "zerolinecolor": "#d1d5db", "automargin": True})
    return layout


def _empty(title: str, message: str) -> dict:
    return {"data": [], "layout": _layout(title, xaxis={"visible": False}, yaxis={"visible": False}, annotations=[
        {"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}])}


def _rows(n: int, gap: float = 0.12) -> list[tuple[float, float]]:
    """Vertical domains of n stacked subplots, top first."""
    h = (1.0 - gap * (n - 1)) / n
    return [(1.0 - (i + 1) * h - i * gap, 1.0 - i * h - i * gap) for i in range(n)]


def _title(text: str, x: float, y: float) -> dict:
    return {"text": text, "showarrow": False, "xref": "paper", "yref": "paper", "x": x, "y": y,
            "xanchor": "center", "yanchor": "bottom", "font": {"size": 13}}


def tokens_per_step_figure(runs: list[DecoderRun]) -> dict:
    """Stacked bars per verification step: accepted drafts (reused-branch window or fresh) + correction/bonus."""
    title = "Tokens per step (verification pass)"
    runs = [r for r in runs if r.steps]
    if not runs:
        return _empty(title, "Run SD or Mirror-SD to see tokens per step")
    data, layout, notes, in_legend = [], {}, [], set()
    for i, (run, (lo, hi)) in enumerate(zip(runs, _rows(len(runs))), start=1):
        axis = "" if i == 1 else str(i)
        x = [s.step for s in run.steps]
        acc = [min(s.accepted, s.committed) for s in run.steps]
        series = (("accepted (window from reused branch)", "#06b6d4", [a if s.from_branch else 0 for a, s in zip(acc, run.steps)]),
                  ("accepted (fresh window)", "#22c55e", [0 if s.from_branch else a for a, s in zip(acc, run.steps)]),
                  ("correction / bonus", "#f97316", [s.committed - a for a, s in zip(acc, run.steps)]))
        for name, color, y in series:
            data.append({"type": "bar", "x": x, "y": y, "name": name, "marker": {"color": color},
                         "legendgroup": name, "showlegend": i == 1, "xaxis": f"x{axis}", "yaxis": f"y{axis}"})
        for hit, name, symbol, color in HIT_MARKS:  # about step t's c: they decide step t + 1's window (its bar)
            marks = [s for s in run.steps if s.hit is hit]
            data.append({"type": "scatter", "mode": "markers", "x": [s.step for s in marks],
                         "y": [s.committed + 0.4 for s in marks], "name": name, "legendgroup": name,
                         "marker": {"symbol": symbol, "color": color, "size": 7},
                         "showlegend": bool(marks) and name not in in_legend,  # vanilla SD has none: not its legend
                         "xaxis": f"x{axis}", "yaxis": f"y{axis}"})
            in_legend |= {name} if marks else set()
        layout[f"xaxis{axis}"] = {"anchor": f"y{axis}", "title": {"text": "step"} if i == len(runs) else {}}
        layout[f"yaxis{axis}"] = {"anchor": f"x{axis}", "domain": [lo, hi], "title": {"text": "tokens"}}
        notes.append(_title(DECODER_TITLES[run.decoder], 0.5, hi))
    return {"data": data, "layout": _layout(title, 260 + 170 * len(runs), barmode="stack", annotations=notes,
                                            **layout)}


def lane_timeline_figure(runs: list[DecoderRun]) -> dict:
    """Gantt of each lane's busy spans per stage, in ms since each run's start (one monotonic clock)."""
    title = "Lane timeline: busy spans per stage (overlap = draft hidden under the target)"
    runs = [r for r in runs if r.spans]
    if not runs:
        return _empty(title, "No spans yet")
    rows: list[str] = []
    by_stage: dict[str, dict[str, list]] = {}
    for run in runs:
        for lane in ("target", "draft"):
            spans = [s for s in run.spans if s.lane == lane]
            if spans:
                rows.append(f"{SHORT_NAMES[run.decoder]} · {lane}")
            for s in spans:
                d = by_stage.setdefault(s.stage, {"y": [], "x": [], "base": [], "customdata": []})
                d["y"].append(rows[-1])
                d["base"].append(round((s.t0 - run.t0) * 1e3, 4))
                d["x"].append(round(max((s.t1 - s.t0) * 1e3, 1e-3), 4))
                d["customdata"].append(s.step)
    data = []
    for stage in [s for s in STAGE_STYLE if s in by_stage] + [s for s in by_stage if s not in STAGE_STYLE]:
        name, color = STAGE_STYLE.get(stage, (stage, "#a3a3a3"))
        data.append({"type": "bar", "orientation": "h", "name": name, "marker": {"color": color}, "width": 0.6,
                     "hovertemplate": f"{name}<br>step %{{customdata}}<br>start %{{base:.2f}} ms<br>%{{x:.2f}} ms"
                                      "<extra></extra>", **by_stage[stage]})
    return {"data": data, "layout": _layout(title, 300 + 46 * len(rows), barmode="overlay",
                                            xaxis={"title": {"text": "ms since run start"}},
                                            yaxis={"categoryorder": "array", "categoryarray": rows[::-1]})}


def race_figure(runs: list[DecoderRun], speedups: dict[str, tuple[float | None, str]]) -> dict:
    """Cumulative committed tokens vs wall time for every decoder, each on its own run's clock."""
    title = "Race: tokens vs wall time (each decoder ran alone)"
    runs = [r for r in runs if r.tokens]
    if not runs:
        return _empty(title, "No tokens yet")
    data = []
    for run in runs:
        name = DECODER_TITLES[run.decoder]
        value, kind = speedups.get(run.decoder, (None, ""))
        if value is not None and run.decoder != "ar":
            name += f" · {value:.2f}× vs AR ({kind})"
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 2.5,
                                                                  "color": DECODER_COLORS.get(run.decoder)},
                     "x": [0.0, *(round(t * 1e3, 4) for t in run.token_times())],
                     "y": list(range(len(run.tokens) + 1)), "name": name})
    return {"data": data, "layout": _layout(title, xaxis={"title": {"text": "ms since run start"}},
                                            yaxis={"title": {"text": "tokens committed"}})}


def acceptance_figure(runs: list[DecoderRun]) -> dict:
    """Histogram of A_t (γ+1 bins) and unconditional per-position acceptance α_i, side by side."""
    title = "Acceptance"
    runs = [r for r in runs if r.steps]
    if not runs:
        return _empty(title, "Run SD or Mirror-SD to see acceptance")
    data = []
    for run in runs:
        gamma = run.gamma
        counts = summarize(run.steps, [], gamma, new_tokens=0, t_start=0.0, t_first=None, t_end=0.0)  # the engine's counters
        hist = list(counts.hist)
        alpha = counts.per_position_acceptance
        color, name = DECODER_COLORS.get(run.decoder), DECODER_TITLES[run.decoder]
        data.append({"type": "bar", "x": list(range(gamma + 1)), "y": hist, "name": name,
                     "marker": {"color": color}, "legendgroup": name})
        data.append({"type": "scatter", "mode": "lines+markers", "x": list(range(1, gamma + 1)), "y": alpha,
                     "name": name, "line": {"color": color}, "legendgroup": name, "showlegend": False,
                     "xaxis": "x2", "yaxis": "y2"})
    return {"data": data, "layout": _layout(
        title, barmode="group",
        xaxis={"domain": [0.0, 0.44], "title": {"text": "A_t"}, "dtick": 1},
        yaxis={"title": {"text": "steps"}},
        xaxis2={"domain": [0.56, 1.0], "anchor": "y2", "title": {"text": "draft position i"}, "dtick": 1},
        yaxis2={"anchor": "x2", "title": {"text": "α_i"}, "range": [0, 1.05]},
        annotations=[_title("histogram of A_t (accepted per step)", 0.22, 1.0),
                     _title("per-position α_i = #(A_t ≥ i) / #(D_t ≥ i)", 0.78, 1.0)])}
