"""The live plots' feed: engine events → short text records that the browser draws (ui/live_plots.js).

The page does not receive figures. It receives one append-only text, a line per record, and draws the four
plots itself on canvases (ui/live_plots.js paints only the new marks). Between two page updates the feed
only grows at its end, so each update carries only the new lines (ui/views.py, Deltas): bytes per comparison
grow linearly with the tokens, and the server's and the page's work per update is proportional to the new
events only (the server shares the process, and the GIL, with the target lane). Every number in the feed comes
from the engine's events: times are milliseconds since the run's RunStart.t0 on the engine's clock.

Records (space-separated fields; no field contains a space except the last field of E):
    R <comparison> <decoder>...          a comparison starts with these decoders (columns), in run order
    B <decoder> <gamma> <target devices> <draft device>   a decoder's run starts, and where its lanes run
                                         (target devices: one, or a spread target's joined by '+')
    T <decoder> <t_ms>                   one committed token (race)
    S <decoder> <step> <drafted> <accepted> <committed> <from_branch 0|1> <hit 1|0|->   one verification step
    P <decoder> <lane> <stage> <t0_ms> <t1_ms> <step>                                  one busy span
    E <decoder> <legend text>            the run ended; the race legend's name for it (with its speedup)
    C <t_ms | ->                         the replay's time cursor on the race and the lane timeline (- hides it)
"""
from __future__ import annotations

import json

from mirror_core import RunStart, SpanEvent, StepRecord, TokenEvent

from .render import AppendOnly
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
# Step t's marker says whether its correction c was among the early-exit candidates: that decides step t + 1's
# window (a reused branch, cyan bar, or a fresh rollout), not step t's own bar.
HIT_MARKS = ((True, "hit at t: c ∈ TopK, window t+1 is a reused branch", "circle", "#0891b2"),
             (False, "miss at t: window t+1 rolled out afresh", "x", "#b91c1c"))
STEP_SERIES = (("accepted (window from reused branch)", "#06b6d4"), ("accepted (fresh window)", "#22c55e"),
               ("correction / bonus", "#f97316"))


def config_json() -> str:
    """Everything the browser needs besides the feed: names, colours, legends (one source: this module)."""
    return json.dumps({"titles": DECODER_TITLES, "short": SHORT_NAMES, "colors": DECODER_COLORS,
                       "stages": [[k, name, color] for k, (name, color) in STAGE_STYLE.items()],
                       "hits": [[name, symbol, color] for _, name, symbol, color in HIT_MARKS],
                       "series": [list(s) for s in STEP_SERIES]}, ensure_ascii=False)


def _ms(t: float, t0: float) -> str:
    return f"{(t - t0) * 1e3:.3f}"


def reset_line(comparison: int, decoders: list[str]) -> str:
    return f"R {comparison} {' '.join(decoders)}\n"


def event_line(decoder: str, t0: float, event) -> str:
    """The record for one engine event ('' for events the plots do not draw)."""
    if isinstance(event, TokenEvent):
        return f"T {decoder} {_ms(event.t, t0)}\n"
    if isinstance(event, SpanEvent):
        return f"P {decoder} {event.lane} {event.stage} {_ms(event.t0, t0)} {_ms(event.t1, t0)} {event.step}\n"
    if isinstance(event, StepRecord):
        hit = "-" if event.hit is None else int(event.hit)
        return (f"S {decoder} {event.step} {event.drafted} {event.accepted} {event.committed} "
                f"{int(event.from_branch)} {hit}\n")
    if isinstance(event, RunStart):
        lanes = event.settings.lanes
        target = "+".join(lanes.target_devices) if lanes.target_devices else lanes.target_device
        return f"B {decoder} {event.settings.request.spec.gamma} {target} {lanes.draft_device}\n"
    return ""


def cursor_line(t_s: float | None) -> str:
    """The replay's time cursor at t_s seconds since the runs' starts (None: hidden)."""
    return "C -\n" if t_s is None else f"C {t_s * 1e3:.1f}\n"


def end_line(decoder: str, speedup: tuple[float | None, str]) -> str:
    name = DECODER_TITLES[decoder]
    value, kind = speedup
    if value is not None and decoder != "ar":
        name += f" · {value:.2f}× vs AR ({kind})"
    return f"E {decoder} {name}\n"


class Feed(AppendOnly):
    """The comparison's records, in arrival order; text() is the feed the page receives (append-only)."""

    def __init__(self, comparison: int = 0, decoders: list[str] | None = None) -> None:
        super().__init__()
        if decoders:
            self.add(reset_line(comparison, decoders))
