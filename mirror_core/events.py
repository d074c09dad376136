"""Typed events every decoder emits, in order: RunStart, then Token/Rejected/Span/Step, then RunEnd; and run traces
as JSON (every event with its type name, for export and replay: event_to_dict, write_trace)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Union

from .config import LaneConfig, Request
from .context_draft import ContextProposal
from .draft_choice import WindowChoice
# WHOLE_MACHINE_BOUND: read by ui/, which reaches the load's records through the events that carry them
from .records import UNCHECKED, WHOLE_MACHINE_BOUND, Calibration, Roofline, RowCheck, WholeMachine  # noqa: F401

if TYPE_CHECKING:
    from .metrics import RunSummary

# Where a committed token came from.
ORIGIN_TARGET = "target"          # produced by the target alone (prefill token, AR step, target-only fallback)
ORIGIN_ACCEPTED = "accepted"      # a draft token the target accepted
ORIGIN_CORRECTION = "correction"  # the target's token at the first rejected slot
ORIGIN_BONUS = "bonus"            # the target's token after a fully accepted window
ORIGINS = (ORIGIN_TARGET, ORIGIN_ACCEPTED, ORIGIN_CORRECTION, ORIGIN_BONUS)

LANE_TARGET = "target"
LANE_DRAFT = "draft"

# Stage names of SpanEvent.stage.
STAGE_PREFILL = "prefill"                  # target or draft prompt prefill
STAGE_TARGET_STEP = "target_step"          # one target-only decode step (ar / fallback)
STAGE_TARGET_VERIFY = "target_verify"      # a whole verification pass (sd: no early exit)
STAGE_TARGET_PREFIX = "target_prefix"      # layers 1..ℓ_e over the window
STAGE_EXIT_READOUT = "exit_readout"        # final norm + LM head at ℓ_e, top-κ, send M_t
STAGE_TARGET_SUFFIX = "target_suffix"      # layers ℓ_e+1..N + LM head
STAGE_ACCEPT = "accept"                    # acceptance rule (A_t, c)
STAGE_WAIT = "wait"                        # target lane waiting for the draft lane's next window
STAGE_DRAFT_BRANCHES = "draft_branches"    # branch-complete rollouts for every candidate, one batch
STAGE_DRAFT_ROLLOUT = "draft_rollout"      # fresh γ-token rollout (first window, sd, or fallback)
STAGE_SELECT_BRANCH = "select_branch"      # adopting a precomputed branch's KV on a hit
TARGET_BUSY_STAGES = (STAGE_PREFILL, STAGE_TARGET_STEP, STAGE_TARGET_VERIFY, STAGE_TARGET_PREFIX,
                      STAGE_EXIT_READOUT, STAGE_TARGET_SUFFIX, STAGE_ACCEPT)


@dataclass(frozen=True)
class RunSettings:
    """Everything a run was asked to do and where it ran (recorded in RunStart; pair.PairInfo.run_settings builds
    it, the load-time records are records.py's)."""

    request: Request       # prompt ids, decoder, budget, sampling and speculation settings (γ, κ, ℓ_e resolved)
    lanes: LaneConfig      # devices, lane kind, cores and threads, runner choice
    exit_layer: int        # ℓ_e actually used (the request's, or the pair's: PairInfo.default_exit_layer)
    target: str            # the target's source (hub id or folder)
    draft: str | None      # the draft's source (None: target only)
    target_runner: str     # which runner executes the target (FastLlamaRunner, HFRunner)
    target_rows: RowCheck = UNCHECKED         # whether the target is one function here, and how (runners/exactness.py)
    target_dtype: Calibration | None = None   # the target lane's dtype and the timings behind it
    draft_dtype: Calibration | None = None    # the draft lane's dtype per shape (step, branch rows)
    exit_readout: str = "logit lens"          # how the layer-ℓ_e candidates were read out (PairInfo.exit_readout)
    draft_vocab: int | None = None            # V_d of a reduced-vocabulary draft (None: the target's whole vocabulary)
    draft_features: int | None = None         # ℓ_e whose hidden states a feature-reading draft reads (None: ids only)
    spec_note: str = ""                       # when γ, κ are the pair's choice for this machine: why (latency model)
    spec_modelled: float | None = None        # and then the Mirror-SD speedup over ar it modelled at load
    whole_machine: WholeMachine | None = None  # the target's one-token step timed at load on its lane's cores and
                                               # on the whole machine
    roofline: Roofline | None = None           # the target's kernel, weight bytes per token, forward by rows against
                                               # the memory roofline (records.Roofline)
    serial_cpus: tuple[int, ...] = ()          # where ar and sd run the target (every core); () = the target lane's
    lend_cpus: tuple[int, ...] = ()            # where mirror runs the target's layers before the early exit (every
                                               # core, the draft lane's lent); () = the target lane's

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunStart:
    decoder: str
    prompt_ids: tuple[int, ...]
    settings: RunSettings
    t0: float       # run start on the shared monotonic clock (seconds)


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    index: int          # 0-based index among the new tokens
    step: int           # verification step that committed it (0 = prefill)
    origin: str         # one of ORIGINS
    from_branch: bool   # an accepted token that came from a reused (precomputed) branch
    t: float            # commit time on the shared clock
    from_context: bool = False  # an accepted token of a context window (copied from the prompt or the output)


@dataclass(frozen=True)
class RejectedEvent:
    step: int
    token_ids: tuple[int, ...]  # the draft tokens after the first rejection, in window order
    first_slot: int             # 1-based slot of the first rejected token


@dataclass(frozen=True)
class SpanEvent:
    lane: str    # LANE_TARGET or LANE_DRAFT
    stage: str   # one of the STAGE_* names
    t0: float    # seconds on the shared monotonic clock (time.perf_counter, CLOCK_MONOTONIC)
    t1: float
    step: int


@dataclass(frozen=True)
class StepRecord:
    """One verification pass (of [w0] alone where the step took a window of zero); the raw material of every metric."""

    step: int
    window: tuple[int, ...]        # [w0, d1..dγ]
    drafted: int                   # D_t: draft tokens presented
    accepted: int                  # A_t
    token: int                     # c: correction (A_t < D_t) or bonus (A_t = D_t)
    committed: int                 # n_t (A_t + 1 unless EOS or the token budget cut the step)
    from_branch: bool              # this window was a reused branch (hit at the previous step)
    hit: bool | None               # c ∈ TopK_τ (None: no branches were prepared this step)
    topk_ids: tuple[tuple[int, ...], ...] = ()        # per slot 1..γ+1: early-exit top-κ by rank, before the branch
                                                      # budget pruned any (-1 = none); rolled out: branch_rows
    topk_logprobs: tuple[tuple[float, ...], ...] = ()  # matching log p_exit
    target_tokens: tuple[int, ...] = ()               # argmax p_target per slot (for Ω̂_κ)
    branches: tuple[tuple[int, ...], ...] = ()        # precomputed branch tokens, one row per branch_rows entry
    branch_rows: tuple[tuple[int, int], ...] = ()     # (slot index 0..γ, candidate token) of each branch row
    branch_row: int | None = None                     # the reused row on a hit
    t_end: float = 0.0
    source: str = "model"                             # metrics.SOURCES: where this window came from ("zero": none)
    context: ContextProposal | None = None            # a context window's match and its modelled acceptance
    choice: WindowChoice | None = None                # why this window and its length: each candidate's modelled
                                                      # tokens per ms against a plain step's (draft_choice.py)


@dataclass(frozen=True)
class RunEnd:
    token_ids: tuple[int, ...]
    summary: RunSummary             # raw counters and the metrics derived from them (metrics.py)
    fallback: str | None            # None, or why the run did not run as asked (e.g. draft lane failed)
    stopped: bool = False           # the caller's stop flag ended it early
    error: str | None = None        # target-lane failure: the tokens above are kept


Event = Union[RunStart, TokenEvent, RejectedEvent, SpanEvent, StepRecord, RunEnd]


# -- run traces as JSON ---------------------------------------------------------------------------------------
def event_to_dict(event: Event) -> dict:
    if isinstance(event, RunStart):
        return {"type": "RunStart", "decoder": event.decoder, "prompt_ids": list(event.prompt_ids),
                "settings": event.settings.to_dict(), "t0": event.t0}
    if isinstance(event, RunEnd):
        return {"type": "RunEnd", "token_ids": list(event.token_ids), "stats": event.summary.to_dict(),
                "fallback": event.fallback, "stopped": event.stopped, "error": event.error}
    return {"type": type(event).__name__, **asdict(event)}


def write_trace(path: str, events: list[Event], text: dict | None = None) -> None:
    """The events as JSON; `text` (front-ends with a tokenizer: the prompt and each decoder's output) rides along."""
    trace = {"format": "mirror-sd-trace/1", **({"text": text} if text else {}),
             "events": [event_to_dict(e) for e in events]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
