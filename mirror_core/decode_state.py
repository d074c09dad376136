"""Per-request decode state shared by every decoder: the target cache, committing, spans, the summary.

The DecodeState owns the target lane's cache and the committed tokens. Decoders call its small steps
(prefill, verify, commit, target-only steps) and yield the events it buffers.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict

import torch

from .config import Request
from .events import (LANE_DRAFT, LANE_TARGET, ORIGIN_TARGET, STAGE_PREFILL, STAGE_TARGET_STEP, RejectedEvent,
                     RunEnd, RunStart, SpanEvent, StepRecord, TokenEvent)
from .metrics import summarize
from .runners.protocol import Runner
from .sampling import target_token


class StopRun(Exception):
    """The caller's stop flag was set."""


class DecodeState:
    def __init__(self, request: Request, target: Runner, exit_layer: int, eos_ids: frozenset[int],
                 stop: threading.Event | None, settings: dict):
        self.req, self.target, self.exit_layer = request, target, exit_layer
        self.cfg = request.sampling
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
        self.gen = torch.Generator().manual_seed(self.cfg.seed)  # the target lane's stream (Rule R)
        self.t_start = time.perf_counter()
        self.t_first: float | None = None   # first new token committed
        self.t_last: float | None = None    # last new token committed
        self.pending.append(RunStart(request.decoder, request.prompt_ids, settings, self.t_start))

    # -- time ------------------------------------------------------------------------------
    def span(self, stage: str, t0: float, t1: float, step: int, lane: str = LANE_TARGET) -> None:
        s = SpanEvent(lane, stage, t0, t1, step)
        self.spans.append(s)
        self.pending.append(s)

    def now(self) -> float:
        """The shared clock, after the target's device has finished its queued work."""
        if self.target.device.type == "cuda":  # this lane's stream only, never the draft's
            torch.cuda.current_stream(self.target.device).synchronize()
        return time.perf_counter()

    def draft_spans(self, spans, step: int) -> None:
        for stage, t0, t1 in spans:
            self.span(stage, t0, t1, step, LANE_DRAFT)

    def check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise StopRun()

    # -- target steps ----------------------------------------------------------------------
    def prefill(self) -> int:
        """Target prefill of the whole prompt; commits the first new token c0."""
        t0 = self.now()
        logits = self.target.forward(self.cache, self.ids)  # [T, V]
        token = target_token(logits[-1], self.cfg, len(self.ids))
        self.span(STAGE_PREFILL, t0, self.now(), 0)
        self.commit([(token, ORIGIN_TARGET, False)], 0)
        return token

    def target_only(self, step: int):
        """Plain autoregressive steps until the run ends (the ar decoder, and the draft-failure fallback)."""
        while not self.done:
            self.check_stop()
            step += 1
            t0 = self.now()
            logits = self.target.forward(self.cache, self.ids[-1:])  # [1, V]
            token = target_token(logits[-1], self.cfg, len(self.ids))
            self.span(STAGE_TARGET_STEP, t0, self.now(), step)
            self.commit([(token, ORIGIN_TARGET, False)], step)
            yield self.flush()

    def commit(self, tokens: list[tuple[int, str, bool]], step: int) -> int:
        """Append tokens in order, stopping at EOS or the token budget; returns n_t."""
        n = 0
        for token, origin, from_branch in tokens:
            if self.done:
                break
            t = self.t_last = time.perf_counter()
            self.t_first = self.t_first or t
            self.pending.append(TokenEvent(token, len(self.new_tokens), step, origin, from_branch, t))
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
        stats = summarize(self.records, self.spans, self.req.spec.gamma, new_tokens=len(self.new_tokens),
                          t_start=self.t_start, t_first=self.t_first, t_end=t_end,
                          extra={"decoder": self.req.decoder, "gamma": self.req.spec.gamma,
                                 "kappa": self.req.spec.kappa, "exit_layer": self.exit_layer,
                                 "sampling": asdict(self.cfg), "draft_forwards": self.draft_forwards,
                                 "draft_tokens_per_forward": (self.draft_produced / self.draft_forwards
                                                              if self.draft_forwards else None),
                                 "fallback": self.fallback, "stopped": stopped})
        return RunEnd(tuple(self.new_tokens), stats, self.fallback, stopped, error)
