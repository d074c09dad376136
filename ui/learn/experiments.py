"""The Learn tab's experiments: small sweeps on the pair and prompt of the visitor's last run, each plotting what
was measured next to what the latency model predicts from the same runs (labelled modelled), with a question.

Every point is a real engine run (token ids in, events out): speedups are wall-time ratios against `ar` on the same
prompt (equal outputs, so equally long), τ / α / hit rate / fallback frequency come from the run's summary, and the
modelled speedup is mirror_core.latency's τ·T_AR/E[T_step] from that run's spans.
"""
from __future__ import annotations

import html
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace

from mirror_core import MirrorError, Request, SpecConfig
from mirror_core.events import STAGE_TARGET_STEP, RunEnd, SpanEvent, StepRecord
from mirror_core.latency import latency_model_from_events, stage_mean

NEW_TOKENS = 48


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    question: str          # what to answer from the plot
    look_for: str          # what the plot shows, in one line
    axis: str              # "gamma", "kappa", "exit_layer" or "prompt"
    values: tuple          # the axis' values (prompts: texts; exit layers: fractions (num, den) of the target's N)
    decoders: tuple[str, ...]
    series: tuple[str, ...]  # which measurements the plot draws


EXPERIMENTS = {
    "gamma": Experiment(
        "gamma", "Speedup and τ against γ (which γ?)",
        "At which γ does vanilla SD stop gaining, and does Mirror-SD?",
        "Each point is a run of the last prompt at that γ; dashed: the latency model's prediction for Mirror-SD. "
        "If the τ line is flat beyond γ = 1, the draft rarely gets its first token right: d2 counts only when d1 was "
        "accepted, so τ(γ) = 1 + a_1 + a_1·a_2 + … stays near 1 + a_1, and a longer window adds verification time "
        "and nothing else.",
        "gamma", (1, 2, 4, 6, 8), ("sd", "mirror"), ("speedup sd", "speedup mirror", "modelled mirror", "τ mirror")),
    "kappa": Experiment(
        "kappa", "Hit rate and fallback frequency against κ",
        "How many candidates per slot does it take before most steps reuse a branch?",
        "More candidates per slot: more corrections are among them (hits), fewer fresh rollouts (fallbacks).",
        "kappa", (1, 2, 4, 8), ("mirror",), ("hit rate", "fallback frequency", "speedup mirror", "modelled mirror")),
    "exit": Experiment(
        "exit", "Hit rate and fallback frequency against the exit layer ℓ_e",
        "Does an earlier exit (more time for the branches) cost hits, and where is the balance?",
        "An earlier ℓ_e leaves a longer suffix to hide the branch rollouts in, but its top-κ guesses the target's "
        "final token less often (a trained exit head, if the draft ships one, is used only at its own layer).",
        "exit_layer", ((1, 4), (1, 2), (2, 3), (3, 4)), ("mirror",), ("hit rate", "fallback frequency", "speedup mirror", "modelled mirror")),
    "prompts": Experiment(
        "prompts", "Acceptance on a predictable and a creative prompt",
        "Which prompt lets the draft run ahead, and what does that do to τ and the speedup?",
        "The same decoder and settings on two prompts chosen to differ: a list the draft can predict, and a poem.",
        "prompt", ("List the numbers from 1 to 30, separated by commas.", "Write a short poem about a lighthouse."),
        ("mirror",), ("acceptance α", "τ mirror", "speedup mirror", "modelled mirror")),
}


@dataclass(frozen=True)
class Point:
    x: str            # the axis value, as shown
    values: dict      # series name → number (None: not measured)


def _run(engine, request: Request, stop) -> tuple[RunEnd, list[SpanEvent], list[StepRecord]]:
    spans, steps, end = [], [], None
    for event in engine.stream(request, stop):
        if isinstance(event, SpanEvent):
            spans.append(event)
        elif isinstance(event, StepRecord):
            steps.append(event)
        elif isinstance(event, RunEnd):
            end = event
    return end, spans, steps


