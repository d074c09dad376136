"""The peers a user would pick instead of this engine: transformers' greedy `generate` and assisted generation, and
llama.cpp on the target's own GGUF (`LlamaCppPeer`).

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


LLAMA_CPP_DECODERS = {"llama_cpp": "every", "llama_cpp_one": "one"}  # bench name → its threads: every core, or one
LLAMA_CPP_HINT = ("llama_cpp needs llama-cpp-python, which builds llama.cpp from source for several minutes and is not "
                  "in requirements.txt: CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python==0.3.36")


class LlamaCppPeer:
    """llama.cpp (through llama-cpp-python) on the target's own GGUF, greedy: what a CPU user runs instead of us.

    Its arithmetic is its own (Q4_1 × Q8_1 and Q8_0 × Q8_0 dot products), a different function from every format of
    ours, so its tokens may differ from ar's; the bench reports how far they agree, never requires it. Timing:
    `time.perf_counter` from the call to each token; the row's step is the median time between tokens (the decode
    step, comparable with ar's T_AR), and its wall time includes the prefill. `llama_cpp` runs on every core with one
    thread a core, `llama_cpp_one` on the first core with one thread."""

    def __init__(self, target: str, decoders: tuple[str, ...]):
        from ..models.loading import local_folder
        from ..models.prepared import find_gguf

        try:
            from llama_cpp import Llama
        except ImportError:
            raise MirrorError(LLAMA_CPP_HINT) from None
        path = find_gguf(local_folder(target))
        if path is None:
            raise MirrorError(f"llama_cpp runs the target's own GGUF, and {target!r} keeps none (a prepared registry "
                              "model does: python -m mirror_core prepare NAME)")
        every = usable_cpus()
        self.cpus = {name: every if LLAMA_CPP_DECODERS[name] == "every" else every[:1]
                     for name in decoders if name in LLAMA_CPP_DECODERS}
        # llama.cpp's batched prefill crashed (SIGILL) on an AMX host (BENCHMARKS.md's history): one token a batch there
        batch = 1 if machine.has_cpu_flags("amx_tile") else 512
        self.models = {name: Llama(model_path=path, n_threads=len(cpus), n_threads_batch=len(cpus), n_ctx=4096,
                                   n_batch=batch, n_ubatch=batch, flash_attn=False, verbose=False)
                       for name, cpus in self.cpus.items()}

    def generate(self, decoder: str, prompt_ids: tuple[int, ...], max_new_tokens: int,
                 eos_ids: frozenset[int]) -> tuple[tuple[int, ...], float, float]:
        """(new token ids, wall seconds, median seconds between tokens) of one greedy run from an empty cache."""
        llm = self.models[decoder]
        llm.reset()  # else llama-cpp-python reuses the cached prompt of the last call
        tokens, stamps = [], []
        with pinned(self.cpus[decoder], len(self.cpus[decoder])):
            t0 = time.perf_counter()
            for tok in llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
                stamps.append(time.perf_counter())
                tokens.append(int(tok))
                if tok in eos_ids or len(tokens) >= max_new_tokens:
                    break
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
        return tuple(tokens), stamps[-1] - t0, gaps[len(gaps) // 2] if gaps else stamps[-1] - t0
