"""The token channel's messages between the target lane and the draft lane: token ids and spans, and for a
feature-reading draft (models/feature_draft.py) the target's hidden states after layer ℓ_e.

Target → draft: DraftStart (a request begins), BranchRequest (M_t: the early-exit candidates), ResolveRequest
((A_t, c) and the target lane's hit/miss verdict). Draft → target: DraftWindow (the next window, with the
draft lane's spans). lanes/codec.py turns each into a channel frame for the process lane.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import SamplingConfig
from .context_draft import ContextProposal
from .draft_choice import SOURCE_BRANCH, SOURCE_CONTEXT, SOURCE_MODEL, SOURCE_ZERO, ChoicePlan, WindowChoice  # noqa: F401

SpanTuple = tuple[str, float, float]  # (stage, t0, t1) on the shared monotonic clock


@dataclass(frozen=True)
class DraftStart:
    """Begin a request: prefill the prompt (runs while the target prefills)."""
    prompt_ids: tuple[int, ...]
    gamma: int
    sampling: SamplingConfig
    choice: ChoicePlan                     # how the draft lane chooses each window (draft_choice.py)
    # which of the target's steps run on the draft lane's cores too (ar's cores hold them): "" none, "plain" its plain
    # steps (Mirror-SD), "all" all of them (sd); the draft lane then waits for its next command asleep, not spinning
    shared: str = ""


@dataclass(frozen=True)
class BranchRequest:
    """M_t: early-exit candidate ids per slot 1..γ+1 (−1 = no candidate); ids only, log-probs stay with the target."""
    step: int
    topk_ids: tuple[tuple[int, ...], ...]
    features: torch.Tensor | None = None   # [γ+1, H] h^(ℓ_e) of the window slots (a feature-reading draft only)


@dataclass(frozen=True)
class ResolveRequest:
    """(A_t, c) after acceptance and the target lane's verdict; the reply is the next window."""
    step: int
    accepted: int
    token: int
    hit: bool   # c ∈ TopK_{s_t} of the candidates sent (s_t = A_t + 1): adopt branch (s_t, c); else roll out afresh
    features: torch.Tensor | None = None   # h^(ℓ_e) of w0, d1..d_{A_t} ([A_t+1, H]; at step 0 the prompt's [P, H]),
                                           # a feature-reading draft only
    verify_s: float = 0.0   # the target's verification pass of this step's window (s; 0 at step 0)
    wait_s: float = 0.0     # how long the target lane waited for that window after the previous step (s)


@dataclass
class DraftWindow:
    tokens: tuple[int, ...]                 # d1..d_g of the next window, g ≤ γ (a context window: d1..d_L,
    #                                         L ≤ MAX_GAMMA; a window of zero: none, the target verifies [w0] alone)
    p_draft: torch.Tensor | None            # [γ, V] the exact law each token was drawn from (T > 0), CPU; a context
    #                                         window's is one-hot (a point mass)
    branch_row: int | None                  # the adopted branch row (a hit), or None (a fresh rollout)
    branches: tuple[tuple[int, ...], ...]   # every precomputed branch (row order = slot-major candidates)
    spans: list[SpanTuple] = field(default_factory=list)
    forwards: int = 0                       # draft row-forwards since the previous reply (a batch of R rows = R)
    produced: int = 0                       # draft tokens those row-forwards produced (η̄ = produced / forwards)
    source: str = SOURCE_MODEL              # SOURCES: where the window came from
    context: ContextProposal | None = None  # a context window's match and its modelled acceptance
    choice: WindowChoice | None = None      # why this window (and its length) was proposed (draft_choice.py)
    # a window of zero only: the step after it is a plain step too unless the token it commits is one of these (the
    # tokens after which the context could offer a window) or c is a hit; then the target lane posts that step's
    # ResolveRequest and starts the plain step at once, collecting this reply when it ends. None: ask first
    then_plain_unless: tuple[int, ...] | None = None
    promised: bool = False                  # made by the target lane: a window of zero promised, its reply to come

    @classmethod
    def promised_zero(cls) -> DraftWindow:
        """The window of zero the last reply promised, verified before the draft lane's reply for it is collected."""
        return cls((), None, None, (), source=SOURCE_ZERO, promised=True)


@dataclass(frozen=True)
class ExitReadout:
    """What the target lane read out at layer ℓ_e and sent as M_t (it stays on the target lane)."""
    topk_ids: tuple[tuple[int, ...], ...]       # [γ+1][κ] candidates sent per slot (−1 = pruned or none)
    topk_logprobs: tuple[tuple[float, ...], ...]  # [γ+1][κ] their log p_exit (before pruning)
    ranked: tuple[tuple[int, ...], ...]         # [γ+1][κ] every candidate by exit rank (before pruning)
    draft_is_top1: tuple[bool, ...]             # [γ] d_j was the exit's argmax at slot j
    delivered: bool                             # M_t reached the draft lane (False: the lane failed)
    t_readout: float                            # readout start = end of the target prefix (layers 1..ℓ_e)
    t_sent: float                               # M_t handed over = start of the target suffix
    t_verified: float = 0.0                     # end of the suffix (the verification pass)


def branch_rows(topk_ids: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
    """Row order of the branch batch: (slot index 0..γ, candidate) slot-major, skipping empty (−1) candidates."""
    return [(j, v) for j, cands in enumerate(topk_ids) for v in cands if v >= 0]


