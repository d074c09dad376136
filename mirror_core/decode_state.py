"""DecodeState: one request's state on the target lane, shared by every decoder in decode.py."""
from __future__ import annotations

import contextlib
import threading
import time

import torch

from . import machine
from .config import Request
from .lanes.placement import pinned
from .events import (
    LANE_DRAFT,
    LANE_TARGET,
    TARGET_BUSY_STAGES,
    ORIGIN_ACCEPTED,
    ORIGIN_TARGET,
    STAGE_PREFILL,
    RejectedEvent,
    RunEnd,
    RunSettings,
    RunStart,
    SpanEvent,
    StepRecord,
    TokenEvent,
)
from .lanes import pinned
from .messages import DraftWindow
from .metrics import SOURCES, RunSummary, interval_length, interval_overlap
from .runners.protocol import TargetRunner
from .sampling import target_token


class StopRun(Exception):
    """The caller's stop flag was set."""


class DecodeState:
    """The target lane's side of one request: its KV cache, the committed tokens, the clock and the events.

    It owns the target cache and is the only code that moves its position (prefill, verify, truncate
    after acceptance). Decoders call its small steps and yield the events it buffers (`flush`); at
    the end `finish` turns the step records and spans into the run's RunSummary.
    """

    def __init__(self, request: Request, target: TargetRunner, exit_layer: int, eos_ids: frozenset[int],
                 stop: threading.Event | None, settings: RunSettings, features: bool = False,
                 window_steps: tuple[float, ...] = (), step_s: float = 0.0, plain_s: float = 0.0,
                 plain_cpus: tuple[int, ...] = (),
                 shared: str = "", prefill_cpus: tuple[int, ...] = ()):
        self.req, self.target, self.exit_layer = request, target, exit_layer
        self.prefill_cpus = prefill_cpus  # where the prefill runs, one kernel thread a core (): the lane's own cores
        self.window_steps = window_steps  # the target's forward of 1, 2, .. rows in one-row steps (load-time)
        self.step_s = step_s              # its one-row step (s, load-time; 0: not timed)
        self.plain_s = plain_s            # a plain step where plain steps run (s, load-time; 0: not timed)
        self.plain_cpus = plain_cpus      # where Mirror-SD's plain steps run (ar's cores; (): the lane's own)
        self.shared = shared              # which steps use the draft lane's cores too (DraftStart.shared)
        self.features = features  # the draft reads the target's h^(ℓ_e) (a feature-reading draft; ℓ_e is its layer)
        self.cfg = request.sampling
        self.lend = settings.lend_cpus if request.decoder == "mirror" else ()  # cores lent for layers 1..ℓ_e
        self.eos_ids = eos_ids if request.stop_at_eos else frozenset()
        self.stop = stop
        self.cache = target.new_cache()
        self.ids: list[int] = list(request.prompt_ids)   # committed tokens, prompt included
        self.new_tokens: list[int] = []
        self.done = False
        self.fallback: str | None = None
        self.pending: list = []
        self.spans: list[SpanEvent] = []
        self.records: list[StepRecord] = []
        self.draft_forwards = 0   # draft row-forwards (a batched pass over R branch rows counts R)
        self.draft_produced = 0   # draft tokens they produced
        self.single_steps = 0     # one-token target passes after the prefill (ar, and after a draft-lane failure)
        self.wait_s = 0.0         # how long the target lane waited for the current window (s; decode.next_window)
        self.gen = torch.Generator().manual_seed(self.cfg.seed)  # the target lane's stream (Rule R)
        self.t_start = time.perf_counter()
        self.t_first: float | None = None   # first new token committed
        self.t_last: float | None = None    # last new token committed
        self.pending.append(RunStart(request.decoder, request.prompt_ids, settings, self.t_start))

    def lent_cores(self):
        """Mirror-SD's layers before the early exit on the cores the draft lane lends while it sleeps until M_t
        (RunSettings.lend_cpus); a context that changes nothing where none are lent."""
        if not self.lend:
            return contextlib.nullcontext()
        return pinned(self.lend, len(self.lend), self.target.kernel.library is not None)

    # -- time ------------------------------------------------------------------------------
    def now(self) -> float:
        """The shared clock, after the target's device has finished its queued work."""
        for device in self.target.devices:  # this lane's streams only, never the draft's
            machine.synchronize(device)
        return time.perf_counter()

    def span(self, stage: str, t0: float, t1: float, step: int, lane: str = LANE_TARGET) -> None:
        s = SpanEvent(lane, stage, t0, t1, step)
        self.spans.append(s)
        self.pending.append(s)

    def draft_reply(self, window: DraftWindow, step: int) -> None:
        """Book a draft-lane reply: its spans on the draft lane and its forward counts."""
        for stage, t0, t1 in window.spans:
            self.span(stage, t0, t1, step, LANE_DRAFT)
        self.draft_forwards += window.forwards
        self.draft_produced += window.produced

    def check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise StopRun()

    # -- target steps ----------------------------------------------------------------------
    def prefill(self) -> tuple[int, torch.Tensor | None]:
        """Target prefill of the whole prompt; commits the first new token c0. Returns c0 and, for a feature-reading
        draft, the prompt's h^(ℓ_e) [P, H] (on the CPU, for the draft lane). Only the last row's logits are read, so
        only its LM head runs (a fifth of a token's arithmetic saved on every other prompt row)."""
        t0 = self.now()
        h_prompt = None
        cpus = self.prefill_cpus
        with pinned(cpus, len(cpus), kernel=True) if cpus else contextlib.nullcontext():
            if self.features:
                at_exit = self.target.forward_to_exit(self.cache, self.ids, self.exit_layer)
                h_prompt = at_exit.h.cpu()                                                     # [P, H]
                logits = self.target.finish_pass(at_exit, rows=1)                              # [1, V]
            else:
                logits = self.target.forward(self.cache, self.ids, rows=1)                     # [1, V]
        token = target_token(logits[-1], self.cfg, len(self.ids))
        self.span(STAGE_PREFILL, t0, self.now(), 0)
        self.commit([(token, ORIGIN_TARGET, False)], 0)
        return token, h_prompt

    def keep_accepted(self, accepted: int) -> None:
        """After acceptance: the target cache keeps w0 and d1..d_A; the rejected drafts' entries are dropped."""
        self.target.truncate(self.cache, len(self.ids) + accepted)

    def commit(self, tokens: list[tuple[int, str, bool]], step: int, from_context: bool = False) -> int:
        """Append (token, origin, from_branch) in order, stopping at EOS or the token budget; returns n_t.
        from_context: the accepted tokens came from a context window."""
        n = 0
        for token, origin, from_branch in tokens:
            if self.done:
                break
            t = self.t_last = time.perf_counter()
            self.t_first = self.t_first or t
            self.pending.append(TokenEvent(token, len(self.new_tokens), step, origin, from_branch, t,
                                           from_context and origin == ORIGIN_ACCEPTED))
            self.ids.append(token)
            self.new_tokens.append(token)
            n += 1
            self.done = token in self.eos_ids or len(self.new_tokens) >= self.req.max_new_tokens
        return n

    def reject(self, step: int, window: list[int], accepted: int) -> None:
        if accepted < len(window):
            self.pending.append(RejectedEvent(step, tuple(window[accepted:]), accepted + 1))

    def record(self, rec: StepRecord) -> None:
        self.records.append(rec)
        self.pending.append(rec)

    def flush(self):
        out, self.pending = self.pending, []
        return out

    # -- the end ---------------------------------------------------------------------------
    def finish(self, stopped: bool = False, error: str | None = None) -> RunEnd:
        t_end = self.t_last if self.t_last is not None else time.perf_counter()
        summary = summarize(self.records, self.spans, self.req.spec.gamma, new_tokens=len(self.new_tokens),
                            t_start=self.t_start, t_first=self.t_first, t_end=t_end,
                            draft_forwards=self.draft_forwards, draft_produced=self.draft_produced,
                            single_steps=self.single_steps)
        return RunEnd(tuple(self.new_tokens), summary, self.fallback, stopped, error)


