"""The decode loops: ar, sd and mirror, all emitting the same events (engine.MirrorEngine runs them).

Mirror-SD, one step (docs/ALGORITHM.md §2.3), for the window W = [w0, d1..dγ]:
  target prefix (layers 1..ℓ_e over W) → early-exit readout: top-κ per slot, sent to the draft
  lane as M_t → target suffix (layers ℓ_e+1..N) while the draft lane rolls out a branch for every
  candidate → acceptance (A_t, c) → commit d1..d_{A_t}, c → hit iff c ∈ TopK_τ: the draft lane
  adopts branch(s_t, c), else it rolls out afresh → next window.
Vanilla SD is the same loop without the readout: no branches, so every next window is a fresh
rollout after verification (serial).
A feature-reading draft (models/feature_draft.py) also gets the target's hidden states h^(ℓ_e): the prompt's with
the first ResolveRequest, the window slots' with M_t, and those of w0, d1..d_{A_t} with each ResolveRequest (vanilla
SD takes them from the same layer of its verification pass), so SD and Mirror-SD differ only in scheduling.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

import torch

from .decode_state import DecodeState, StopRun
from .events import (
    ORIGIN_ACCEPTED,
    ORIGIN_BONUS,
    ORIGIN_CORRECTION,
    ORIGIN_TARGET,
    STAGE_ACCEPT,
    STAGE_DRAFT_BRANCHES,
    STAGE_EXIT_READOUT,
    STAGE_TARGET_PREFIX,
    STAGE_TARGET_STEP,
    STAGE_TARGET_SUFFIX,
    STAGE_TARGET_VERIFY,
    STAGE_WAIT,
    Event,
    StepRecord,
)
from .lanes.codec import LaneError
from .lanes.placement import pinned
from .draft_choice import choice_plan
from .models.exit_head import ExitLogits
from .messages import (SOURCE_BRANCH, SOURCE_CONTEXT, BranchRequest, DraftStart, DraftWindow, ExitReadout,
                       ResolveRequest, branch_rows)
from .planner import BranchPlanner
from .sampling import target_token, warp_logits
from .verify import AcceptResult, accept

if TYPE_CHECKING:
    from .lanes.draft_lanes import DraftLane


def autoregressive_decode(state: DecodeState, lane: DraftLane) -> Iterator[list[Event]]:
    """ar: the target alone, one token per forward (the baseline)."""
    state.prefill()
    yield state.flush()
    yield from target_steps(state, step=0)


def target_steps(state: DecodeState, step: int) -> Iterator[list[Event]]:
    """Plain autoregressive steps until the run ends (the ar decoder, and the draft-failure fallback)."""
    while not state.done:
        state.check_stop()
        step += 1
        t0 = state.now()
        logits = state.target.forward(state.cache, state.ids[-1:])                          # [1, V]
        token = target_token(logits[-1], state.cfg, len(state.ids))
        state.span(STAGE_TARGET_STEP, t0, state.now(), step)
        state.single_steps += 1
        state.commit([(token, ORIGIN_TARGET, False)], step)
        yield state.flush()


def vanilla_sd_decode(state: DecodeState, lane: DraftLane) -> Iterator[list[Event]]:
    return speculative_decode(state, lane, mirror=False)


def mirror_sd_decode(state: DecodeState, lane: DraftLane) -> Iterator[list[Event]]:
    return speculative_decode(state, lane, mirror=True)


def speculative_decode(state: DecodeState, lane: DraftLane, mirror: bool) -> Iterator[list[Event]]:
    """sd and mirror: verify a draft window in one target pass, commit A_t drafts and c, get the next window."""
    lane_ok = start_draft_lane(state, lane)                            # the draft prefills while the target does
    c0, h_prompt = state.prefill()                                     # h_prompt: [P, H] for a feature draft, else None
    yield state.flush()
    window = next_window(state, lane, 0, AcceptResult(0, c0, ()), False, h_prompt) if lane_ok and not state.done \
        else None
    # an inline lane rolls the branches out only when the next window is asked for: nothing to fit, so auto keeps all
    planner = BranchPlanner(state.req.spec.branch_budget, state.req.spec.kappa, parallel=lane.parallel)
    step = 0
    while window is not None and not state.done:
        state.check_stop()
        step += 1
        w = [state.ids[-1], *window.tokens]                            # [w0, d1..d_g]; a window of zero: [w0]
        t_verify = state.now()
        with plain_cores(state, window):                               # a window of zero: a plain step, ar's cores
            logits, readout, h = verify(state, lane, planner if mirror and window.tokens else None, w, step)
        verify_s = state.now() - t_verify                              # logits [g+1, V]; M_t sent mid-pass
        result = accept_window(state, logits, window, step)            # (A_t, c)
        hit = verdict(readout, result)                                 # c ∈ TopK_τ (None: no branches this step)
        committed = commit_step(state, w, result, window, step)        # d1..d_{A_t}, then c
        window = confirm(state, lane, window, step)                    # a promised window of zero: its reply, now
        costs = (verify_s, state.wait_s)                               # the step's measured costs, for the draft lane
        h_kept = None if h is None else h[: result.accepted + 1]      # [A_t+1, H]: w0, d1..d_{A_t}
        following = None if state.done or state.fallback else next_window(
            state, lane, step, result, bool(hit), h_kept, costs, plain=promise_kept(window, result, hit))
        if readout is not None:
            planner.after_step(readout, result.accepted, result.token, *branch_work(following))
        state.record(step_record(step=step, w=w, result=result, committed=committed, window=window,
                                 readout=readout, hit=hit, following=following))
        yield state.flush()
        window = following
    if not state.done:  # the draft lane failed: finish on the target alone, same output
        yield from target_steps(state, step)


def start_draft_lane(state: DecodeState, lane: DraftLane) -> bool:
    """Send DraftStart; False (and a recorded fallback) when the draft lane cannot start."""
    try:
        lane.start(DraftStart(state.req.prompt_ids, state.req.spec.gamma, state.cfg,
                              choice_plan(state.req.spec, state.req.max_new_tokens, state.window_steps, state.step_s,
                                          state.plain_s),
                              state.shared))
        return True
    except LaneError as exc:
        state.fallback = f"draft lane failed to start ({exc}); decoded on the target alone"
        return False


def plain_cores(state: DecodeState, window: DraftWindow):
    """Where a window of zero runs in Mirror-SD: on the cores ar runs on (DecodeState.plain_cpus: every core, where ar
    runs there), as ar takes a step, with no candidates sent (the draft lane has no branches to roll out meanwhile);
    any other window on the lane's cores as they are (sd and ar run on ar's cores throughout)."""
    cpus = () if window.tokens else state.plain_cpus
    return pinned(cpus, len(cpus), state.target.kernel.library is not None) if cpus else contextlib.nullcontext()


def verify(state: DecodeState, lane: DraftLane, planner: BranchPlanner | None, w: list[int], step: int
           ) -> tuple[torch.Tensor, ExitReadout | None, torch.Tensor | None]:
    """One target pass over the window → logits [γ+1, V]. Mirror-SD (a planner) stops the pass after layer ℓ_e,
    sends M_t and then runs layers ℓ_e+1..N while the draft lane rolls out branches. Also returns h^(ℓ_e)
    [γ+1, H] (CPU) when the draft reads features, else None."""
    t0 = state.now()
    if planner is None and not state.features:
        logits = state.target.forward(state.cache, w)                                  # [γ+1, V]
        state.span(STAGE_TARGET_VERIFY, t0, state.now(), step)
        return logits, None, None
    with state.lent_cores():                                                          # mirror: the draft lane's too
        at_exit = state.target.forward_to_exit(state.cache, w, state.exit_layer)      # layers 1..ℓ_e
    h = at_exit.h.cpu() if state.features else None                                   # h^(ℓ_e) [γ+1, H]
    if planner is None:  # vanilla SD with a feature draft: the same pass, read on the way
        logits = state.target.finish_pass(at_exit)                                     # [γ+1, V]
        state.span(STAGE_TARGET_VERIFY, t0, state.now(), step)
        return logits, None, h
    readout = send_candidates(state, lane, planner, w, step, at_exit.h, h)            # M_t → the draft lane
    logits = state.target.finish_pass(at_exit)                                         # layers ℓ_e+1..N [γ+1, V]
    readout = replace(readout, t_verified=state.now())
    state.span(STAGE_TARGET_PREFIX, t0, readout.t_readout, step)
    state.span(STAGE_EXIT_READOUT, readout.t_readout, readout.t_sent, step)
    state.span(STAGE_TARGET_SUFFIX, readout.t_sent, readout.t_verified, step)
    return logits, readout, h


def send_candidates(state: DecodeState, lane: DraftLane, planner: BranchPlanner, w: list[int], step: int,
                    h: torch.Tensor, features: torch.Tensor | None) -> ExitReadout:
    """The early exit, between layers ℓ_e and ℓ_e+1 of the target pass: top-κ per slot of h^(ℓ_e) [γ+1, H]
    (d_j excluded) → M_t → draft lane (with the slots' features [γ+1, H] on the CPU when the draft reads them). A
    trained exit head names its own tokens only (every other logit is -inf): the readout's columns are those tokens,
    so the softmax and top-κ run over them alone, the same candidates as over the whole vocabulary."""
    t0 = state.now()
    exit = state.target.exit_readout(h, state.exit_layer)                     # logits [γ+1, V'] over its columns
    ids, values, draft_is_top1 = exit_candidates(exit, w[1:], state.cfg, state.req.spec.kappa)  # [γ+1, κ] each
    topk_ids = tuple(tuple(r) for r in planner.select(ids, draft_is_top1).tolist())
    try:
        lane.branch(BranchRequest(step, topk_ids, features))
        delivered = True
    except LaneError:
        delivered = False
    return ExitReadout(topk_ids, tuple(tuple(round(v, 4) for v in r) for r in values.tolist()),
                       tuple(tuple(r) for r in ids.tolist()), tuple(draft_is_top1), delivered, t0, state.now())


def exit_candidates(exit: ExitLogits, drafts: list[int], cfg, kappa: int
                    ) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Top-κ token ids [γ+1, κ] (-1 where fewer are finite) and their log-probabilities [γ+1, κ] per slot of the
    readout, d_j excluded at draft slot j; and whether d_j was the readout's top-1 there. Over the readout's columns:
    where a trained head names only its own tokens the rest are -inf, so these are the candidates over all of V."""
    slots = exit.logits.shape[0]                                               # γ+1
    x = exit.logits if cfg.greedy else warp_logits(exit.logits, cfg)           # same support as p_target
    cols = exit.columns(list(drafts))                                          # [γ]: d_j's column (-1: -inf anyway)
    top1 = x[: slots - 1].argmax(-1).tolist()                                  # [γ]
    draft_is_top1 = [c >= 0 and c == t for c, t in zip(cols, top1)]
    x = x.clone()
    for j, c in enumerate(cols):                                               # c ≠ d_j at draft slot j
        if c >= 0:
            x[j, c] = float("-inf")
    logp_exit = torch.log_softmax(x, dim=-1)                                   # [γ+1, V']
    kappa = min(kappa, exit.vocab_size or x.shape[-1])
    top = torch.topk(logp_exit, min(kappa, x.shape[-1]), dim=-1)               # [γ+1, ≤κ]
    ids = torch.where(torch.isfinite(top.values), exit.token_ids(top.indices), -1)  # [γ+1, ≤κ]
    values = top.values
    if ids.shape[1] < kappa:  # fewer columns than κ: the rest are -inf over the whole vocabulary
        ids = torch.nn.functional.pad(ids, (0, kappa - ids.shape[1]), value=-1)          # [γ+1, κ]
        values = torch.nn.functional.pad(values, (0, kappa - values.shape[1]), value=float("-inf"))
    return ids, values, draft_is_top1


def verdict(readout: ExitReadout | None, result: AcceptResult) -> bool | None:
    """Hit iff c is among the candidates sent for slot s_t = A_t + 1; None when no candidates reached the draft lane."""
    if readout is None or not readout.delivered:
        return None
    return result.token in readout.topk_ids[result.accepted]


def accept_window(state: DecodeState, logits: torch.Tensor, window: DraftWindow, step: int) -> AcceptResult:
    """The acceptance rule over the window (verify.py); the target cache then keeps w0 and d1..d_{A_t}."""
    t0 = state.now()
    result = accept(logits, list(window.tokens), state.cfg, len(state.ids), window.p_draft, state.gen)
    state.span(STAGE_ACCEPT, t0, state.now(), step)
    state.keep_accepted(result.accepted)
    return result


def commit_step(state: DecodeState, w: list[int], result: AcceptResult, window: DraftWindow, step: int) -> int:
    """Commit the accepted drafts and c (n_t of them before EOS or the budget); report the rejected drafts."""
    drafts, reused = w[1:], window.source == SOURCE_BRANCH
    origin = ORIGIN_TARGET if not drafts else ORIGIN_BONUS if result.accepted == len(drafts) else ORIGIN_CORRECTION
    committed = state.commit([(d, ORIGIN_ACCEPTED, reused) for d in drafts[: result.accepted]]
                             + [(result.token, origin, False)], step, from_context=window.source == SOURCE_CONTEXT)
    state.reject(step, drafts, result.accepted)
    return committed


def next_window(state: DecodeState, lane: DraftLane, step: int, result: AcceptResult, hit: bool,
                features: torch.Tensor | None = None, costs: tuple[float, float] = (0.0, 0.0), plain: bool = False
                ) -> DraftWindow | None:
    """Tell the draft lane (A_t, c), the verdict, (a feature draft) the new positions' h^(ℓ_e) and what verifying
    its last window cost (the verification pass, the wait for the window: seconds); its reply is the next window
    (None: the lane failed). `plain`: the last reply promised a window of zero next, so the request is posted and the
    plain step starts at once; `confirm` collects the reply when it ends."""
    t0 = state.now()
    request = ResolveRequest(step, result.accepted, result.token, hit, features, *costs)
    try:
        if plain:
            lane.post(request)
            state.wait_s = 0.0
            return DraftWindow.promised_zero()
        window = lane.resolve(request)
    except LaneError as exc:
        state.fallback = f"draft lane failed at step {step} ({exc}); finished on the target alone"
        return None
    t1 = time.perf_counter()
    state.span(STAGE_WAIT, t0, t1, step)
    state.wait_s = t1 - t0 if step > 0 else 0.0  # the first window comes with the draft's prefill
    state.draft_reply(window, step)
    return window


def confirm(state: DecodeState, lane: DraftLane, window: DraftWindow, step: int) -> DraftWindow:
    """The draft lane's reply for a promised window of zero, collected once the plain step is done (it was worked out
    while the target computed); another window is returned as it is. A failed lane: the window as it was, and the
    run finishes on the target alone."""
    if not window.promised:
        return window
    t0 = time.perf_counter()
    try:
        reply = lane.collect()
    except LaneError as exc:
        state.fallback = f"draft lane failed at step {step} ({exc}); finished on the target alone"
        return window
    t1 = time.perf_counter()
    state.span(STAGE_WAIT, t0, t1, step)
    state.wait_s = t1 - t0
    state.draft_reply(reply, step)
    return reply


def promise_kept(window: DraftWindow, result: AcceptResult, hit: bool | None) -> bool:
    """Whether the step after this one is the plain step the window's reply promised: c is not among the tokens that
    could make the context offer a window, and no branch for c was rolled out."""
    return window.then_plain_unless is not None and not hit and result.token not in window.then_plain_unless


def branch_work(window: DraftWindow | None) -> tuple[int, float]:
    """(branch rows, seconds of branch rollouts) the draft lane reported with this window."""
    if window is None:
        return 0, 0.0
    return len(window.branches), sum(t1 - t0 for stage, t0, t1 in window.spans if stage == STAGE_DRAFT_BRANCHES)


def step_record(*, step: int, w: list[int], result: AcceptResult, committed: int, window: DraftWindow,
                readout: ExitReadout | None, hit: bool | None, following: DraftWindow | None) -> StepRecord:
    """The StepRecord of one verification (the raw material of every metric and of the step inspector)."""
    branches = following.branches if following else ()
    return StepRecord(
        step=step, window=tuple(w), drafted=len(w) - 1, accepted=result.accepted, token=result.token,
        committed=committed, from_branch=window.source == SOURCE_BRANCH, hit=hit, source=window.source,
        context=window.context, choice=window.choice,
        topk_ids=readout.ranked if readout else (), topk_logprobs=readout.topk_logprobs if readout else (),
        target_tokens=result.target_tokens, branches=branches,
        branch_rows=tuple(branch_rows(readout.topk_ids)) if readout and branches else (),
        branch_row=following.branch_row if following else None, t_end=time.perf_counter())


DECODERS = {"ar": autoregressive_decode, "sd": vanilla_sd_decode, "mirror": mirror_sd_decode}


def decode_events(state: DecodeState, lane: DraftLane) -> Iterator[list[Event]]:
    """Run the request's decoder, yielding a batch of events per step; the last batch ends with RunEnd."""
    try:
        yield from DECODERS[state.req.decoder](state, lane)
    except StopRun:
        yield state.flush() + [state.finish(stopped=True)]
        return
    except Exception as exc:  # the target lane failed: keep and report what was committed
        yield state.flush() + [state.finish(error=f"{type(exc).__name__}: {exc}")]
        return
    yield state.flush() + [state.finish()]
