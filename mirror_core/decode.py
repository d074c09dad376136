"""The decode loops: ar, sd and mirror, all emitting the same events (MirrorEngine in api.py runs them).

Mirror-SD, one step (mirror_sd.md §2.3), for the window W = [w0, d1..dγ]:
  target prefix (layers 1..ℓ_e over W) → early-exit readout: top-κ per slot, sent to the draft
  lane → target suffix (layers ℓ_e+1..N) while the draft lane rolls out a branch for every
  candidate → acceptance (A_t, c) → commit d1..d_{A_t}, c → the draft lane adopts branch(τ, c) on
  a hit or rolls out afresh on a miss → next window.
Vanilla SD is the same loop without the readout: no branches, so every next window is a fresh
rollout after verification (serial).
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from .planner import BranchPlanner
from .messages import BranchRequest, DraftStart, DraftWindow, ResolveRequest, branch_rows
from .events import (ORIGIN_ACCEPTED, ORIGIN_BONUS, ORIGIN_CORRECTION, STAGE_ACCEPT, STAGE_DRAFT_BRANCHES,
                     STAGE_EXIT_READOUT, STAGE_TARGET_PREFIX, STAGE_TARGET_SUFFIX, STAGE_TARGET_VERIFY, STAGE_WAIT,
                     Event, StepRecord)
from .lanes.codec import LaneError
from .lanes.faults import fault_plan_from_env
from .decode_state import DecodeState, StopRun
from .sampling import warp_logits
from .verify import accept


def autoregressive_decode(run: DecodeState, lane) -> Iterator[list[Event]]:
    """ar: the target alone, one token per forward (the baseline)."""
    run.prefill()
    yield run.flush()
    yield from run.target_only(step=0)


def vanilla_sd_decode(run: DecodeState, lane) -> Iterator[list[Event]]:
    return speculative_decode(run, lane, mirror=False)


def mirror_sd_decode(run: DecodeState, lane) -> Iterator[list[Event]]:
    return speculative_decode(run, lane, mirror=True)


def speculative_decode(run: DecodeState, lane, mirror: bool) -> Iterator[list[Event]]:
    gamma = run.req.spec.gamma
    fault_step, fault_mode = fault_plan_from_env()
    try:
        lane.start(DraftStart(run.req.prompt_ids, gamma, run.cfg, fault_step, fault_mode))  # draft prefills meanwhile
        lane_ok = True
    except LaneError as exc:
        run.fallback, lane_ok = f"draft lane failed to start ({exc}); decoded on the target alone", False
    c0 = run.prefill()
    yield run.flush()
    window = None if run.done or not lane_ok else _next_window(run, lane, step=0, accepted=0, token=c0)
    # an inline lane runs the branches inside the readout, before the suffix: nothing to fit, so auto keeps all
    planner = BranchPlanner(run.req.spec.branch_budget, run.req.spec.kappa, parallel=lane.kind != "inline")
    step = 0
    while window is not None and not run.done:
        run.check_stop()
        step += 1
        w = [run.ids[-1], *window.tokens]                                 # [w0, d1..dγ]
        readout = ExitReadout(run, lane, step, w, run.req.spec.kappa, planner) if mirror else None
        logits = _verify_pass(run, w, readout, step)                      # [γ+1, V] target logits per slot
        t0 = run.now()
        result = accept(logits, list(window.tokens), run.cfg, len(run.ids), window.p_draft, run.gen)
        run.span(STAGE_ACCEPT, t0, run.now(), step)
        run.target.truncate(run.cache, len(run.ids) + result.accepted)  # keep w0, d1..d_A
        hit = None if readout is None or readout.failed else result.token in readout.topk_ids[result.accepted]
        if readout is not None:
            readout.observe(result.accepted, result.token)
        origin = ORIGIN_BONUS if result.accepted == gamma else ORIGIN_CORRECTION
        committed = run.commit([(d, ORIGIN_ACCEPTED, bool(window.hit)) for d in window.tokens[: result.accepted]]
                               + [(result.token, origin, False)], step)
        run.reject(step, list(window.tokens), result.accepted)
        next_window = None if run.done else _next_window(run, lane, step, result.accepted, result.token)
        if readout is not None and next_window is not None:
            branch_s = sum(t1 - t0 for stage, t0, t1 in next_window.spans if stage == STAGE_DRAFT_BRANCHES)
            planner.adapt(len(next_window.branches), branch_s, readout.t_done - readout.t1, len(w) * readout.kappa)
        if next_window is not None and hit is not None and next_window.hit != hit:
            raise RuntimeError(f"step {step}: the lanes disagree on hit/miss (a bug; output so far is exact)")
        run.record(StepRecord(
            step=step, window=tuple(w), drafted=gamma, accepted=result.accepted, token=result.token,
            committed=committed, from_branch=bool(window.hit), hit=hit,
            topk_ids=readout.topk_ids if readout else (), topk_logprobs=readout.topk_logprobs if readout else (),
            target_tokens=result.target_tokens,
            branches=next_window.branches if next_window else (),
            branch_rows=tuple(branch_rows(readout.topk_ids)) if next_window and next_window.branches else (),
            branch_row=next_window.branch_row if next_window else None, t_end=time.perf_counter()))
        yield run.flush()
        window = next_window
    if not run.done:  # the draft lane failed: finish on the target alone, same output
        yield from run.target_only(step)


def _verify_pass(run: DecodeState, w: list[int], readout: "ExitReadout | None", step: int) -> torch.Tensor:
    """One target forward over the window; with a readout, the prefix/readout/suffix spans are split."""
    t0 = run.now()
    if readout is None:
        logits = run.target.forward(run.cache, w)
        run.span(STAGE_TARGET_VERIFY, t0, run.now(), step)
        return logits
    logits = run.target.forward(run.cache, w, run.exit_layer, readout)
    t1 = run.now()
    run.span(STAGE_TARGET_PREFIX, t0, readout.t0, step)
    run.span(STAGE_EXIT_READOUT, readout.t0, readout.t1, step)
    run.span(STAGE_TARGET_SUFFIX, readout.t1, t1, step)
    readout.t_done = t1
    return logits


def _next_window(run: DecodeState, lane, step: int, accepted: int, token: int) -> DraftWindow | None:
    """Ask the draft lane for the next window (hit: a precomputed branch; miss: a fresh rollout)."""
    t0 = run.now()
    try:
        window = lane.resolve(ResolveRequest(step, accepted, token))
    except LaneError as exc:
        run.fallback = f"draft lane failed at step {step} ({exc}); finished on the target alone"
        return None
    run.span(STAGE_WAIT, t0, time.perf_counter(), step)
    run.draft_spans(window.spans, step)
    run.draft_forwards += window.forwards
    run.draft_produced += window.produced
    return window


class ExitReadout:
    """Called inside the target's forward after layer ℓ_e: top-κ per slot → M_t → the draft lane.

    With a branch budget, the planner keeps only the likeliest (slot, candidate) pairs (branching.py).
    """

    def __init__(self, run: DecodeState, lane, step: int, window: list[int], kappa: int, planner: BranchPlanner):
        self.run, self.lane, self.step, self.window, self.kappa, self.planner = run, lane, step, window, kappa, planner
        self.topk_ids: tuple[tuple[int, ...], ...] = ()      # what was sent (pruned candidates are −1)
        self.topk_logprobs: tuple[tuple[float, ...], ...] = ()
        self.ranked: list[list[int]] = []                   # [γ+1][κ] every candidate, by exit rank
        self.draft_is_top1: list[bool] = []                 # [γ] d_j was the exit's argmax at slot j
        self.failed = False
        self.t0 = self.t1 = self.t_done = 0.0  # readout start, readout end (suffix start), suffix end

    def __call__(self, logits_exit: torch.Tensor) -> None:
        self.t0 = self.run.now()
        slots = logits_exit.shape[0]                                          # γ+1
        x = logits_exit if self.run.cfg.greedy else warp_logits(logits_exit, self.run.cfg)  # same support as p_target
        drafts = torch.tensor(self.window[1:], device=x.device).unsqueeze(1)  # [γ, 1]
        self.draft_is_top1 = (x[: slots - 1].argmax(-1, keepdim=True) == drafts).squeeze(1).tolist()
        x = x.clone()
        x[: slots - 1].scatter_(1, drafts, float("-inf"))                    # c ≠ d_j at draft slot j
        logp_exit = torch.log_softmax(x, dim=-1)                              # [γ+1, V]
        k = min(self.kappa, x.shape[-1])
        top = torch.topk(logp_exit, k, dim=-1)                                # [γ+1, κ]
        ids = torch.where(torch.isfinite(top.values), top.indices, -1)        # [γ+1, κ]
        self.ranked = ids.tolist()
        self.topk_ids = tuple(tuple(r) for r in self.planner.select(ids, self.draft_is_top1).tolist())
        self.topk_logprobs = tuple(tuple(round(v, 4) for v in r) for r in top.values.tolist())
        try:
            self.lane.branch(BranchRequest(self.step, self.topk_ids))
        except LaneError:
            self.failed = True
        self.t1 = self.run.now()

    def observe(self, accepted: int, token: int) -> None:
        """Teach the planner this step's outcome."""
        cands = self.ranked[accepted]
        self.planner.observe(self.draft_is_top1, accepted, cands.index(token) if token in cands else None)


DECODERS = {"ar": autoregressive_decode, "sd": vanilla_sd_decode, "mirror": mirror_sd_decode}


def decode_events(run: DecodeState, lane) -> Iterator[list[Event]]:
    """Run the request's decoder, yielding a batch of events per step; the last batch ends with RunEnd."""
    try:
        yield from DECODERS[run.req.decoder](run, lane)
    except StopRun:
        yield run.flush() + [run.finish(stopped=True)]
        return
    except Exception as exc:  # the target lane failed: keep and report what was committed
        yield run.flush() + [run.finish(error=f"{type(exc).__name__}: {exc}")]
        return
    yield run.flush() + [run.finish()]
