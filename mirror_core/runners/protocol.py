"""The runner interface: everything the engine asks of a model, in token ids and positions.

A runner owns its KV layout. The engine only moves positions: it appends windows, truncates
after a rejection, forks a cache into branch rows that each see their own prefix of it, advances
those rows one token at a time, and adopts one row. Nothing here knows about transformers; the
Hugging Face implementation is `runners/hf.py: HFRunner`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class ExitPass:
    """A target forward stopped after layer ℓ_e (Runner.forward_to_exit); Runner.finish_pass runs the rest."""
    h: torch.Tensor  # h^(ℓ_e) [T, H] (float32): the exit layer's hidden state at every new position
    layer: int       # ℓ_e
    rest: Any        # the runner's own state for layers ℓ_e+1..N (hidden state, masks, cache, positions)


class Runner(Protocol):
    """What the engine asks of any model, draft or target."""

    num_layers: int   # N: decoder layers
    num_streams: int  # lookahead streams of a speculative-streaming draft (0: one token per forward)
    vocab_size: int   # V: logits are sliced to this width
    device: torch.device               # where inputs go (the embedding's device)
    devices: tuple[torch.device, ...]  # every device the model's weights are on (several: a spread target)
    exit_head: Any                     # a target's trained exit head (exit_head.ExitHead), given when the runner is
                                       # built (runners.build_runner); None: the logit lens

    def new_cache(self) -> Any:
        """An empty sequence cache (batch of one)."""

    def cache_len(self, cache: Any) -> int:
        """Tokens held; the next appended token gets this position."""

    def forward(self, cache: Any, ids: list[int]) -> torch.Tensor:
        """Append ids at positions cache_len.. and return logits [T, V] (float32)."""

    def truncate(self, cache: Any, length: int) -> None:
        """Keep the first `length` tokens."""

    def fork(self, cache: Any, valid_lengths: list[int]) -> Any:
        """Branch rows over a shared cache: row r sees only its first valid_lengths[r] tokens and
        its next token gets position valid_lengths[r]."""

    def forward_rows(self, branches: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ids [R, T] at each row's next positions; returns logits [R, T, V] and, for a
        speculative-streaming draft, lookahead-stream states [R, T, n_str, H] (else None)."""

    # Speculative-streaming drafts (num_streams > 0) also provide:
    #   forward_streams(cache, ids) -> (logits [T, V], stream states [T, n_str, H])
    #   stream_proposals(states [..., n_str, H]) -> greedy lookahead ids [..., n_str]
    #   rewind_rows(branches, drop: list[int]) hides each row's newest drop[r] entries.

    def select_row(self, branches: Any, row: int) -> Any:
        """A sequence cache holding row `row`'s visible prefix followed by that row's own tokens."""


class TargetRunner(Runner, Protocol):
    """A target's runner (FastLlamaRunner, HFRunner) also splits its forward at the early exit, so that the draft
    lane can start on h^(ℓ_e) while layers ℓ_e+1..N run, and reads candidates out at ℓ_e."""

    def forward_to_exit(self, cache: Any, ids: list[int], layer: int) -> ExitPass:
        """Layers 1..ℓ_e of forward(cache, ids), the same arithmetic; the cache is not used again before
        finish_pass."""

    def finish_pass(self, exit_pass: ExitPass) -> torch.Tensor:
        """Layers ℓ_e+1..N and the head of that pass: logits [T, V], equal to what forward(cache, ids) returns."""

    def exit_readout(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """The layer-ℓ_e readout of h [T, H]: the trained exit head when it reads this layer, else the logit
        lens final_norm(h) · W_LM → logits [T, V] (float32)."""