def run_experiment(engine, exp: Experiment, prompt_ids: tuple[int, ...], spec: SpecConfig, stop,
                   encode=None) -> Iterator[tuple[int, int, list[Point]]]:
    """Yields (runs done, runs in all, points so far) after every run; the last yield has every point."""
    prompts = ([encode(p) for p in exp.values] if exp.axis == "prompt" else [prompt_ids])
    axis_values = exp.values
    why = refusal(exp, engine.info.draft_features)
    if why:
        raise MirrorError(why)
    if exp.axis == "exit_layer":  # fractions of this target's depth; two that round to one layer run once
        axis_values = tuple(dict.fromkeys(exit_layer(v, engine.info.num_layers) for v in exp.values))
    total = len(axis_values) * len(exp.decoders) + len(prompts)
    done, points, ar_cache = 0, [], {}
    for value in axis_values:
        ids = encode(value) if exp.axis == "prompt" else prompt_ids
        if ids not in ar_cache:  # the baseline of this prompt: one ar run
            end, spans, _ = _run(engine, Request(ids, "ar", NEW_TOKENS), stop)
            ar_cache[ids] = (end.summary.wall_s, stage_mean(spans, (STAGE_TARGET_STEP,)) or None)
            done += 1
            yield done, total, list(points)
        ar_wall, t_ar = ar_cache[ids]
        s = replace(spec, **({exp.axis: value} if exp.axis in ("gamma", "kappa", "exit_layer") else {}))
        values = {}
        for decoder in exp.decoders:
            end, spans, steps = _run(engine, Request(ids, decoder, NEW_TOKENS, spec=s), stop)
            summary = end.summary
            speed = ar_wall / summary.wall_s if summary.wall_s else None
            values[f"speedup {decoder}"] = speed
            if decoder == "mirror":
                model = latency_model_from_events(spans, steps, summary, t_ar)
                values.update({"modelled mirror": None if model is None else model.speedup, "τ mirror": summary.tau,
                               "hit rate": summary.hit_rate, "fallback frequency": summary.fallback_frequency,
                               "acceptance α": summary.acceptance_rate})
            done += 1
            yield done, total, points + [Point(_label(exp, value), dict(values))]
        points.append(Point(_label(exp, value), values))
    yield done, total, points


def refusal(exp: Experiment, draft_features: int | None) -> str:
    """Why this pair cannot run the experiment ("" when it can): a feature-reading draft reads one layer, so ℓ_e
    cannot move."""
    if exp.axis == "exit_layer" and draft_features is not None:
        return (f"Not for this pair: its draft reads the target's hidden states after layer {draft_features}, so ℓ_e "
                "is fixed there. Choose a toy pair on the Run tab (its drafts read token ids only) and run it once to "
                "sweep the exit layer.")
    return ""


def sweep_verdict(exp: Experiment, points: list[Point], spec: SpecConfig, chosen: bool) -> str:
    """After a γ or κ sweep: whether a swept value measured faster than the one the run used (the latency model's
    choice for this machine when `chosen`); one run per value, so within 5 % is called a tie."""
    if exp.axis not in ("gamma", "kappa"):
        return ""
    used = _label(exp, getattr(spec, exp.axis))
    measured = {p.x: p.values.get("speedup mirror") for p in points if p.values.get("speedup mirror")}
    if not measured:
        return ""
    whose = (f"{used} (the run's, chosen for this machine at load by the latency model)" if chosen else
             f"the run's {used}")
    if used not in measured:
        return f"{whose[0].upper()}{whose[1:]} is not among the swept values."
    best = max(measured, key=measured.get)
    if best != used and measured[best] > 1.05 * measured[used]:
        return (f"This sweep measured a better setting: {best} at {measured[best]:.3f}× AR against {whose} at "
                f"{measured[used]:.3f}× (one {NEW_TOKENS}-token run each).")
    return (f"{whose[0].upper()}{whose[1:]} measured {measured[used]:.3f}× AR, within 5 % of the best swept value "
            f"({best}, {measured[best]:.3f}×).")


def exit_layer(fraction: tuple[int, int], num_layers: int) -> int:
    """The layer at this fraction of the target's depth N, kept inside 1..N-1 (an exit needs a suffix after it)."""
    num, den = fraction
    return min(max(1, round(num_layers * num / den)), max(1, num_layers - 1))


def _label(exp: Experiment, value) -> str:
    if exp.axis == "prompt":
        return "predictable" if value == exp.values[0] else "creative"
    if exp.axis == "exit_layer":
        return f"ℓ_e = {value}" if isinstance(value, int) else f"ℓ_e = {'' if value[0] == 1 else value[0]}N/{value[1]}"
    return f"{'γ' if exp.axis == 'gamma' else 'κ'} = {value}"


