"""A lean runner for our speculative-streaming draft (mirror_core.models.ss_draft): SSRunner's interface, fast.

It is FastLlamaRunner's machinery (fused, transposed weights; a KV cache preallocated and indexed by
position; branch rows over a shared prefix read once) plus the lookahead streams:
- Stream j at position t enters the first multi-stream layer as main_t + P_j with RoPE position
  p_t + j, and from there on shares every projection and MLP call with the main rows: one layer
  pass over T main rows followed by T·n_str stream rows (t-major).
- Attention is one softmax over key blocks: the cached main keys (the shared prefix and each branch
  row's own entries), then the stream rows' own keys. Main row t sees main keys through t; stream
  row (t, j) sees the same main keys plus streams 1..j at t; main rows never see stream keys, so the
  main logits do not depend on the streams. Stream keys are never cached.
- Branch rows advance together in slots but each keeps a visibility mask over its own slots, so
  `rewind_rows` (self-verification rejected a row's newest lookahead entries) only hides entries,
  and each row's RoPE position moves back by what it hid.
The model's own forward (`SSRunner`, runner choice "hf") stays the reference these are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models.ops import attend_blocks, default_inv_freq, rms_norm, t_major_rows
from ..models.ss_draft import SSDraftForCausalLM
from .fast import FastCache, FastLlamaRunner
from .protocol import KernelChoice


@dataclass
class FastSSBranches:
    prefix: FastCache          # shared, read-only: row r sees its first valid[r] entries
    valid: torch.Tensor        # [R] long
    k: torch.Tensor            # [L, R, Hkv, S_own, D] each row's own entries, in slots shared by all rows
    v: torch.Tensor
    visible: torch.Tensor      # [R, S_own] bool: the own slots a row still sees (rewinds hide some)
    positions: torch.Tensor    # [R] long: the position of each row's next token
    own: int = 0               # slots used


class FastSSRunner(FastLlamaRunner):
    """Runner over SSDraftForCausalLM weights; main logits [.., T, V] and normed stream states [.., T, n, H]."""

    kernel = KernelChoice(None, "the SS draft's runner runs torch's matmul")
    plans_rows = False  # a draft's rounding never changes the output: its calls need no row plan
    exit_head = None    # a draft reads out nothing at ℓ_e

    def __init__(self, model: SSDraftForCausalLM, vocab_size: int | None = None, capacity: int = 512):
        cfg = model.config
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self.num_layers = cfg.num_hidden_layers
        self.num_streams = cfg.num_streams
        self.first_msa = model.first_msa_layer()
        self.vocab_size = int(vocab_size or cfg.vocab_size)
        self.h_q, self.h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // self.h_q
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.inv_freq = default_inv_freq(self.head_dim, cfg.rope_theta, self.device)       # [D/2]
        self.rope_scale = 1.0
        self.capacity = capacity
        self.max_positions = cfg.max_position_embeddings
        with torch.no_grad():
            self.embed = model.embed_tokens.weight.detach()                                    # [V, H]
            self.norm = model.norm.weight.detach()                                             # [H]
            self.stream_embed = model.stream_embed.detach().to(self.dtype)                     # [n, H] P_j
            self._keep_layers([self._layer(layer) for layer in model.layers],
                              self.embed[: self.vocab_size].t().contiguous())                  # LM head [H, V] (tied)

    # -- the shared layer loop ----------------------------------------------------------------
    def _layers(self, x: torch.Tensor, positions: torch.Tensor, streams: bool, write_kv, main_blocks,
                layers: list) -> tuple:
        """Run every layer over main rows x [B, T, H] at positions [B, T] (and, with streams, their
        lookahead rows from the first multi-stream layer on). write_kv(i, k, v) stores the main rows'
        keys/values [B, Hkv, T, D]; main_blocks(i) gives the main-key blocks the main rows may see.
        Returns the final main states [B, T, H] and normed stream states [B, T, n, H] (or None)."""
        b, t, h = x.shape
        n = self.num_streams if streams else 0
        main_rope = all_rope = self._rope(positions.unsqueeze(1))                           # [B, 1, T, D] each
        if n:
            t_of, j_of = t_major_rows(t, n, 1, self.device)  # stream rows: position index t, stream j (1..n), [T·n]
            all_rope = self._rope(torch.cat([positions, positions[:, t_of] + j_of], 1).unsqueeze(1))  # [B, 1, T(1+n), D]
            same_t = (t_of[:, None] == t_of[None, :]) & (j_of[None, :] <= j_of[:, None])    # [T·n, T·n]
        rows = x
        for i, layer in enumerate(layers):
            if n and i == self.first_msa:  # streams start as main_t + P_j
                rows = torch.cat([x, (x.unsqueeze(2) + self.stream_embed).reshape(b, t * n, h)], 1)  # [B, T(1+n), H]
            q, k, v = self._qkv(layer, rows, *(all_rope if rows.shape[1] > t else main_rope))
            write_kv(i, k[:, :, :t], v[:, :, :t])
            blocks = main_blocks(i)
            if rows.shape[1] > t:  # stream rows see what main row t sees, plus streams 1..j at t
                blocks = [(kb, vb, torch.cat([ok, ok[:, t_of]], 1)) for kb, vb, ok in blocks]
                ok_streams = torch.zeros(b, t * (1 + n), t * n, dtype=torch.bool, device=self.device)
                ok_streams[:, t:] = same_t
                blocks.append((k[:, :, t:], v[:, :, t:], ok_streams))
            rows = self._mlp_residual(layer, rows, attend_blocks(q, blocks, self.scale))
            x = rows[:, :t]
        states = rms_norm(rows[:, t:], self.norm, self.eps).view(b, t, n, h) if rows.shape[1] > t else None
        return x, states

    # -- one sequence ---------------------------------------------------------------------------
    def forward(self, cache: FastCache, ids: list[int], rows: int | None = None) -> torch.Tensor:
        logits = self._sequence(cache, ids, streams=False)[0]                             # [T, V]
        return logits if rows is None else logits[logits.shape[0] - rows:]

    def forward_streams(self, cache: FastCache, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._sequence(cache, ids, streams=True)

    @torch.inference_mode()
    def _sequence(self, cache: FastCache, ids: list[int], streams: bool):
        t, start = len(ids), cache.length
        end = start + t
        self._reserve(cache, end)
        x = self.embed[torch.tensor(ids, device=self.device)].unsqueeze(0)                   # [1, T, H]
        causal = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).unsqueeze(0)  # [1, T, S]

        def write_kv(i, k, v):
            cache.k[i, :, start:end], cache.v[i, :, start:end] = k[0], v[0]

        def main_blocks(i):
            return [(cache.k[i, :, :end].unsqueeze(0), cache.v[i, :, :end].unsqueeze(0), causal)]

        x, states = self._layers(x, torch.arange(start, end, device=self.device).unsqueeze(0), streams,
                                 write_kv, main_blocks, self.layers)
        cache.length = end
        return self._head(x)[0], None if states is None else states[0]                       # [T, V], [T, n, H]

    @torch.inference_mode()
    def stream_proposals(self, states: torch.Tensor) -> torch.Tensor:
        """Greedy lookahead tokens from normed stream states [..., n, H] → ids [..., n]."""
        return (states @ self.lm_head).argmax(-1)

    # -- branch rows ------------------------------------------------------------------------------
    @torch.inference_mode()
    def fork(self, cache: FastCache, valid_lengths: list[int]) -> FastSSBranches:
        rows = len(valid_lengths)
        shape = (self.num_layers, rows, self.h_kv, 16, self.head_dim)
        valid = torch.tensor(valid_lengths, device=self.device)
        return FastSSBranches(cache, valid, torch.empty(shape, dtype=self.dtype, device=self.device),
                              torch.empty(shape, dtype=self.dtype, device=self.device),
                              torch.zeros(rows, 16, dtype=torch.bool, device=self.device), valid.clone())

    @torch.inference_mode()
    def forward_rows(self, br: FastSSBranches, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [R, T] at each row's next positions; main logits [R, T, V] and stream states [R, T, n, H]."""
        rows, t = ids.shape
        own, end = br.own, br.own + t
        if end > br.k.shape[3]:
            grow = max(end, 2 * br.k.shape[3]) - br.k.shape[3]
            br.k, br.v = F.pad(br.k, (0, 0, 0, grow)), F.pad(br.v, (0, 0, 0, grow))
            br.visible = F.pad(br.visible, (0, grow))
        br.visible[:, own:end] = True
        p_len = int(br.valid.max())
        prefix_ok = (torch.arange(p_len, device=self.device) < br.valid.unsqueeze(1)).unsqueeze(1)  # [R, 1, P]
        own_ok = br.visible[:, :end].unsqueeze(1).repeat(1, t, 1)                            # [R, T, own+T]
        own_ok[:, :, own:] &= torch.ones(t, t, dtype=torch.bool, device=self.device).tril()  # causal among the new
        prefix_ok = prefix_ok.expand(rows, t, p_len)

        def write_kv(i, k, v):
            br.k[i, :, :, own:end], br.v[i, :, :, own:end] = k, v

        def main_blocks(i):
            return [(br.prefix.k[i, :, :p_len].unsqueeze(0), br.prefix.v[i, :, :p_len].unsqueeze(0), prefix_ok),
                    (br.k[i, :, :, :end], br.v[i, :, :, :end], own_ok)]

        positions = br.positions.unsqueeze(1) + torch.arange(t, device=self.device)         # [R, T]
        x, states = self._layers(self.embed[ids.to(self.device)], positions, True, write_kv, main_blocks,
                                 self.row_layers)
        br.own, br.positions = end, br.positions + t
        return self._head(x), states                                                         # [R, T, V], [R, T, n, H]

    @torch.inference_mode()
    def rewind_rows(self, br: FastSSBranches, drop: list[int]) -> None:
        """Hide each row's newest drop[r] visible entries (rejected lookahead) and move its position back."""
        for r, n in enumerate(drop):
            if n > 0:
                seen = br.visible[r, : br.own].nonzero().squeeze(-1)                          # [S_r]
                br.visible[r, seen[-n:]] = False
                br.positions[r] -= n

    @torch.inference_mode()
    def select_row(self, br: FastSSBranches, row: int) -> FastCache:
        valid = int(br.valid[row])
        keep = br.visible[row, : br.own].nonzero().squeeze(-1)                               # [S_row]
        cache = self.new_cache()
        self._reserve(cache, valid + len(keep))
        cache.k[:, :, :valid] = br.prefix.k[:, :, :valid]
        cache.v[:, :, :valid] = br.prefix.v[:, :, :valid]
        cache.k[:, :, valid: valid + len(keep)] = br.k[:, row, :, keep]
        cache.v[:, :, valid: valid + len(keep)] = br.v[:, row, :, keep]
        cache.length = valid + len(keep)
        return cache
