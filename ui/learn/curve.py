"""The Learn tab's speedup curve: Mirror-SD's and vanilla SD's speedup over AR against τ and against the window's
cost in AR steps, from the latency model (mirror_core/latency.py through ui/whatif.py: modelled, never timed),
with "you are here" at the what-if's knobs, the 1× line, and the switch "verify ≈ 1 step (an accelerator)": the
accelerator view (whatif.on_accelerator), where the window costs one step and the readout and the draft's branch
batch move with it, which is what turns a CPU's loss into the paper's win, or says which term prevents it.
"""
from __future__ import annotations

import html
import json
from dataclasses import replace

from ..plots import DECODER_COLORS
from ..whatif import ACCELERATOR_KEPT, ACCELERATOR_MODELLED, WhatIf, on_accelerator, ordering, prediction

W, H, LEFT, BOTTOM, TOP = 400, 220, 40, 34, 14  # one panel's drawing units (the SVG scales to the page's width)


def speedups(w: WhatIf) -> tuple[float, float]:
    """(Mirror-SD, vanilla SD) modelled speedup over AR at these knobs."""
    p = prediction(w)
    return p["mirror_x"], p["sd_x"]


def break_even(w: WhatIf) -> float | None:
    """The verify cost (AR steps) up to which Mirror-SD is modelled at least as fast as AR (None: not even at 1)."""
    if speedups(replace(w, verify_ratio=1.0))[0] < 1:
        return None
    lo, hi = 1.0, 16.0
    if speedups(replace(w, verify_ratio=hi))[0] >= 1:
        return hi
    for _ in range(40):  # the speedup falls as the verify cost rises: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedups(replace(w, verify_ratio=mid))[0] >= 1 else (lo, mid)
    return lo


def _panel(title: str, x_label: str, xs: list[float], curves: dict, here: tuple[float, float], top: float) -> str:
    """One SVG panel: each curve (name → (colour, ys, dashed)), the 1× line, and "you are here" (x, y)."""
    x0, x1 = xs[0], xs[-1]
    px = lambda x: LEFT + (x - x0) / ((x1 - x0) or 1) * (W - LEFT - 10)  # noqa: E731
    py = lambda y: H - BOTTOM - min(y, top) / top * (H - BOTTOM - TOP)  # noqa: E731
    parts = [f"<text x='{LEFT}' y='10' font-size='12' font-weight='bold'>{html.escape(title)}</text>",
             f"<line x1='{LEFT}' x2='{W - 10}' y1='{py(0):.1f}' y2='{py(0):.1f}' stroke='#9ca3af'/>",
             f"<line x1='{LEFT}' x2='{W - 10}' y1='{py(1):.1f}' y2='{py(1):.1f}' stroke='#6b7280' "
             f"stroke-dasharray='2,3'/><text x='4' y='{py(1) + 4:.1f}' font-size='11'>1× AR</text>",
             f"<text x='4' y='{py(top) + 8:.1f}' font-size='11'>{top:.1f}×</text>",
             f"<text x='{LEFT}' y='{H - 4}' font-size='11'>{html.escape(x_label)}</text>"]
    for x in (x0, (x0 + x1) / 2, x1):
        parts.append(f"<text x='{px(x) - 8:.1f}' y='{H - BOTTOM + 14}' font-size='11'>{x:.3g}</text>")
    for name, (colour, ys, dashed) in curves.items():
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        dash = " stroke-dasharray='5,4'" if dashed else ""
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2'{dash} points='{points}'><title>"
                     f"{html.escape(name)}</title></polyline>")
    hx, hy = here
    parts.append(f"<circle cx='{px(hx):.1f}' cy='{py(hy):.1f}' r='5' fill='#111'><title>you are here: "
                 f"{hy:.2f}× at {hx:.2f}</title></circle><text x='{px(hx) + 7:.1f}' y='{py(hy) - 6:.1f}' "
                 "font-size='11'>you are here</text>")
    return (f"<svg viewBox='0 0 {W} {H}' width='100%' style='max-width:{W}px;height:auto' role='img' "
            f"aria-label='{html.escape(title)}'>{''.join(parts)}</svg>")