# one colour per quantity, the page's decoder colours for speedups (ui/plots.py); the modelled line is dashed in its
# decoder's colour
COLOURS = {"speedup sd": "#3b82f6", "speedup mirror": "#ef4444", "modelled mirror": "#ef4444", "τ mirror": "#10b981",
           "hit rate": "#0891b2", "fallback frequency": "#a855f7", "acceptance α": "#f97316"}


def plot_html(exp: Experiment, points: list[Point], status: str = "") -> str:
    """An SVG chart of the series over the axis (numbers on hover and in a table), the data as JSON for tests."""
    data = [{"x": p.x, **{k: p.values.get(k) for k in exp.series}} for p in points]
    found = [v for p in points for k in exp.series if (v := p.values.get(k)) is not None]
    head = (f"<p><b>{html.escape(exp.title)}</b>. {html.escape(exp.look_for)}</p>"
            f"<p><b>Question:</b> {html.escape(exp.question)}</p>")
    if not found:
        return head + f"<p><i>{html.escape(status or 'Press Run experiment.')}</i></p>"
    w, h, left, bottom = 560, 220, 40, 30
    top = max(max(found) * 1.15, 1.0)
    n = max(len(exp.values), 2)
    x = lambda i: left + 20 + i * (w - left - 40) / (n - 1)  # noqa: E731
    y = lambda v: h - bottom - v / top * (h - bottom - 10)  # noqa: E731
    parts = [f"<line x1='{left}' x2='{w}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#9ca3af'/>",
             f"<text x='4' y='{y(top) + 10:.1f}' font-size='11'>{top:.2f}</text><text x='4' y='{y(0):.1f}' "
             "font-size='11'>0</text>"]
    if any("speedup" in k or "modelled" in k for k in exp.series):
        parts.append(f"<line x1='{left}' x2='{w}' y1='{y(1):.1f}' y2='{y(1):.1f}' stroke='#d1d5db' "
                     "stroke-dasharray='2,3'/><text x='{0}' y='{1:.1f}' font-size='10' fill='#6b7280'>1× (ar)</text>"
                     .format(w - 40, y(1) - 3))
    for i, value in enumerate(exp.values):
        parts.append(f"<text x='{x(i) - 20:.1f}' y='{h - 8}' font-size='11'>{html.escape(points[i].x if i < len(points) else _label(exp, value))}</text>")
    legend = []
    for name in exp.series:
        colour, dashed = COLOURS.get(name, "#6b7280"), "modelled" in name
        pts = [(x(i), y(p.values[name])) for i, p in enumerate(points) if p.values.get(name) is not None]
        if len(pts) > 1:
            parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2'"
                         + (" stroke-dasharray='5,4'" if dashed else "")
                         + " points='" + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + "'/>")
        for (a, b), p in zip(pts, [p for p in points if p.values.get(name) is not None]):
            parts.append(f"<circle cx='{a:.1f}' cy='{b:.1f}' r='3.5' fill='{colour}'><title>{html.escape(name)} at "
                         f"{html.escape(p.x)}: {p.values[name]:.3f}</title></circle>")
        legend.append(f"<span style='color:{colour}'>{'- -' if dashed else '●'} {html.escape(name)}"
                      f"{' (modelled)' if dashed else ''}</span>")
    table = ("<table class='mirror-table'><tr><th></th>" + "".join(f"<th>{html.escape(s)}</th>" for s in exp.series)
             + "</tr>" + "".join("<tr><th>" + html.escape(p.x) + "</th>" + "".join(
                 f"<td>{'—' if p.values.get(s) is None else f'{p.values[s]:.3f}'}</td>" for s in exp.series) + "</tr>"
                 for p in points) + "</table>")
    return (head + (f"<p class='mirror-def'>{html.escape(status)}</p>" if status else "")
            + f"<svg width='{w}' height='{h}' role='img' aria-label='experiment plot'>{''.join(parts)}</svg>"
            + f"<p>{' · '.join(legend)}</p>{table}"
            + f"<div hidden id='mirror-experiment-data' data-points='{html.escape(json.dumps(data))}'></div>")
