"""Per-user state (kept in gr.State): the events of the last comparison, decoded incrementally per decoder."""
from __future__ import annotations

import contextlib
import html
import json
import os
import threading
from dataclasses import dataclass, field

from mirror_core import RejectedEvent, RunEnd, RunStart, SpanEvent, StepRecord, TokenEvent
from mirror_core.metrics import RunSummary
from mirror_core.models.textstream import IncrementalText

from .plots import Feed, event_line
from .render import StreamHTML, token_label


class TokenNamer:
    """One token id → its text (`text`) or a visible, escaped form for tables (`show`); ids when no tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"{token_id} "
        if token_id not in self._cache:
            self._cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._cache[token_id]

    def show(self, token_id: int) -> str:
        if token_id < 0:
            return "—"
        if self.tokenizer is None:
            return f"#{token_id}"
        return json.dumps(self.text(token_id), ensure_ascii=False)[1:-1].replace(" ", "␣") or "∅"


@dataclass
class DecoderRun:
    """Everything one decoder's stream produced, plus its committed text split per token."""

    decoder: str
    namer: TokenNamer
    start: RunStart | None = None
    tokens: list[TokenEvent] = field(default_factory=list)
    pieces: list[tuple[str, str]] = field(default_factory=list)          # (text, label) per committed token
    rejected: list[tuple[int, RejectedEvent]] = field(default_factory=list)  # (index of the token it precedes, event)
    spans: list[SpanEvent] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    end: RunEnd | None = None
    others: float | None = None  # cores' worth of CPU other processes used while this run was timed (the noise meter)
    events: list = field(default_factory=list)
    view: StreamHTML = field(default_factory=StreamHTML)  # the stream's HTML, append-only (stream_html below)

    def __post_init__(self) -> None:
        tok = self.namer.tokenizer
        self._text = IncrementalText(tok) if tok is not None else None
        # the tokenizer's special tokens (e.g. <|im_end|>, which ends a chat turn): committed tokens like any other,
        # shown in the stream, but not part of the copyable text
        self._special = frozenset(getattr(tok, "all_special_ids", None) or ())
        self.special_at: set[int] = set()  # indices into pieces/tokens of special tokens
        self.committed_text = ""  # every committed piece but the special tokens, in order (what plain_text returns)

    def add(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TokenEvent):
            piece = self._text.push(event.token_id) if self._text else f"{event.token_id} "
            label = token_label(event)
            special = event.token_id in self._special
            if special:
                self.special_at.add(len(self.pieces))
            else:
                self.committed_text += piece
            self.tokens.append(event)
            self.pieces.append((piece, label))
            self.view.token(piece, label, event.step, special)
        elif isinstance(event, RejectedEvent):
            # The step's correction is its last committed token; the rejected drafts were in its place.
            self.rejected.append((max(0, len(self.tokens) - 1), event))
            self.view.rejected("".join(self.namer.text(t) for t in event.token_ids), event.step, event.first_slot)
        elif isinstance(event, SpanEvent):
            self.spans.append(event)
            self.view.release()
        elif isinstance(event, StepRecord):
            self.steps.append(event)
            self.view.release()
        elif isinstance(event, RunStart):
            self.start = event
        elif isinstance(event, RunEnd):
            self.end = event
            rest = self._text.flush() if self._text else ""
            if rest and self.pieces:
                text, label = self.pieces[-1]
                self.pieces[-1] = (text + rest, label)
                self.committed_text += rest
            self.view.finish(rest, self.pieces[-1][1] if self.pieces else "", self.tokens[-1].step if self.tokens else 0)

    @property
    def t0(self) -> float:
        return self.start.t0 if self.start else 0.0

    @property
    def gamma(self) -> int:
        if self.start is not None:
            return self.start.settings.request.spec.gamma
        return max((s.drafted for s in self.steps), default=1)

    def token_times(self) -> list[float]:
        """Commit time of each token in seconds since this run's start (the engine's clock)."""
        return [e.t - self.t0 for e in self.tokens]

    def count_until(self, seconds: float) -> int:
        """How many tokens had been committed `seconds` after the start (for replay)."""
        return sum(1 for t in self.token_times() if t <= seconds)

    @property
    def summary(self) -> RunSummary | None:
        """The engine's run summary (None until the run ends)."""
        return self.end.summary if self.end else None


