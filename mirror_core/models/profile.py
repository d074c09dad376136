"""A draft's acceptance profile (draft_profile.json in its folder): how often its tokens and its pair's early-exit
candidates were right on held-out answers when it was trained. The engine feeds it, with this machine's measured
step costs, to the latency model to choose γ and κ at load (latency.choose_spec)."""
from __future__ import annotations

import json
import os

from ..config import MirrorError
from ..latency import DraftProfile

FILE = "draft_profile.json"


def save_profile(folder: str, accept: list[float], hit: list[float], measured: str,
                 tau_by_gamma: list[float] | None = None, hit_by_gamma: list[list[float]] | None = None) -> None:
    record = {"accept_by_depth": [round(a, 4) for a in accept], "hit_by_kappa": [round(h, 4) for h in hit]}
    if tau_by_gamma:
        record["tau_by_gamma"] = [round(t, 4) for t in tau_by_gamma]
    if hit_by_gamma:
        record["hit_by_gamma_kappa"] = [[round(h, 4) for h in row] for row in hit_by_gamma]
    with open(os.path.join(folder, FILE), "w", encoding="utf-8") as f:
        json.dump({**record, "measured": measured}, f, indent=1)


def load_profile(folder: str | None) -> DraftProfile | None:
    """The folder's profile, or None when it has none (settings then stay at the defaults)."""
    path = os.path.join(folder or "", FILE)
    if not folder or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        accept, hit = tuple(float(a) for a in record["accept_by_depth"]), tuple(float(h) for h in record["hit_by_kappa"])
        tau = tuple(float(t) for t in record.get("tau_by_gamma", ()))
        by_gamma = tuple(tuple(float(h) for h in row) for row in record.get("hit_by_gamma_kappa", ()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MirrorError(f"cannot read {path}: {exc}") from None
    if not accept or not hit or not all(0.0 <= v <= 1.0 for v in accept + hit):
        raise MirrorError(f"{path}: accept_by_depth and hit_by_kappa must be non-empty lists of shares in 0..1")
    if any(t < 1.0 or t > g + 1 for g, t in enumerate(tau, 1)):
        raise MirrorError(f"{path}: tau_by_gamma[γ − 1] must lie in 1..γ + 1 (tokens per target pass at γ)")
    if not all(row and all(0.0 <= h <= 1.0 for h in row) for row in by_gamma):
        raise MirrorError(f"{path}: hit_by_gamma_kappa must hold non-empty rows of shares in 0..1")
    return DraftProfile(accept, hit, tau, by_gamma)
