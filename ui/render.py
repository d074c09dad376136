"""Committed tokens → the primary stream view of each decoder (prompt greyed, tokens coloured by origin, rejected
drafts struck through; the page wraps it in a monospace, height-capped box), and the plain copyable text.

The stream is built **append-only** as events arrive (StreamHTML), so that between two page updates its HTML
only grows at the end: the Run tab sends each update as only what grew (ui/views.py, Deltas), the page appends it
(ui/tokens.js), and the bytes and the page's work per comparison grow linearly with the tokens (BENCHMARKS.md's history,
"The page's cost").
"""
from __future__ import annotations

import html
import os

from mirror_core import TokenEvent


def asset(name: str) -> str:
    """A file of the page beside these modules (CSS, JS): plain files, so editors and linters read them as such."""
    with open(os.path.join(os.path.dirname(__file__), name), encoding="utf-8") as f:
        return f.read()


# A committed token's origin, as the stream's colours and tooltips name it.
LABEL_TARGET = "target"
LABEL_ACCEPTED = "accepted draft"
LABEL_REUSED = "accepted · reused branch"
LABEL_CONTEXT = "accepted · copied from context"
LABEL_CORRECTION = "correction"
LABEL_BONUS = "bonus"
_ORIGIN_LABELS = {"target": LABEL_TARGET, "accepted": LABEL_ACCEPTED, "correction": LABEL_CORRECTION,
                  "bonus": LABEL_BONUS}

COLOR_MAP = {
    LABEL_ACCEPTED: "#22c55e",    # green: a draft token the target accepted
    LABEL_REUSED: "#06b6d4",      # cyan: accepted, from a branch precomputed during the previous step
    LABEL_CONTEXT: "#eab308",     # yellow: accepted, from a context window (copied from the prompt or the output)
    LABEL_CORRECTION: "#f97316",  # orange: the target's token at the first rejected slot
    LABEL_BONUS: "#a855f7",       # purple: the target's extra token after a fully accepted window
    LABEL_TARGET: "#94a3b8",      # grey: the target alone (prefill token, AR steps, target-only fallback)
}


def token_label(event: TokenEvent) -> str:
    if event.origin == "accepted" and event.from_context:
        return LABEL_CONTEXT
    if event.origin == "accepted" and event.from_branch:
        return LABEL_REUSED
    return _ORIGIN_LABELS.get(event.origin, event.origin)


def _token_span(text: str, label: str, step: int, special: bool = False) -> str:
    """One committed token; data-step: the verification step that committed it (a click opens it in the inspector).
    A special token (e.g. the end of a chat turn) is marked as such: it is not part of the copyable text."""
    if not text:
        return ""  # a token still waiting for the rest of a UTF-8 character
    note = " · a special token: not part of the text" if special else ""
    return (f'<span class="mirror-tok{" mirror-special" if special else ""}" title="{label} · step {step}{note}" '
            f'data-step="{step}" style="background:{COLOR_MAP.get(label, "#e5e7eb")}55">{html.escape(text)}</span>')


class AppendOnly:
    """Text built from parts that only ever grow at the end; text() joins only the parts added since the last
    call (O(new) work per page update). The stream's HTML and the plots' feed are both built this way."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._joined, self._n = "", 0

    def add(self, part: str) -> None:
        if part:
            self.parts.append(part)

    def text(self) -> str:
        if self._n != len(self.parts):
            self._joined += "".join(self.parts[self._n:])
            self._n = len(self.parts)
        return self._joined


class StreamHTML(AppendOnly):
    """One decoder's stream as a list of HTML parts that only ever grows at the end.

    A step's rejected drafts are shown struck through *before* its correction, but the engine reports them
    after the step's tokens; so the newest token's part is held back until the next event shows whether
    rejected drafts go in front of it. `marks[i]` = parts emitted once token i was (for replay).
    """

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[int] = []
        self._held: tuple[str, str, int, bool] | None = None  # (text, label, step, special) of the newest token

    def token(self, text: str, label: str, step: int, special: bool = False) -> None:
        self.release()
        self._held = (text, label, step, special)

    def rejected(self, struck: str, step: int, first_slot: int) -> None:
        self.parts.append(f'<del class="mirror-rejected" title="rejected at step {step}, slot {first_slot}">'
                          f'{html.escape(struck)}</del>')
        self.release()

    def release(self) -> None:
        """Emit the held token (any event other than a RejectedEvent: no struck drafts go before it)."""
        if self._held is not None:
            self.parts.append(_token_span(*self._held))
            self.marks.append(len(self.parts))
            self._held = None

    def finish(self, rest: str, label: str, step: int) -> None:
        """The run ended: emit the held token, with the decoder's last bytes (a completed character) if any."""
        if self._held is not None:
            text, held_label, held_step, held_special = self._held
            self._held = (text + rest, held_label, held_step, held_special)
            self.release()
        elif rest:
            self.parts.append(_token_span(rest, label, step))
            if self.marks:
                self.marks[-1] = len(self.parts)

    def html(self, upto: int | None = None) -> str:
        """The parts of every emitted token, or of the first `upto` tokens (replay)."""
        if upto is not None and upto <= len(self.marks):
            return "".join(self.parts[: self.marks[upto - 1]]) if upto > 0 else ""
        return self.text()


# The "Hide rejected drafts" checkbox: a class on the page that page.css uses to hide the struck-through drafts (the
# streams keep them, so unticking shows them again; no server round trip).
HIDE_REJECTED_JS = "(hide) => { document.body.classList.toggle('mirror-hide-rejected', !!hide); return []; }"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shown_path(source: str | None, root: str = REPO_ROOT, home: str | None = None) -> str:
    """A model source as the page shows it: a hub id as it is; a folder relative to the repository, or to the home
    folder as ~/…, or else its last two parts after …/ (the page never shows the server's absolute paths)."""
    if not source or not os.path.isabs(source):
        return source or ""
    home = home if home is not None else os.path.expanduser("~")
    path = os.path.normpath(source)
    for base, prefix in ((root, ""), (home, "~/")):
        if base and base != os.sep and (path == base or path.startswith(base.rstrip(os.sep) + os.sep)):
            rel = os.path.relpath(path, base)
            return prefix + rel if rel != "." else (prefix.rstrip("/") or ".")
    return "…/" + "/".join(path.strip(os.sep).split(os.sep)[-2:])


def legend_html() -> str:
    chips = "".join(f'<span class="mirror-chip" style="background:{c}55">{html.escape(k)}</span>'
                    for k, c in COLOR_MAP.items())
    return f'<div class="mirror-legend">{chips}<del class="mirror-rejected">rejected draft</del></div>'


def drafts(n: int) -> str:
    """The draft tokens d1..dn of a window, as every view names them ('d1' alone for one)."""
    return "d1" if n == 1 else f"d1..d{n}"


def count(n: int, noun: str) -> str:
    """'1 token', '3 tokens': a count with its noun in the number it needs."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
