"""Committed tokens → the primary HTML stream view (prompt greyed, tokens coloured by origin, rejected drafts struck
through, monospace, height capped), the (text, label) pieces it is made of, and the plain copyable text."""
from __future__ import annotations

import html

from .session import LABEL_ACCEPTED, LABEL_BONUS, LABEL_CORRECTION, LABEL_REUSED, LABEL_TARGET, DecoderRun

COLOR_MAP = {
    LABEL_ACCEPTED: "#22c55e",    # green: a draft token the target accepted
    LABEL_REUSED: "#06b6d4",      # cyan: accepted, from a branch precomputed during the previous step
    LABEL_CORRECTION: "#f97316",  # orange: the target's token at the first rejected slot
    LABEL_BONUS: "#a855f7",       # purple: the target's extra token after a fully accepted window
    LABEL_TARGET: "#94a3b8",      # grey: the target alone (prefill token, AR steps, target-only fallback)
}


def highlighted(run: DecoderRun | None, upto: int | None = None) -> list[tuple[str, str]]:
    """(text, label) per committed token; tokens still waiting for the rest of a UTF-8 character are skipped."""
    if run is None:
        return []
    pieces = run.pieces if upto is None else run.pieces[:upto]
    return [(text, label) for text, label in pieces if text]


def plain_text(run: DecoderRun | None, upto: int | None = None) -> str:
    """The committed text only (what a user copies); rejected drafts are never part of it."""
    if run is None:
        return ""
    pieces = run.pieces if upto is None else run.pieces[:upto]
    return "".join(text for text, _ in pieces)


def stream_html(run: DecoderRun | None, upto: int | None = None, prompt: str = "") -> str:
    """One decoder's stream: the prompt greyed, then the committed text coloured by origin (one span per token,
    class mirror-tok), each step's rejected drafts struck through before its correction."""
    if run is None:
        return ""
    n = len(run.pieces) if upto is None else min(upto, len(run.pieces))
    before: dict[int, list] = {}
    count = 0
    for index, event in run.rejected:
        if index < n:
            before.setdefault(index, []).append(event)
            count += len(event.token_ids)
    parts = [f'<span class="mirror-prompt" title="prompt">{html.escape(prompt)}</span>'] if prompt else []
    for i in range(n):
        for event in before.get(i, ()):
            struck = "".join(html.escape(run.namer.text(t)) for t in event.token_ids)
            parts.append(f'<del class="mirror-rejected" title="rejected at step {event.step}, '
                         f'slot {event.first_slot}">{struck}</del>')
        text, label = run.pieces[i]
        if text:
            parts.append(f'<span class="mirror-tok" title="{label}" style="background:{COLOR_MAP.get(label, "#e5e7eb")}55">'
                         f'{html.escape(text)}</span>')
    footer = f'<div class="mirror-rejected-count">{count} rejected draft token(s), struck through</div>'
    return '<div class="mirror-tokens">' + "".join(parts) + "</div>" + footer


def legend_html() -> str:
    chips = "".join(f'<span class="mirror-chip" style="background:{c}55">{html.escape(k)}</span>'
                    for k, c in COLOR_MAP.items())
    return f'<div class="mirror-legend">{chips}<del class="mirror-rejected">rejected draft</del></div>'
