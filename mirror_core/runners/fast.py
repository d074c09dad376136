"""A lean runner for Llama-family weights (Llama, Mistral, Qwen2, Qwen3): the same interface as HFRunner.

What makes it fast on a CPU (measured, docs/BENCHMARKS.md): weights stored transposed as (in, out)
and fused (q|k|v and gate|up), so single-row matmuls stream weights at full bandwidth; a KV cache
preallocated and indexed by position (truncation is an integer); no mask building or cache
objects per call; and branch rows that attend to the shared prefix once ("cascade" attention)
instead of copying it per row. Layers ≤ ℓ_e and > ℓ_e are plain loops, so the early-exit readout
sits between them. RoPE frequencies come from the model's own rotary module (any scaling type
whose frequencies do not depend on the sequence length).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .protocol import ExitCallback

FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
Block = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # keys, values [B|1, Hkv, S, D]; may-attend [B|1, L, S]


@dataclass
class _Layer:
    ln1: torch.Tensor          # [H]
    w_qkv: torch.Tensor        # [H, (Hq + 2·Hkv)·D]
    b_qkv: torch.Tensor | None  # [(Hq + 2·Hkv)·D] (Qwen2)
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D]
    w_o: torch.Tensor          # [Hq·D, H]
    ln2: torch.Tensor          # [H]
    w_gate_up: torch.Tensor    # [H, 2·I]
    w_down: torch.Tensor       # [I, H]


@dataclass
class FastCache:
    k: torch.Tensor   # [L, Hkv, S_max, D]
    v: torch.Tensor   # [L, Hkv, S_max, D]
    length: int = 0


@dataclass
class FastBranches:
    prefix: FastCache         # shared, read-only: every row sees its first valid[r] entries
    valid: torch.Tensor       # [R] long
    k: torch.Tensor           # [L, R, Hkv, S_own, D] each row's own entries
    v: torch.Tensor
    own: int = 0              # entries each row holds in k/v (all rows advance together)


class FastLlamaRunner:
    def __init__(self, model, vocab_size: int | None = None, capacity: int = 512):
        cfg = model.config
        if cfg.model_type not in FAST_MODEL_TYPES:
            raise ValueError(f"fast runner supports {FAST_MODEL_TYPES}, not {cfg.model_type!r}")
        rotary = model.model.rotary_emb
        if getattr(rotary, "rope_type", "default") == "dynamic":
            raise ValueError("dynamic RoPE scaling depends on the sequence length; use the generic runner")
        self.device = model.model.embed_tokens.weight.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.num_layers = cfg.num_hidden_layers
        self.num_streams = 0
        self.vocab_size = int(vocab_size or cfg.vocab_size)
        self.h_q, self.h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.h_q
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.inv_freq = rotary.inv_freq.to(self.device, torch.float32)                 # [D/2]
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.capacity = capacity
        with torch.no_grad():
            self.embed = model.model.embed_tokens.weight.detach()                          # [V, H]
            self.norm = model.model.norm.weight.detach()                                   # [H]
            self.lm_head = model.lm_head.weight.detach()[: self.vocab_size].t().contiguous()  # [H, V]
            self.layers = [self._layer(layer) for layer in model.model.layers]

    @staticmethod
    def _layer(layer) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        w_qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0).t().contiguous()
        b_qkv = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if a.q_proj.bias is not None else None
        qn = getattr(a, "q_norm", None)
        kn = getattr(a, "k_norm", None)
        return _Layer(layer.input_layernorm.weight.detach(), w_qkv.detach(), None if b_qkv is None else b_qkv.detach(),
                      None if qn is None else qn.weight.detach(), None if kn is None else kn.weight.detach(),
                      a.o_proj.weight.detach().t().contiguous(), layer.post_attention_layernorm.weight.detach(),
                      torch.cat([m.gate_proj.weight, m.up_proj.weight], 0).detach().t().contiguous(),
                      m.down_proj.weight.detach().t().contiguous())

    # -- building blocks -------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq                         # [..., T, D/2]
        emb = torch.cat([freqs, freqs], -1)                                              # [..., T, D]
        return (emb.cos() * self.rope_scale).to(self.dtype), (emb.sin() * self.rope_scale).to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos, sin):
        """x [B, T, H] → q [B, Hq, T, D], k and v [B, Hkv, T, D] with RoPE applied."""
        b, t, _ = x.shape
        qkv = self._rms(x, layer.ln1) @ layer.w_qkv                                       # [B, T, (Hq+2Hkv)·D]
        if layer.b_qkv is not None:
            qkv = qkv + layer.b_qkv
        d = self.head_dim
        q, k, v = qkv.split([self.h_q * d, self.h_kv * d, self.h_kv * d], -1)
        q = q.view(b, t, self.h_q, d)
        k = k.view(b, t, self.h_kv, d)
        if layer.q_norm is not None:
            q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
        q = self._rotate(q.transpose(1, 2), cos, sin)                                     # [B, Hq, T, D]
        k = self._rotate(k.transpose(1, 2), cos, sin)                                     # [B, Hkv, T, D]
        return q, k, v.view(b, t, self.h_kv, d).transpose(1, 2)

    def _mlp_residual(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn @ layer.w_o                                                          # [B, T, H]
        gate, up = (self._rms(x, layer.ln2) @ layer.w_gate_up).chunk(2, -1)              # [B, T, I] each
        return x + (F.silu(gate) * up) @ layer.w_down

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return (self._rms(x, self.norm) @ self.lm_head).float()                          # [..., V]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None):
        """q [B, Hq, T, D] against keys/values [B, Hkv, S, D] (GQA without copying), mask [B|1, T, S] bool."""
        b, _, t, d = q.shape
        rep = self.h_q // self.h_kv
        qg = q.reshape(b, self.h_kv, rep * t, d)                                         # [B, Hkv, rep·T, D]
        scores = (qg @ keys.transpose(-1, -2)) * self.scale                              # [B, Hkv, rep·T, S]
        if mask is not None:
            m = mask.unsqueeze(1).unsqueeze(2).expand(-1, 1, rep, t, -1).reshape(mask.shape[0], 1, rep * t, -1)
            scores = scores.masked_fill(~m, float("-inf"))
        out = torch.softmax(scores.float(), -1).to(q.dtype) @ values                      # [B, Hkv, rep·T, D]
        return out.reshape(b, self.h_q, t, d).transpose(1, 2).reshape(b, t, self.h_q * d)  # [B, T, Hq·D]

    # -- sequences -------------------------------------------------------------------------
    def new_cache(self) -> FastCache:
        shape = (self.num_layers, self.h_kv, self.capacity, self.head_dim)
        return FastCache(torch.empty(shape, dtype=self.dtype, device=self.device),
                         torch.empty(shape, dtype=self.dtype, device=self.device))

    def cache_len(self, cache: FastCache) -> int:
        return cache.length

    def _reserve(self, cache: FastCache, need: int) -> None:
        if need > cache.k.shape[2]:
            grow = max(need, 2 * cache.k.shape[2]) - cache.k.shape[2]
            pad = (0, 0, 0, grow)
            cache.k, cache.v = F.pad(cache.k, pad), F.pad(cache.v, pad)

    @torch.inference_mode()
    def forward(self, cache: FastCache, ids: list[int], exit_layer: int | None = None,
                on_exit: ExitCallback | None = None) -> torch.Tensor:
        t, start = len(ids), cache.length
        end = start + t
        self._reserve(cache, end)
        x = self.embed[torch.tensor(ids, device=self.device)].unsqueeze(0)               # [1, T, H]
        cos, sin = self._rope(torch.arange(start, end, device=self.device))               # [T, D]
        mask = None
        if t > 1:  # causal among the new tokens; the cached prefix is visible to all
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).unsqueeze(0)  # [1, T, S]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            cache.k[i, :, start:end] = k[0]
            cache.v[i, :, start:end] = v[0]
            attn = self._attend(q, cache.k[i, :, :end].unsqueeze(0), cache.v[i, :, :end].unsqueeze(0), mask)
            x = self._mlp_residual(layer, x, attn)
            if on_exit is not None and i + 1 == exit_layer:
                on_exit(self._head(x)[0])                                                 # [T, V]
        cache.length = end
        return self._head(x)[0]                                                           # [T, V]

    def truncate(self, cache: FastCache, length: int) -> None:
        cache.length = min(cache.length, length)

    # -- branch rows (cascade attention: the shared prefix is read once for all rows) ----------
    def fork(self, cache: FastCache, valid_lengths: list[int]) -> FastBranches:
        rows = len(valid_lengths)
        shape = (self.num_layers, rows, self.h_kv, 16, self.head_dim)
        return FastBranches(cache, torch.tensor(valid_lengths, device=self.device),
                            torch.empty(shape, dtype=self.dtype, device=self.device),
                            torch.empty(shape, dtype=self.dtype, device=self.device))

    @torch.inference_mode()
    def forward_rows(self, br: FastBranches, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows, t = ids.shape
        if br.own + t > br.k.shape[3]:
            pad = (0, 0, 0, max(br.own + t, 2 * br.k.shape[3]) - br.k.shape[3])
            br.k, br.v = F.pad(br.k, pad), F.pad(br.v, pad)
        p_len = int(br.valid.max())
        positions = br.valid.unsqueeze(1) + br.own + torch.arange(t, device=self.device)  # [R, T]
        cos, sin = self._rope(positions.unsqueeze(1))                                     # [R, 1, T, D]
        prefix_ok = (torch.arange(p_len, device=self.device) < br.valid.unsqueeze(1)).unsqueeze(1)  # [R, 1, P]
        own_ok = torch.ones(t, br.own + t, dtype=torch.bool, device=self.device).tril(br.own)[None]  # [1, T, own+T]
        x = self.embed[ids.to(self.device)]                                               # [R, T, H]
        end = br.own + t
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            br.k[i, :, :, br.own: end] = k
            br.v[i, :, :, br.own: end] = v
            # cascade: the shared prefix is read once for all rows, then each row's own entries
            prefix = (br.prefix.k[i, :, :p_len].unsqueeze(0), br.prefix.v[i, :, :p_len].unsqueeze(0), prefix_ok)
            attn = self._attend_blocks(q, [prefix, (br.k[i, :, :, :end], br.v[i, :, :, :end], own_ok)])
            x = self._mlp_residual(layer, x, attn)
        br.own += t
        return self._head(x), None                                                       # [R, T, V]

    def _attend_blocks(self, q: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        """q [B, Hq, L, D] against key blocks with one softmax (GQA without copying) → [B, L, Hq·D]."""
        b, _, rows, d = q.shape
        rep = self.h_q // self.h_kv
        qg = q.reshape(b, self.h_kv, rep * rows, d)                                          # [B, Hkv, rep·L, D]
        scores = torch.cat([qg @ kb.transpose(-1, -2) for kb, _, _ in blocks], -1) * self.scale  # [B, Hkv, rep·L, ΣS]
        ok = torch.cat([m.expand(b, rows, -1) for _, _, m in blocks], -1)                    # [B, L, ΣS]
        ok = ok.unsqueeze(1).unsqueeze(2).expand(-1, 1, rep, -1, -1).reshape(b, 1, rep * rows, -1)
        w = torch.softmax(scores.masked_fill(~ok, float("-inf")).float(), -1).to(q.dtype)  # [B, Hkv, rep·L, ΣS]
        out, at = 0, 0
        for kb, vb, _ in blocks:
            out = out + w[..., at: at + kb.shape[2]] @ vb                                     # [B, Hkv, rep·L, D]
            at += kb.shape[2]
        return out.reshape(b, self.h_q, rows, d).transpose(1, 2).reshape(b, rows, self.h_q * d)

    def select_row(self, br: FastBranches, row: int) -> FastCache:
        valid = int(br.valid[row])
        cache = self.new_cache()
        self._reserve(cache, valid + br.own)
        cache.k[:, :, :valid] = br.prefix.k[:, :, :valid]
        cache.v[:, :, :valid] = br.prefix.v[:, :, :valid]
        cache.k[:, :, valid: valid + br.own] = br.k[:, row, :, : br.own]
        cache.v[:, :, valid: valid + br.own] = br.v[:, row, :, : br.own]
        cache.length = valid + br.own
        return cache
