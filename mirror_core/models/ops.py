"""The attention maths the fast runners and the SS draft model share: RoPE, RMS norm, grouped-query attention.

Pure functions, tensors in and tensors out. Each keeps the op order and dtypes its callers had, so
a caller's logits are bit-identical to what its own copy computed. It lives in models/ because the models
(ss_draft.py, feature_draft.py, exit_head.py, which training imports too) are written in it; the runners import it
from here (runners/ → models/, never the other way).
"""
from __future__ import annotations

import torch

Block = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # keys, values [B|1, Hkv, S, D]; may-attend [B|1, L, S] bool


def default_inv_freq(head_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """Llama's unscaled RoPE frequencies θ^(−2i/D) for i < D/2, fp32 [D/2]."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype,
                exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., D] for integer positions [...]: angles in fp32, cast once after the scaling
    (HF's `attention_scaling`; 1.0 leaves the values as they are), as Llama's rotary module does. exact: angles,
    cos and sin in float64, each value rounded once to dtype, so the tables are the same bits on every CPU (torch's
    float32 cos and sin are vectorised per CPU kind), as the exact kernel's one function needs."""
    work = torch.float64 if exact else torch.float32
    freqs = positions.to(work).unsqueeze(-1) * inv_freq.to(work)                          # [..., D/2]
    emb = torch.cat([freqs, freqs], -1)                                                  # [..., D]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


class RopeTable:
    """cos, sin [..., D] at integer positions [...]: rows of one rope_tables table for positions 0..S−1 (S doubling as
    needed), so a position's rows are the same bits in every call and a step does not recompute them."""

    def __init__(self, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype, exact: bool):
        self.inv_freq, self.scale, self.dtype, self.exact = inv_freq, scale, dtype, exact
        self.cos = self.sin = torch.empty(0, 0, dtype=dtype, device=inv_freq.device)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self.cos.shape[0]:
            size = max(need, 2 * self.cos.shape[0], 256)
            self.cos, self.sin = rope_tables(torch.arange(size, device=self.inv_freq.device), self.inv_freq,
                                             self.scale, self.dtype, exact=self.exact)     # [S, D] each
        return self.cos[positions], self.sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., D] by tables that broadcast against it, in LlamaAttention's rotate_half form."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last axis in fp32, cast back before the gain (LlamaRMSNorm's order)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def t_major_rows(t: int, per_t: int, first: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows laid out t-major, per_t rows per position numbered from first: each row's position index
    and row number, both [t·per_t] (SS streams: first=1 for stream rows only, 0 when row 0 is main)."""
    return (torch.arange(t, device=device).repeat_interleave(per_t),
            torch.arange(first, first + per_t, device=device).repeat(t))


def _group_queries(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [B, Hq, L, D] → [B, Hkv, rep·L, D]: each KV head's query heads as extra rows, so K/V are never copied."""
    b, h_q, rows, d = q.shape
    return q.reshape(b, num_kv_heads, h_q // num_kv_heads * rows, d)


def _group_mask(may_attend: torch.Tensor, rep: int) -> torch.Tensor:
    """may-attend [B|1, L, S] → [B|1, 1, rep·L, S], matching _group_queries' rows."""
    n, rows = may_attend.shape[:2]
    return may_attend.unsqueeze(1).unsqueeze(2).expand(-1, 1, rep, -1, -1).reshape(n, 1, rep * rows, -1)


def _merge_heads(out: torch.Tensor, q_shape: torch.Size) -> torch.Tensor:
    """Grouped output [B, Hkv, rep·L, D] → [B, L, Hq·D], the o_proj input."""
    b, h_q, rows, d = q_shape
    return out.reshape(b, h_q, rows, d).transpose(1, 2).reshape(b, rows, h_q * d)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, may_attend: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """q [B, Hq, L, D] against one key block [B|1, Hkv, S, D] (may-attend [B|1, L, S] bool, or None: all)
    → [B, L, Hq·D]. attend_blocks for a single block, without its concatenations: one sequence over
    its own cache, where one new token needs no mask at all."""
    rep = q.shape[1] // keys.shape[1]
    scores = (_group_queries(q, keys.shape[1]) @ keys.transpose(-1, -2)) * scale              # [B, Hkv, rep·L, S]
    if may_attend is not None:
        scores = scores.masked_fill(~_group_mask(may_attend, rep), float("-inf"))
    out = torch.softmax(scores.float(), -1).to(q.dtype) @ values                              # [B, Hkv, rep·L, D]
    return _merge_heads(out, q.shape)


def attend_blocks(q: torch.Tensor, blocks: list[Block], scale: float) -> torch.Tensor:
    """q [B, Hq, L, D] against several key blocks with one softmax → [B, L, Hq·D]: a shared prefix is
    read once for all branch rows ("cascade"), and stream rows see keys that are never cached."""
    b, _, rows, _ = q.shape
    h_kv = blocks[0][0].shape[1]
    qg = _group_queries(q, h_kv)                                                             # [B, Hkv, rep·L, D]
    scores = torch.cat([qg @ kb.transpose(-1, -2) for kb, _, _ in blocks], -1) * scale       # [B, Hkv, rep·L, ΣS]
    ok = _group_mask(torch.cat([m.expand(b, rows, -1) for _, _, m in blocks], -1), q.shape[1] // h_kv)
    w = torch.softmax(scores.masked_fill(~ok, float("-inf")).float(), -1).to(q.dtype)        # [B, Hkv, rep·L, ΣS]
    out, at = 0, 0
    for kb, vb, _ in blocks:
        out = out + w[..., at: at + kb.shape[2]] @ vb                                         # [B, Hkv, rep·L, D]
        at += kb.shape[2]
    return _merge_heads(out, q.shape)