# -- the run's summary: its step records and spans counted into RunSummary (metrics.py) -------------------
def summarize(records: list[StepRecord], spans: list[SpanEvent], gamma: int, *, new_tokens: int,
              t_start: float, t_first: float | None, t_end: float, draft_forwards: int = 0,
              draft_produced: int = 0, single_steps: int = 0) -> RunSummary:
    """Count a run's step records and spans into a RunSummary."""
    hist, pos_acc, pos_dr = [0] * (gamma + 1), [0] * gamma, [0] * gamma
    branched, hits = [0, 0, 0], [0, 0, 0]
    by_source = {name: [0, 0, 0] for name in SOURCES}  # steps, Σ D_t, Σ A_t
    committed = drafted = accepted = slots = in_topk = 0
    for r in records:
        committed += r.committed
        drafted += r.drafted
        accepted += r.accepted
        hist[min(r.accepted, gamma)] += r.drafted > 0   # a window of zero proposed nothing to accept
        for i in range(1, gamma + 1):
            pos_dr[i - 1] += r.drafted >= i
            pos_acc[i - 1] += r.accepted >= i
        if r.hit is not None:
            kind = 2 if r.accepted == r.drafted else (0 if r.accepted == 0 else 1)
            branched[kind] += 1
            hits[kind] += bool(r.hit)
        counts = by_source[r.source]
        counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + r.drafted, counts[2] + r.accepted
        s, k = _overlap(r)
        slots += s
        in_topk += k
    draft_busy, target_busy = busy_intervals(spans, LANE_DRAFT), busy_intervals(spans, LANE_TARGET)
    return RunSummary(
        gamma=gamma, new_tokens=new_tokens, steps=len(records), single_steps=single_steps, committed=committed, drafted=drafted,
        accepted=accepted, hist=tuple(hist), pos_accepted=tuple(pos_acc), pos_drafted=tuple(pos_dr),
        branched_steps=sum(branched), hits=sum(hits), branched_by_kind=tuple(branched), hits_by_kind=tuple(hits),
        overlap_slots=slots, overlap_in_topk=in_topk, draft_forwards=draft_forwards, draft_produced=draft_produced,
        draft_busy_s=interval_length(draft_busy), target_busy_s=interval_length(target_busy),
        hidden_s=interval_overlap(draft_busy, target_busy), wall_s=max(0.0, t_end - t_start),
        ttft_s=None if t_first is None else t_first - t_start,
        **{f"source_{key}": tuple(by_source[name][i] for name in SOURCES)
           for i, key in enumerate(("steps", "drafted", "accepted"))})


def _overlap(r: StepRecord) -> tuple[int, int]:
    """(slots counted for Ω̂_κ, slots whose target token was in TopK) of one step."""
    if not r.topk_ids or not r.target_tokens:
        return 0, 0
    drafts, slots, in_topk = r.window[1:], 0, 0
    for j, (y, topk) in enumerate(zip(r.target_tokens, r.topk_ids)):
        if j < len(drafts) and drafts[j] == y:
            continue
        slots += 1
        in_topk += y in topk
    return slots, in_topk


def busy_intervals(spans: list[SpanEvent], lane: str) -> list[tuple[float, float]]:
    if lane == LANE_TARGET:
        return [(s.t0, s.t1) for s in spans if s.lane == LANE_TARGET and s.stage in TARGET_BUSY_STAGES]
    return [(s.t0, s.t1) for s in spans if s.lane == LANE_DRAFT]
