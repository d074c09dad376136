"""The Learn tab's roofline view: the loaded target's forward time against its number of new rows, from the last run's
RunSettings.roofline (mirror_core/records.py: measured when the pair loaded), beside the two limits it cannot beat.

The memory limit is weights ÷ read bandwidth (flat: every row reuses one read of the weights), the compute limit
is 2 · rows · multiply-adds ÷ the measured peak rate (rising); their larger is the model (dashed, "modelled").
Where they cross, the ridge, a window stops being nearly free. The page's only plotly user: plotly is imported
when a figure is drawn, so importing the UI stays light.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

from mirror_core import SpecConfig, machine

if TYPE_CHECKING:
    from mirror_core.events import Roofline  # the record RunSettings carries (ui/ reaches records through events)

    from ..session import Session

# measured = the target's verification blue (ui/plots.py), memory and compute each their own, modelled grey dashed
COLOURS = {"measured": "#1e3a8a", "memory": "#0891b2", "compute": "#f97316", "modelled": "#6b7280"}
NEARLY_FREE = 1.25  # a window that costs at most this many one-token steps is called "nearly free" in the sentence
AFTER_A_RUN = ("The roofline appears after a run, or once a pair is loaded (the server loads its first pair when it "
               "starts): press Show. It plots the target's forward time by rows, measured when the pair loaded.")


def ridge_rows(roof: Roofline) -> float | None:
    """The rows at which the compute limit reaches the memory limit (None unless both were measured)."""
    one_row, memory = roof.compute_ms(1), roof.roofline_ms
    return memory / one_row if one_row and memory else None


def modelled_ms(roof: Roofline, rows: float) -> float | None:
    """The model: the larger of the two limits at `rows` (None when neither was measured)."""
    limits = [v for v in (roof.roofline_ms, roof.compute_ms(rows)) if v is not None]
    return max(limits) if limits else None


def roofline_figure(roof: Roofline):
    """A plotly Figure: the measured forward by rows, the memory and compute limits, their maximum dashed."""
    import plotly.graph_objects as go  # here, not at import: the page imports without plotly until a figure is drawn

    rows = list(range(1, len(roof.rows_ms) + 1))
    hover = "%{y:.3~g} ms at %{x} rows<extra>%{fullData.name}</extra>"
    fig = go.Figure(go.Scatter(x=rows, y=list(roof.rows_ms), mode="lines+markers", name="measured at load",
                               line={"color": COLOURS["measured"], "width": 3}, hovertemplate=hover))
    if roof.roofline_ms is not None:
        fig.add_scatter(x=rows, y=[roof.roofline_ms] * len(rows), mode="lines", hovertemplate=hover,
                        name="memory limit: weights ÷ bandwidth", line={"color": COLOURS["memory"]})
    if roof.compute_ms(1) is not None:
        fig.add_scatter(x=rows, y=[roof.compute_ms(m) for m in rows], mode="lines", hovertemplate=hover,
                        name="compute limit: arithmetic ÷ peak rate", line={"color": COLOURS["compute"]})
    if roof.machine_roofline_ms is not None:  # the baseline's: every core reading the same bytes together
        fig.add_scatter(x=rows, y=[roof.machine_roofline_ms] * len(rows), mode="lines", hovertemplate=hover,
                        name=f"memory limit on all {roof.machine_cores} cores", line={"color": COLOURS["memory"],
                                                                                      "dash": "dot"})
        fig.add_scatter(x=[1], y=[roof.machine_step_ms], mode="markers", hovertemplate=hover,
                        name=f"AR step on all {roof.machine_cores} cores (the baseline)",
                        marker={"color": COLOURS["measured"], "symbol": "diamond", "size": 11})
    ridge = ridge_rows(roof)
    if modelled_ms(roof, 1) is not None:
        xs = sorted(set(rows) | ({ridge} if ridge and 1 < ridge < rows[-1] else set()))  # the kink at the ridge
        fig.add_scatter(x=xs, y=[modelled_ms(roof, m) for m in xs], mode="lines", hovertemplate=hover,
                        name="modelled: the larger limit", line={"color": COLOURS["modelled"], "dash": "dash"})
    if ridge and 1 <= ridge <= rows[-1]:
        fig.add_vline(x=ridge, line={"color": COLOURS["modelled"], "dash": "dot", "width": 1},
                      annotation_text=f"ridge ≈ {ridge:.1f} rows", annotation_position="top right")
    # The title sits under the plot's toolbar row (which covers the figure's top 40 px), both titles in lines a
    # phone's plot holds, and the x range is fixed: on a phone's narrow plot, autorange padded the markers out to
    # -2 rows.
    fig.update_layout(template="plotly_white", height=420, margin={"l": 60, "r": 20, "t": 94, "b": 60},
                      title={"text": "The target's forward<br>against its roofline (dashed: modelled)", "x": 0,
                             "xref": "paper", "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 44},
                             "font": {"size": 15}},
                      legend={"orientation": "h", "y": -0.3}, hovermode="x unified")
    fig.update_xaxes(title="new rows per forward (γ+1 = a window)", dtick=1,
                     range=[0.5, rows[-1] + 0.5])
    fig.update_yaxes(title="forward time (ms)", rangemode="tozero")
    return fig


def roofline_sentence(roof: Roofline, gamma: int | None = None) -> str:
    """What the chart says, computed from its figures: the AR step's share of the roofline, what a window of γ+1
    rows costs, and where the ridge is."""
    return " ".join(part for part in (_step_part(roof), _machine_part(roof), _window_part(roof, gamma),
                                      _ridge_part(roof)) if part)


def _machine_part(roof: Roofline) -> str:
    if not roof.machine_step_fraction:
        return ""
    return (f"On all {roof.machine_cores} cores, as the baseline (AR) runs, the step took {_num(roof.machine_step_ms)} ms "
            f"against {_num(roof.machine_roofline_ms)} ms for the same bytes at their {roof.machine_read_gbs:.1f} "
            f"GB/s together: {roof.machine_step_fraction:.0%} of that roofline. Mirror-SD's target keeps its own "
            "lane's cores, so its steps are held against the one-lane line.")


def _step_part(roof: Roofline) -> str:
    step = f"An AR step (one new row) took {_num(roof.rows_ms[0])} ms when the pair loaded"
    if roof.roofline_ms is None:
        return step + "; the read bandwidth was not measured, so there is no memory limit to hold it against."
    return (f"{step}; the roofline step ({_num(roof.weight_bytes / 1e6)} MB of weights ÷ {roof.read_gbs:.1f} GB/s) "
            f"is {_num(roof.roofline_ms)} ms, so the step reaches {roof.step_fraction:.0%} of the roofline.")


def _window_part(roof: Roofline, gamma: int | None) -> str:
    n, ridge = len(roof.rows_ms), ridge_rows(roof)
    rows = gamma + 1 if gamma and gamma + 1 <= n else n
    if rows < 2:
        return ""
    window = f"γ+1 = {rows} rows" if gamma and gamma + 1 <= n else f"{rows} rows"
    steps = roof.window_steps(rows)
    if ridge is None:
        return (f"A window of {window} cost {steps:.2f} of the lane's one-row forwards at load (without both limits "
                "measured, the ridge is unknown).")
    if rows > ridge:
        return (f"A window of {window} is past the ridge, where each extra row costs its arithmetic: it cost "
                f"{steps:.2f} steps.")
    verdict = (": verifying a window is nearly free" if steps <= NEARLY_FREE else
               ", more than the limits say (per-row work besides reading the weights: attention, norms, overheads)")
    return (f"While the pass is memory-bound, every row reuses one read of the weights, so a window of γ+1 rows costs "
            f"about one step; here a window of {window} cost {steps:.2f} of the lane's one-row forwards, measured at "
            f"load{verdict} (a run's window in AR steps is in the fold under the Run tab's verdict).")


def _ridge_part(roof: Roofline) -> str:
    ridge, n = ridge_rows(roof), len(roof.rows_ms)
    if ridge is None:
        return ""
    per_row = (f"each extra row adds about {_num(roof.compute_ms(1))} ms of arithmetic "
               f"({_num(2 * roof.weight_params / 1e6)} MFLOP at {roof.peak_gflops:.0f} GFLOP/s)")
    if ridge < 1:
        return f"The compute line is above the memory line from the first row (ridge {ridge:.2f} rows): {per_row}."
    if ridge > n:
        return (f"The compute line stays under the memory line for all {n} rows measured (the ridge is at "
                f"{ridge:.0f} rows), so every window up to {n} rows is memory-bound here.")
    return (f"The compute line crosses the memory line at the ridge, {ridge:.1f} rows: past it {per_row}, so "
            "speculation stops paying more per extra row.")


def roofline_view(session: Session, info=None) -> tuple[object | None, str]:
    """The figure (None when there is none to draw) and the HTML under it: the session's last run's pair, else the
    pair loaded now (`info`: its pair.PairInfo), both as timed on this machine when that pair loaded."""
    run = next((r for r in reversed(session.history) if r.start is not None), None)
    if run is None and info is None:
        return None, AFTER_A_RUN_HTML
    settings = None if run is None else run.start.settings
    roof, runner = (info.roofline, info.target_runner) if run is None else (settings.roofline, settings.target_runner)
    if roof is None:
        whose = "The loaded pair's target" if run is None else "Your last run's target"
        return None, _note(f"{whose} ({runner}) recorded no roofline: the forward by rows is timed at load only "
                           "where the engine calibrates the target (the fast runners).")
    if run is None:
        gamma = info.resolve(SpecConfig()).gamma if info.draft else None
    else:
        gamma = settings.request.spec.gamma if settings.draft and isinstance(settings.request.spec.gamma, int) else None
    source = ("" if run is not None else
              f"Timed on this machine ({machine.cpu_model()}) when the loaded pair loaded, before any run. ")
    return roofline_figure(roof), _note(source + roofline_sentence(roof, gamma))


def _num(x: float) -> str:
    """A figure with the digits it needs: 270, 12.5, 2.0, 0.0186 (the toy pair's milliseconds and megabytes too)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _note(text: str) -> str:
    return f"<p class='mirror-def' id='mirror-roofline-text'>{html.escape(text)}</p>"


AFTER_A_RUN_HTML = _note(AFTER_A_RUN)  # the view before any run (and the page's first value)
