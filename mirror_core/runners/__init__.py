"""Runners: everything the engine asks of a model, in token ids and positions (protocol.py).

fast.py (Llama family) and fast_ss.py (our SS draft) are the lean defaults; hf.py runs any supported
Hugging Face model; ss_reference.py is the SS draft through its own forward (the reference the fast
SS runner is tested against, runner choice "hf"). build_runner is the one place a runner is chosen;
check_rows makes the target's logits independent of how many rows share a forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import MirrorError


def build_runner(model, vocab_size: int, choice: str = "auto"):
    """The runner for a loaded model: Llama-family weights and our SS drafts get the fast runners
    (unless choice is "hf": the generic Hugging Face runner, or the SS model's own forward)."""
    from ..modeling_ss_draft import SSDraftForCausalLM
    from .fast import FAST_MODEL_TYPES, FastLlamaRunner
    from .fast_ss import FastSSRunner
    from .hf import HFRunner
    from .ss_reference import SSRunner

    if isinstance(model, SSDraftForCausalLM):
        return SSRunner(model, vocab_size) if choice == "hf" else FastSSRunner(model, vocab_size)
    if choice != "hf" and model.config.model_type in FAST_MODEL_TYPES:
        try:
            return FastLlamaRunner(model, vocab_size)
        except ValueError as exc:  # e.g. sequence-length-dependent RoPE: the generic runner handles it
            if choice == "fast":
                raise MirrorError(str(exc)) from None
    if choice == "fast" and model.config.model_type not in FAST_MODEL_TYPES:
        raise MirrorError(f"the fast runner supports {', '.join(FAST_MODEL_TYPES)}, not {model.config.model_type!r}")
    return HFRunner(model, vocab_size)


@dataclass(frozen=True)
class RowCheck:
    """Whether the target computes each position's logits bit for bit the same one token at a time (AR) and
    inside windows of 2..17 rows (SD, Mirror-SD), as measured when the pair was loaded."""

    min_rows: int          # rows every target forward is padded to (1: none)
    row_exact: bool        # runners/fast.py's row-exact mode: two-row floor, key-bucketed attention
    invariant: bool        # after the above, every window's logits equal the one-at-a-time logits, bitwise
    differing: int         # logits (of the V per position) that differed before, summed over the window sizes
    checked: bool = True   # False: this runner has no row-exact mode (HFRunner), nothing was measured


@torch.inference_mode()
def check_rows(runner, vocab_size: int) -> RowCheck:
    """Measure, on this machine with the calling thread's settings, whether the target's logits for a position
    depend on how its call was shaped, and if so switch the runner to row-exact mode and measure again.

    Lossless decoding needs the target to be one function: AR computes each token in a one-row call, SD and
    Mirror-SD inside windows of γ + 1 rows. Kernels whose rounding depends on the call's shape (a
    matrix-vector path for one row; a longer key axis in attention) can flip a near-tie, and then AR's and
    Mirror-SD's tokens differ.
    """
    if not hasattr(runner, "row_exact"):
        return RowCheck(1, False, False, 0, checked=False)
    from .fast import EXACT_ROWS

    prefix = [(7 * i + 3) % vocab_size for i in range(56)]  # any fixed context; the window crosses a key bucket (64)
    probe = [(11 * i + 5) % vocab_size for i in range(EXACT_ROWS)]

    def differing() -> int:
        cache = runner.new_cache()
        runner.forward(cache, prefix)
        one_at_a_time = torch.cat([runner.forward(cache, [token]) for token in probe])  # [17, V], AR's path
        runner.truncate(cache, len(prefix))
        total = 0
        for rows in range(2, EXACT_ROWS + 1):
            total += int((runner.forward(cache, probe[:rows]) != one_at_a_time[:rows]).sum())
            runner.truncate(cache, len(prefix))
        return total

    before = differing()
    if before:
        runner.row_exact = True
    return RowCheck(runner.min_rows, runner.row_exact, before == 0 or differing() == 0, before)
