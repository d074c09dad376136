"""Acceptance rules: greedy, Rule E (exact match, the paper's) and Rule R (rejection sampling).

Pure functions of logits, draft tokens and randomness; no model calls, no cache changes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingConfig
from .sampling import argmax_last, keyed_uniform, probs, sample_inverse_cdf, target_token


@dataclass(frozen=True)
class AcceptResult:
    accepted: int                 # A_t: length of the accepted draft prefix
    token: int                    # c: correction (A_t < D_t) or bonus (A_t = D_t)
    target_tokens: tuple[int, ...]  # argmax p_target per slot 1..D_t+1 (for the exit-overlap metric)


def accept(logits_target: torch.Tensor, draft: list[int], cfg: SamplingConfig, first_position: int,
           p_draft: torch.Tensor | None, gen: torch.Generator | None) -> AcceptResult:
    """Run the request's rule over the window; slot j predicts the token at first_position + j - 1."""
    argmax = tuple(int(t) for t in argmax_last(logits_target).tolist())  # [D+1]
    if not draft:  # a window of zero: the target's own token at this position, drawn as ar draws it
        return AcceptResult(0, argmax[0] if cfg.greedy else target_token(logits_target[0], cfg, first_position), argmax)
    if cfg.greedy:
        a = 0
        while a < len(draft) and draft[a] == argmax[a]:
            a += 1
        return AcceptResult(a, argmax[a], argmax)
    if cfg.rule == "exact":
        return _accept_exact(logits_target, draft, cfg, first_position, argmax)
    return _accept_rejection(logits_target, draft, cfg, p_draft, gen, argmax)


def _accept_exact(logits_target, draft, cfg, first_position, argmax) -> AcceptResult:
    """Rule E: draw y_j ~ p_target(slot j) with the position-keyed sampler; stop at the first y_j ≠ d_j."""
    for j in range(len(draft) + 1):
        p_target = probs(logits_target[j], cfg)  # [V]
        y = sample_inverse_cdf(p_target, keyed_uniform(cfg.seed, first_position + j))
        if j == len(draft) or y != draft[j]:
            return AcceptResult(j, y, argmax)
    raise AssertionError("unreachable")


def _accept_rejection(logits_target, draft, cfg, p_draft, gen, argmax) -> AcceptResult:
    """Rule R (Leviathan/Chen): accept d_j w.p. min(1, p_target/p_draft); resample from the residual."""
    if p_draft is None or p_draft.shape[0] < len(draft):
        raise ValueError("rule 'rejection' needs p_draft for every draft token")
    p_target = probs(logits_target, cfg).cpu()  # [D+1, V]
    for j, d in enumerate(draft):
        ratio = float(p_target[j, d]) / max(float(p_draft[j, d]), 1e-30)
        u = float(torch.rand((), generator=gen, dtype=torch.float64))
        if u >= min(1.0, ratio):
            residual = (p_target[j] - p_draft[j]).clamp_min(0.0)  # [V]
            if float(residual.sum()) <= 0.0:  # p_draft == p_target numerically; any target sample is exact
                residual = p_target[j]
            c = sample_inverse_cdf(residual, float(torch.rand((), generator=gen, dtype=torch.float64)))
            return AcceptResult(j, c, argmax)
    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    return AcceptResult(len(draft), sample_inverse_cdf(p_target[len(draft)], u), argmax)