class Session:
    """One visitor's state: the last comparison, its stop flag, and whether a run is in flight."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.replay_stop = threading.Event()
        self.skipped = False                 # Stop came between two decoders: the rest did not run
        self.load_stopped = False            # Stop came while the comparison's pair was loading
        self.idle = threading.Event()
        self.idle.set()
        self.runs: dict[str, DecoderRun] = {}   # what the page shows: each decoder's latest run while a comparison
                                                # runs, then the repeat its verdict reads (show)
        self.history: list[DecoderRun] = []     # every run of the comparison, all repeats, in run order
        self.feed = Feed()                      # the plots' records of the runs shown (ui/plots.py; built by show)
        self.live_plots = True               # the comparison ends with its runs replayed at their measured pace
        self.planned_repeats = 0             # repeats the comparison asked for (fewer timed: its verdict is provisional)
        self.pair_info = None                # the comparison's pair as its load timed it (pair.PairInfo)
        self.earlier = False                 # the runs shown are an earlier comparison's: the last Run ended (an error,
                                             # a stop during the load) before it cleared them
        self.status = ""
        self.error: str | None = None
        self.trace_path: str | None = None
        self.prompt = ""                     # the last comparison's prompt text (written into its trace)
        self.generation = 0                  # which comparison owns the state (a closing one must not touch a newer one)
        self.experiments: dict = {}          # Learn tab: (experiment, pair, prompt, spec) → its points (ui/learn/experiments.py)
        self.experiment_stop = threading.Event()

    def __deepcopy__(self, memo) -> Session:  # gr.State copies its default per visitor: start fresh
        return Session()

    def cancel(self) -> None:
        """Stop every kind of work this visitor has in flight: a comparison, a replay, a Learn-tab experiment."""
        self.stop.set()
        self.replay_stop.set()
        self.experiment_stop.set()

    def close(self) -> None:
        """The visitor left (Gradio deletes the state): stop whatever is in flight, remove the trace copy."""
        self.cancel()
        if self.trace_path:
            with contextlib.suppress(OSError):
                os.remove(self.trace_path)

    def begin_comparison(self) -> int:
        """A comparison starts (busy, a fresh stop flag, a replay of the previous one stopped: the views are the new
        comparison's); the previous one stays shown until clear_results."""
        self.replay_stop.set()
        self.stop = threading.Event()
        self.idle.clear()
        self.error, self.skipped, self.load_stopped = None, False, False
        self.earlier = bool(self.runs)
        self.generation += 1
        return self.generation

    def refuse(self, why: str) -> None:
        """A Run refused before it started (a bad setting): the error, and the runs shown are the earlier ones."""
        self.error, self.status = why, f"**Error:** {why}"
        self.earlier = bool(self.runs)

    def clear_results(self) -> None:
        """The new comparison's pair loaded and its settings passed: drop the previous results and trace."""
        if self.trace_path:  # the page already has its own copy of the previous trace
            with contextlib.suppress(OSError):
                os.remove(self.trace_path)
        self.runs, self.history, self.trace_path = {}, [], None
        self.feed = Feed()
        self.earlier = False

    def begin(self, decoder: str, namer: TokenNamer) -> DecoderRun:
        self.runs[decoder] = run = DecoderRun(decoder, namer)
        self.history.append(run)
        return run

    def add(self, run: DecoderRun, event) -> None:
        """One engine event into its run (the plots' feed is built when the runs are shown: show)."""
        run.add(event)

    def show(self, runs: dict[str, DecoderRun], comparison: int) -> None:
        """The views show these runs (one repeat's), in their run order; the plots' feed is rebuilt from their events
        (`comparison` names it: a new number, a new set of plots)."""
        order = sorted(runs.values(), key=lambda r: next(i for i, h in enumerate(self.history) if h is r))
        self.runs = {r.decoder: r for r in order}
        self.feed = Feed(comparison, list(self.runs))
        for run in order:
            for event in run.events:
                self.feed.add(event_line(run.decoder, run.t0, event))

    def all_events(self) -> list:
        return [e for run in self.history for e in run.events]

    @property
    def stopped(self) -> bool:
        """Stopped by the user: a run ended with stopped=True, was cut off (no RunEnd), or never started."""
        return self.skipped or any(r.end is None or r.end.stopped for r in self.runs.values())


def pick_step(run: DecoderRun, step, default: int) -> StepRecord | str:
    """The run's StepRecord numbered `step` (`default` when it is empty), or a one-line HTML message saying why not."""
    try:
        step = int(float(step)) if step not in (None, "") else default
    except (TypeError, ValueError, OverflowError):
        return f"<p><i>The step must be a whole number (steps 1..{run.steps[-1].step}).</i></p>"
    rec = next((r for r in run.steps if r.step == step), None)
    return rec if rec is not None else f"<p><i>Step {step} is not in this run (steps 1..{run.steps[-1].step}).</i></p>"


def plain_text(run: DecoderRun | None, upto: int | None = None) -> str:
    """The committed text only (what a user copies); rejected drafts and special tokens are never part of it."""
    if run is None:
        return ""
    if upto is None:
        return run.committed_text
    return "".join(text for i, (text, _) in enumerate(run.pieces[:upto]) if i not in run.special_at)


def stream_html(run: DecoderRun | None, upto: int | None = None, prompt: str = "") -> str:
    """One decoder's stream: the prompt greyed, then the committed text coloured by origin (one span per token,
    class mirror-tok), each step's rejected drafts struck through before its correction. Append-only while the
    run streams; the page's template wraps it in the scrolling monospace box (views.TOKENS_TEMPLATE)."""
    if run is None:
        return ""
    head = f'<span class="mirror-prompt" title="prompt">{html.escape(prompt)}</span>' if prompt else ""
    return head + run.view.html(upto)
