"""The runner interface: everything the engine asks of a model, in token ids and positions.

A runner owns its KV layout. The engine only moves positions: it appends windows, truncates
after a rejection, forks a cache into branch rows that each see their own prefix of it, advances
those rows one token at a time, and adopts one row. Nothing here knows about transformers; the
Hugging Face implementation is `runners/hf.py: HFRunner`.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

ExitCallback = Callable[[torch.Tensor], None]  # receives h^(ℓ_e) [T, H] (float32) mid-forward


class Runner(Protocol):
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

    def forward(self, cache: Any, ids: list[int], exit_layer: int | None = None,
                on_exit: ExitCallback | None = None) -> torch.Tensor:
        """Append ids at positions cache_len.. and return logits [T, V] (float32).

        With exit_layer ℓ_e, on_exit is called with the hidden state after layer ℓ_e [T, H] before
        layers ℓ_e+1..N run, so another lane can start meanwhile (exit_readout turns it into candidates'
        logits; a feature-reading draft reads it as it is).
        """

    def exit_readout(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """The layer-ℓ_e readout of h [T, H]: the trained exit head when it reads this layer, else the logit
        lens final_norm(h) · W_LM → logits [T, V] (float32)."""

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