def curve_data(w: WhatIf, accelerator: bool) -> dict:
    """The two curves' points (modelled speedups) and where "you are here" sits, at the knobs or with verify = 1."""
    at = on_accelerator(w) if accelerator else w
    taus = [1 + i * w.gamma / 20 for i in range(21)]  # τ runs from 1 (nothing accepted) to γ + 1 (all accepted)
    lo, hi = min(1.0, w.verify_ratio), max(4.0, 1.2 * w.verify_ratio)  # 1 step (an accelerator) to past the knob's
    costs = [lo + i * (hi - lo) / 20 for i in range(21)]
    return {"accelerator": accelerator, "tau": taus, "verify": costs,
            "by_tau": {d: [speedups(replace(at, tau=t))[i] for t in taus] for i, d in enumerate(("mirror", "sd"))},
            "by_verify": {d: [speedups(replace(at, verify_ratio=v))[i] for v in costs]
                          for i, d in enumerate(("mirror", "sd"))},
            "here": {"tau": at.tau, "verify": at.verify_ratio, "mirror": speedups(at)[0], "sd": speedups(at)[1]}}


def curve_html(w: WhatIf, accelerator: bool = False) -> str:
    """Both panels, the sentence that reads them, and the data as JSON (for tests and anyone reading the page)."""
    d = curve_data(w, accelerator)
    here = d["here"]
    top = max(2.0, 1.15 * max(max(v) for v in (*d["by_tau"].values(), *d["by_verify"].values())))
    colour = lambda k: DECODER_COLORS[k]  # noqa: E731
    by_tau = {f"{'Mirror-SD' if k == 'mirror' else 'vanilla SD'}": (colour(k), ys, k == "sd")
              for k, ys in d["by_tau"].items()}
    by_verify = {f"{'Mirror-SD' if k == 'mirror' else 'vanilla SD'}": (colour(k), ys, k == "sd")
                 for k, ys in d["by_verify"].items()}
    cost = "on an accelerator (modelled)" if accelerator else f"window {w.verify_ratio:.2f} steps"
    panels = (_panel(f"Speedup against τ, {cost}", "τ: tokens per step", d["tau"], by_tau,
                     (here["tau"], here["mirror"]), top)
              + _panel(f"Speedup against the window's cost, τ {w.tau:.2f}", "window γ+1 ÷ T_AR (AR steps)",
                       d["verify"], by_verify, (here["verify"], here["mirror"]), top))
    return (f"<div class='mirror-curve'>{panels}</div>"
            f"<p class='mirror-plot-legend'><span><i class='line' style='--c:{colour('mirror')}'></i>Mirror-SD</span>"
            f"<span><i class='line' style='--c:{colour('sd')}'></i>vanilla SD (dashed)</span>"
            "<span>● you are here · dotted: 1× AR · all modelled</span></p>"
            f"<p class='mirror-def' id='mirror-curve-text'>{html.escape(curve_sentence(w, accelerator))}</p>"
            f"<div hidden id='mirror-curve-data' data-curve='{html.escape(json.dumps(d))}'></div>")


def curve_sentence(w: WhatIf, accelerator: bool) -> str:
    """What the curves say at the knobs, and what the accelerator view changes (modelled), with the ordering of
    Mirror-SD and vanilla SD there and the term that decides it."""
    mirror, sd = speedups(w)
    fast = on_accelerator(w)
    even = break_even(w)
    line = (f"Modelled: at τ = {w.tau:.2f} and a window of {w.verify_ratio:.2f} AR steps Mirror-SD runs at "
            f"{mirror:.2f}× AR (vanilla SD {sd:.2f}×); each step commits τ tokens for the cost of "
            f"{w.verify_ratio:.2f} steps plus what the readout and the draft add. ")
    line += (f"On an accelerator (modelled: {ACCELERATOR_MODELLED}; kept as the knobs give them: {ACCELERATOR_KEPT}) "
             f"the same knobs give {speedups(fast)[0]:.2f}× (vanilla SD {speedups(fast)[1]:.2f}×). {ordering(fast)} ")
    line += (f"Mirror-SD beats AR while the window costs at most {even:.2f} steps." if even is not None else
             "Even at 1 step it stays under 1×: τ or the draft's cost must change too.")
    return line + (" Shown: the accelerator case." if accelerator else "")
