"""Runner over our speculative-streaming draft (mirror_core.models.ss_draft) through the model's own forward.

The reference (runner choice "hf"); the default is the lean `fast_ss_runner.FastSSRunner`, tested
against this one.

Same interface as HFRunner, plus streams: `forward_streams` and `forward_rows` return the main
stream's logits [.., T, V] and the n_str lookahead streams' normed states [.., T, n_str, H];
`stream_proposals` applies the head only where the caller needs the lookahead (one position per
row: the head over every stream row can cost more than the layers; measured: BENCHMARKS.md's history). Only the main
stream has KV; branch rows share a forked cache and see their own prefix through a key mask, and
`rewind_rows` hides the entries of lookahead tokens a row's self-verification rejected.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.ss_draft import KVCache, SSDraftForCausalLM, cache_length, truncate_cache
from .protocol import KernelChoice, WholeModelFormats


@dataclass
class SSCache:
    kv: KVCache | None = None


@dataclass
class SSBranches:
    kv: KVCache
    mask: torch.Tensor       # [R, S] bool: True where the row may attend
    positions: torch.Tensor  # [R] long: the position of the row's next token


class SSRunner(WholeModelFormats):
    """The SS draft through its own forward (the reference FastSSRunner is tested against)."""

    kernel = KernelChoice(None, "the SS draft's own forward has no kernel")
    plans_rows = False
    row_plan = None
    reads_features = False
    exit_head = None
    weight_stream = None

    def __init__(self, model: SSDraftForCausalLM, vocab_size: int | None = None):
        self.model = model.eval()
        self.num_layers = model.config.num_hidden_layers
        self.num_streams = model.config.num_streams
        self.vocab_size = int(vocab_size or model.config.vocab_size)
        self.max_positions = model.config.max_position_embeddings
        self.device = model.embed_tokens.weight.device
        self.devices = (self.device,)
    def new_cache(self) -> SSCache:
        return SSCache()

    def cache_len(self, cache: SSCache) -> int:
        return cache_length(cache.kv)

    def forward(self, cache: SSCache, ids: list[int], rows: int | None = None) -> torch.Tensor:
        logits = self._forward(cache, ids, with_streams=False)[0]                         # [T, V]
        return logits if rows is None else logits[logits.shape[0] - rows:]

    def forward_streams(self, cache: SSCache, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._forward(cache, ids, with_streams=True)

    @torch.inference_mode()
    def _forward(self, cache: SSCache, ids: list[int], with_streams: bool):
        x = torch.tensor([ids], dtype=torch.long, device=self.device)                        # [1, T]
        out = self.model(x, cache=cache.kv, with_streams=with_streams, stream_head=False)
        cache.kv = out.cache
        streams = out.stream_states[0] if with_streams else None                          # [T, n, H]
        return out.logits[0, :, : self.vocab_size].float(), streams                        # [T, V]

    @torch.inference_mode()
    def stream_proposals(self, states: torch.Tensor) -> torch.Tensor:
        """Greedy lookahead tokens from stream states [..., n, H] → ids [..., n]."""
        return self.model.head(states)[..., : self.vocab_size].argmax(-1)

    def truncate(self, cache: SSCache, length: int) -> None:
        if cache.kv is not None and self.cache_len(cache) > length:
            cache.kv = truncate_cache(cache.kv, length)

    def fork(self, cache: SSCache, valid_lengths: list[int]) -> SSBranches:
        rows, s = len(valid_lengths), self.cache_len(cache)
        kv = [(k.expand(rows, -1, -1, -1).contiguous(), v.expand(rows, -1, -1, -1).contiguous())  # [R, H_kv, S, D]
              for k, v in cache.kv]
        lengths = torch.tensor(valid_lengths, device=self.device)                              # [R]
        mask = torch.arange(s, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)         # [R, S]
        return SSBranches(kv, mask, lengths.clone())

    @torch.inference_mode()
    def forward_rows(self, br: SSBranches, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [R, T] at each row's next positions; returns main logits [R, T, V] and stream states [R, T, n, H]."""
        rows, t = ids.shape
        pos = br.positions.unsqueeze(1) + torch.arange(t, device=self.device)                  # [R, T]
        br.mask = torch.cat([br.mask, torch.ones(rows, t, dtype=torch.bool, device=self.device)], 1)  # [R, S+T]
        out = self.model(ids.to(self.device), position_ids=pos, cache=br.kv, attention_mask=br.mask, stream_head=False)
        br.kv = out.cache
        br.positions = br.positions + t
        return out.logits[..., : self.vocab_size].float(), out.stream_states                 # [R, T, V], [R, T, n, H]

    @torch.inference_mode()
    def rewind_rows(self, br: SSBranches, drop: list[int]) -> None:
        """Hide each row's newest drop[r] entries (rejected lookahead tokens) and move its position back."""
        for r, n in enumerate(drop):
            if n > 0:
                visible = br.mask[r].nonzero().squeeze(-1)                                    # [S_r]
                br.mask[r, visible[-n:]] = False
                br.positions[r] -= n

    def select_row(self, br: SSBranches, row: int) -> SSCache:
        keep = br.mask[row].nonzero().squeeze(-1)                                             # [S_row]
        return SSCache([(k[row: row + 1, :, keep].contiguous(), v[row: row + 1, :, keep].contiguous())
                        for k, v in br.kv])
