"""The break-even gauge beside the verdict's first line: for each speculative decoder, the τ its step cost needs
against the τ it got, from the same step means the fold's bars show (ui/costs.py: step_bar).

A speculative step that costs k AR steps breaks even with AR when it commits k tokens (the prefill aside): AR commits
one token per AR step. So the τ needed is the step in AR steps (the decoder's mean step ÷ T_AR, the AR run's mean
one-token step), the τ got is the run's τ, and their gap decides the speedup: τ got ÷ τ needed ≈ the decode speedup.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from .costs import step_bar
from .session import DecoderRun
from .settings import DECODER_TITLES

SPECULATIVE = ("mirror", "sd")  # the gauge's rows, in the page's column order
DEFINITION = ("The gauge: for each speculative decoder, τ needed = its mean verification step ÷ T_AR (the step in AR "
              "steps: at that τ a step commits what AR commits in the same time, the prefill aside; the black mark), "
              "τ got = its τ (the bar); the gap between them is green where it got more, red where it got less; τ "
              "got ÷ τ needed ≈ its decode speedup over AR.")


@dataclass(frozen=True)
class BreakEven:
    """One speculative decoder's step against AR's, as the gauge shows it."""

    decoder: str
    needed: float  # τ that breaks even: the mean step ÷ T_AR (AR steps)
    got: float     # the run's τ (tokens committed per step)

    @property
    def gap(self) -> float:
        """τ got − τ needed: above 0 the steps pay."""
        return self.got - self.needed


def break_even(rep: dict[str, DecoderRun]) -> list[BreakEven]:
    """The gauge's rows for one repeat (none without a timed AR run)."""
    ar = step_bar(rep.get("ar"))
    if ar is None or not ar.step_ms:
        return []
    bars = [b for b in (step_bar(rep.get(d)) for d in SPECULATIVE) if b is not None]
    return [BreakEven(b.decoder, b.step_ms / ar.step_ms, b.tau) for b in bars]


def gauge_html(rows: list[BreakEven]) -> str:
    """Each row a track on one scale: the τ got as a bar, the τ needed as a mark, the gap between them coloured."""
    if not rows:
        return ""
    top = 1.1 * max(max(r.needed, r.got) for r in rows)
    pct = lambda v: f"{100 * v / top:.2f}%"  # noqa: E731
    body = ""
    for r in rows:
        lo, hi = sorted((r.got, r.needed))
        side = "ahead" if r.gap >= 0 else "short"
        said = f"got {r.gap:.2f} more" if r.gap >= 0 else f"short by {-r.gap:.2f}"
        body += (f"<div class='mirror-gauge-row' data-decoder='{r.decoder}' data-needed='{r.needed:.4f}' "
                 f"data-got='{r.got:.4f}'><span>{html.escape(DECODER_TITLES[r.decoder])}</span>"
                 f"<div class='mirror-gauge-track'><i class='mirror-gauge-got' style='width:{pct(lo)}'></i>"
                 f"<i class='mirror-gauge-{side}' style='left:{pct(lo)};width:{pct(hi - lo)}'></i>"
                 f"<b style='left:{pct(r.needed)}' title='τ needed'></b></div>"
                 f"<span>needs τ {r.needed:.2f} · got {r.got:.2f}: <span class='mirror-gauge-{side}-text'>{said}"
                 "</span></span></div>")
    return f"<div class='mirror-gauge' id='mirror-gauge'>{body}</div>"
