"""Runners: everything the engine asks of a model, in token ids and positions, and what each declares it can do
(protocol.py).

fast.py (Llama family) and fast_ss.py (our SS draft) are the lean defaults; hf.py runs any supported
Hugging Face model; ss_reference.py is the SS draft through its own forward (the reference the fast
SS runner is tested against, runner choice "hf"). build_runner is the one place a runner is chosen;
exactness.py (check_rows) makes the target's logits independent of how many rows share a forward.
"""
from __future__ import annotations

import torch

from ..config import MirrorError
from .protocol import KernelChoice


def choose_kernel(choice: str, device, dtype: torch.dtype) -> KernelChoice:
    """The one place the kernel is decided, for a model on `device` loaded in `dtype` and a config.KERNEL_CHOICES
    choice: "torch" → none; a non-CPU device or a model not loaded in float32 → none (the kernel packs float32
    weights for CPU cores); "auto" → the best variant this machine builds and loads, else none with the reason; a
    named variant → it, or a MirrorError saying why it cannot run here."""
    from ..kernels import native

    if choice == "torch":
        return KernelChoice(None, "asked for: --kernel torch")
    if torch.device(device).type != "cpu":
        return KernelChoice(None, f"the kernel is for CPUs; the model runs on {device}")
    if dtype != torch.float32:
        return KernelChoice(None, f"the kernel takes float32 models; this one is loaded in "
                                  f"{str(dtype).removeprefix('torch.')}")
    lib = native.library(None if choice == "auto" else choice)
    if lib is None and choice != "auto":
        raise MirrorError(f"kernel {choice}: {native.unavailable(choice)}")
    return KernelChoice(lib, "" if lib is not None else native.unavailable(None))


def build_runner(model, vocab_size: int, choice: str = "auto", exit_head=None, kernel: str = "auto", blocks=None):
    """The runner for a loaded model: Llama-family weights and our SS drafts get the fast runners
    (unless choice is "hf": the generic Hugging Face runner, or the SS model's own forward). A target's trained
    exit head (exit_head.ExitHead, or None: the logit lens) is given to its runner here, and so is the exact
    small-row kernel (kernels/native.py; `kernel`: config.KERNEL_CHOICES) where it runs, with the model's own GGUF
    blocks (models/gguf_blocks.py: {parameter name: BlockWeights}) for its float32 format to stream."""
    from ..models.ss_draft import SSDraftForCausalLM
    from .fast import FAST_MODEL_TYPES, FastLlamaRunner
    from .fast_ss import FastSSRunner
    from .hf import HFRunner
    from .ss_reference import SSRunner

    if isinstance(model, SSDraftForCausalLM):
        return SSRunner(model, vocab_size) if choice == "hf" else FastSSRunner(model, vocab_size)
    if choice != "hf" and model.config.model_type in FAST_MODEL_TYPES:
        weight = model.get_input_embeddings().weight
        # outside the try: a kernel this CPU cannot run is the user's error to see
        kernel_choice = choose_kernel(kernel, weight.device, weight.dtype)
        try:
            return FastLlamaRunner(model, vocab_size, exit_head=exit_head, kernel=kernel_choice, blocks=blocks)
        except ValueError as exc:  # e.g. sequence-length-dependent RoPE: the generic runner handles it
            if choice == "fast":
                raise MirrorError(str(exc)) from None
    if choice == "fast" and model.config.model_type not in FAST_MODEL_TYPES:
        raise MirrorError(f"the fast runner supports {', '.join(FAST_MODEL_TYPES)}, not {model.config.model_type!r}")
    return HFRunner(model, vocab_size, exit_head=exit_head)


def set_kernel_threads(threads: int) -> None:
    """The calling thread's exact-kernel threads (kernels/native.py), in every kernel library loaded now or later."""
    from ..kernels import native

    native.set_kernel_threads(threads)


def kernel_threads() -> int:
    """The calling thread's exact-kernel threads (1 unless set)."""
    from ..kernels import native

    return native.kernel_threads()
