"""The peers a user would pick instead of this engine: transformers' greedy `generate` and assisted generation.

Both run the pair's Hugging Face models (loaded by models.load_model from the same paths as the
engine's pair) on the target's device, in this process, on every core when that device is the CPU
(as a plain `generate()` call would). Timing: `time.perf_counter` around the `generate()` call,
after `torch.cuda.synchronize()` on CUDA; it includes the prefill and transformers' per-call set-up,
not tokenisation. Both stop at the model's own EOS ids and at max_new_tokens, like `ar`, so equal
outputs have equal lengths. Assisted generation drafts a fixed γ tokens per window
(`num_assistant_tokens=γ`, constant schedule, confidence threshold off), as our `sd` does.
"""
from __future__ import annotations

import time

import torch

from .. import machine
from ..config import MirrorError
from ..machine import usable_cpus
from ..lanes.placement import pinned
from ..models.loading import ModelSpec, load_draft_over_target_vocab, load_model


class HFPeers:
    def __init__(self, target: str, draft: str | None, device: str):
        from transformers import GenerationMixin

        self.device = device
        self.target = load_model(ModelSpec(target, device))
        self.draft = None
        if draft is not None:
            self.draft = load_draft_over_target_vocab(ModelSpec(draft, device))  # a reduced draft: its full copy
            if not isinstance(self.draft, GenerationMixin):
                raise MirrorError(f"hf_assisted needs a Hugging Face causal LM as the draft; {draft!r} is a "
                                  f"{type(self.draft).__name__}, which assisted generation cannot drive; "
                                  "drop hf_assisted from --decoders")
        self.cpus = usable_cpus() if device == "cpu" else ()

    def generate(self, decoder: str, prompt_ids: tuple[int, ...], max_new_tokens: int,
                 gamma: int) -> tuple[tuple[int, ...], float]:
        """(new token ids, wall seconds) of one greedy call."""
        ids = torch.tensor([prompt_ids], device=self.target.device)
        kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                      min_new_tokens=0)
        if decoder == "hf_assisted":
            if self.draft is None:
                raise MirrorError("hf_assisted needs a draft model")
            kwargs |= dict(assistant_model=self.draft, num_assistant_tokens=gamma,
                           num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        with pinned(self.cpus, len(self.cpus)), torch.inference_mode():
            self._sync()
            t0 = time.perf_counter()
            out = self.target.generate(ids, **kwargs)
            self._sync()
            wall = time.perf_counter() - t0
        return tuple(out[0, len(prompt_ids):].tolist()), wall

    def _sync(self) -> None:
        machine.synchronize(self.target.device)
