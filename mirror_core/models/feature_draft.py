"""The feature-reading draft (EAGLE-style): a one- or two-layer decoder that reads the target's exit-layer features.

Mirror-SD computes the target's hidden state after layer ℓ_e for every window slot before the draft starts its
branches (it is what the early-exit candidates are read from). This draft takes that state as an input. At position
i it reads the next token x_{i+1} and a feature f_i [H]: the target's h^(ℓ_e)_i where the target has computed it
(committed positions, and the window slots that M_t carries), else its own prediction of it:

    u_i      = W_fc · [embed(x_{i+1}); f_i]                                              # [H]
    g_i      = decoder layers(u_≤i)   (Llama layers, RoPE at position i)                 # [H] ≈ f_{i+1}
    logits_i = rms_norm(g_i · A + b, g_o) · Eᵀ                                           # [V_d + 1] → x_{i+2}

g_i is trained to be the target's next feature f_{i+1}, so a rollout feeds it back as the next input's feature;
the head reads it the way the target's trained exit head reads h^(ℓ_e) (models/exit_head.py, same A, b, g_o shapes,
started from that head). E is the draft's (reduced) vocabulary's embedding, tied as the head (models/vocab.py).

Stored as `feature_draft.json` (shape) + `feature_draft.safetensors` + `draft_vocab.json` in the draft's folder.
Training: training/draft/feature_distill.py. Running it in the engine: runners/feature.py.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MirrorError
from .ops import apply_rope, default_inv_freq, rms_norm, rope_tables

CONFIG_FILE, WEIGHTS_FILE = "feature_draft.json", "feature_draft.safetensors"

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [..., in], w [out, in]) → x @ wᵀ [..., out]


def plain_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ wᵀ with torch's matmul: how training and a runner without the kernel multiply by a weight."""
    return x @ w.t()


@dataclass(frozen=True)
class FeatureDraftConfig:
    hidden_size: int            # H (the target's: features are read as they are)
    num_layers: int             # decoder layers of the draft (1–2)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int             # V_d + 1 (the reduced vocabulary plus "other")
    feature_layer: int          # ℓ_e: the target layer whose output it reads
    target_layers: int          # N of the target it was trained for
    target_vocab_size: int      # V of the target
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 8192


def is_feature_draft(folder: str | None) -> bool:
    return bool(folder) and os.path.isfile(os.path.join(folder, CONFIG_FILE))


class FeatureDraft(nn.Module):
    """The model's weights and maths; `step` is one pass over given positions (training and inference both)."""

    def __init__(self, cfg: FeatureDraftConfig):
        super().__init__()
        self.cfg = cfg
        h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
        self.embed = nn.Parameter(torch.zeros(cfg.vocab_size, h))                         # E [V_d+1, H]
        self.fc = nn.Parameter(torch.zeros(h, 2 * h))                                     # W_fc [H, 2H]
        self.layers = nn.ModuleList()
        for _ in range(cfg.num_layers):
            layer = nn.ParameterDict({
                "in_norm": nn.Parameter(torch.ones(h)), "q": nn.Parameter(torch.zeros(cfg.num_heads * cfg.head_dim, h)),
                "k": nn.Parameter(torch.zeros(kv, h)), "v": nn.Parameter(torch.zeros(kv, h)),
                "o": nn.Parameter(torch.zeros(h, cfg.num_heads * cfg.head_dim)), "post_norm": nn.Parameter(torch.ones(h)),
                "gate": nn.Parameter(torch.zeros(cfg.intermediate_size, h)),
                "up": nn.Parameter(torch.zeros(cfg.intermediate_size, h)),
                "down": nn.Parameter(torch.zeros(h, cfg.intermediate_size))})
            self.layers.append(layer)
        self.head_adapter = nn.Parameter(torch.eye(h))                                    # A [H, H]
        self.head_bias = nn.Parameter(torch.zeros(h))                                     # b [H]
        self.head_gain = nn.Parameter(torch.ones(h))                                      # g_o [H]
        self.register_buffer("inv_freq", default_inv_freq(cfg.head_dim, cfg.rope_theta, "cpu"), persistent=False)

    @staticmethod
    def weight_key(w: torch.Tensor) -> tuple:
        """A weight by its storage, shape and strides (a weight and its transpose differ): how a `linear` finds the
        map it packed for it (runners/feature_kernel.py: PackedMaps)."""
        return w.data_ptr(), tuple(w.shape), tuple(w.stride())

    def matmul_weights(self) -> list[torch.Tensor]:
        """Every weight the forward multiplies by ([out, in]; the embedding too, as the tied head)."""
        per_layer = [layer[k] for layer in self.layers for k in ("q", "k", "v", "o", "gate", "up", "down")]
        return [self.fc, *per_layer, self.head_adapter.t(), self.embed]

    # -- the maths (`linear`: how the caller multiplies by a weight; a replay of a kernel format passes its maps) --
    def inputs(self, ids: torch.Tensor, features: torch.Tensor, linear: Linear = plain_linear) -> torch.Tensor:
        """u = W_fc [embed(ids); f]: ids [..., T] (draft ids), features [..., T, H] → [..., T, H]."""
        e = F.embedding(ids, self.embed)                                                   # [..., T, H]
        return linear(torch.cat([e, features.to(e.dtype)], -1), self.fc)                   # [..., T, H]

    def logits(self, g: torch.Tensor, linear: Linear = plain_linear) -> torch.Tensor:
        """The head: g [..., H] → logits over the draft vocabulary [..., V_d+1] ("other" included)."""
        z = rms_norm(linear(g, self.head_adapter.t()) + self.head_bias, self.head_gain, self.cfg.rms_norm_eps)
        return linear(z, self.embed)

    def qkv(self, layer, x: torch.Tensor, positions: torch.Tensor, linear: Linear = plain_linear):
        """Layer input x [B, T, H] at positions [B, T] → q [B, Hq, T, D], k, v [B, Hkv, T, D] (RoPE applied)."""
        c = self.cfg
        b, t, _ = x.shape
        hn = rms_norm(x, layer["in_norm"], c.rms_norm_eps)
        q = linear(hn, layer["q"]).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = linear(hn, layer["k"]).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = linear(hn, layer["v"]).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, self.inv_freq.to(x.device), 1.0, x.dtype)           # [B, T, D]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, layer, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               may_attend: torch.Tensor, linear: Linear = plain_linear) -> torch.Tensor:
        """Attention of q [B, Hq, T, D] over keys/values [B, Hkv, S, D] (may_attend [B, T, S] bool), then the MLP."""
        c = self.cfg
        rep = c.num_heads // c.num_kv_heads
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)       # [B, Hq, S, D]
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=may_attend.unsqueeze(1))  # [B, Hq, T, D]
        return self.after_attention(layer, x, a, linear)

    def after_attention(self, layer, x: torch.Tensor, a: torch.Tensor, linear: Linear = plain_linear) -> torch.Tensor:
        """The layer after its attention: x [B, T, H] + o(a) (a [B, Hq, T, D]), then the MLP."""
        c = self.cfg
        b, _, t, _ = a.shape
        x = x + linear(a.transpose(1, 2).reshape(b, t, -1), layer["o"])
        hn = rms_norm(x, layer["post_norm"], c.rms_norm_eps)
        return x + linear(F.silu(linear(hn, layer["gate"])) * linear(hn, layer["up"]), layer["down"])

    # -- storage -----------------------------------------------------------------------------------
    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(asdict(self.cfg), f, indent=1)
        tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, os.path.join(folder, WEIGHTS_FILE))


def feature_draft_config(folder: str) -> FeatureDraftConfig:
    try:
        with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
            return FeatureDraftConfig(**json.load(f))
    except (OSError, ValueError, TypeError) as exc:
        raise MirrorError(f"cannot read the feature draft's {CONFIG_FILE} in {folder}: {exc}") from None


def load_feature_draft(folder: str, dtype: torch.dtype = torch.float32) -> FeatureDraft:
    from safetensors.torch import load_file

    cfg = feature_draft_config(folder)
    try:
        model = FeatureDraft(cfg)
        model.load_state_dict({k: v.to(dtype) for k, v in load_file(os.path.join(folder, WEIGHTS_FILE)).items()})
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise MirrorError(f"cannot read the feature draft in {folder}: {exc}") from None
    return model.to(dtype).eval().requires_grad_(False)


def check_feature_draft(cfg, target_cfg, vmap) -> None:
    """A feature-reading draft fits a target of its hidden size, depth and vocabulary (it reads its features)."""
    mine = (cfg.hidden_size, cfg.target_layers, cfg.target_vocab_size)
    theirs = (int(target_cfg.hidden_size), int(target_cfg.num_hidden_layers), int(target_cfg.vocab_size))
    if mine != theirs:
        raise MirrorError(f"the feature-reading draft was trained for a target with hidden size, layers, vocabulary "
                          f"{mine}, not {theirs}")
    if vmap is None or vmap.target_vocab_size != theirs[2]:
        raise MirrorError("a feature-reading draft needs its draft_vocab.json for this target's vocabulary")
    if cfg.vocab_size != vmap.size + 1:
        raise MirrorError(f"the feature-reading draft reads {cfg.vocab_size} tokens but its draft_vocab.json lists "
                          f"{vmap.size} (+1 for \"other\")")


def from_target(target, vocab_ids: torch.Tensor, num_layers: int, feature_layer: int, exit_head=None) -> FeatureDraft:
    """A new draft for a transformers Llama target: layers started from the target's layers ℓ_e.. (the ones that
    read h^(ℓ_e)), W_fc = [small; I] (u starts as the feature), embedding = the target's rows of the vocabulary
    (+ their mean as "other"), head from the trained exit head (A, b, g_o) when given."""
    tc = target.config
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    cfg = FeatureDraftConfig(hidden_size=tc.hidden_size, num_layers=num_layers, num_heads=tc.num_attention_heads,
                             num_kv_heads=tc.num_key_value_heads, head_dim=head_dim,
                             intermediate_size=tc.intermediate_size, vocab_size=vocab_ids.numel() + 1,
                             feature_layer=feature_layer, target_layers=tc.num_hidden_layers,
                             target_vocab_size=tc.vocab_size, rms_norm_eps=float(tc.rms_norm_eps),
                             rope_theta=float(getattr(tc, "rope_theta", None) or 10000.0),
                             max_positions=int(tc.max_position_embeddings))
    model = FeatureDraft(cfg)
    h = cfg.hidden_size
    with torch.no_grad():
        emb = target.model.embed_tokens.weight.float()
        model.embed.copy_(torch.cat([emb[vocab_ids], emb.mean(0, keepdim=True)]))
        model.fc.copy_(torch.cat([torch.randn(h, h) * 0.02, torch.eye(h)], 1))
        for i, mine in enumerate(model.layers):
            _copy_target_layer(mine, target, feature_layer + i)
        if exit_head is not None:
            adapter, bias, gain = exit_head
            model.head_adapter.copy_(adapter)
            model.head_bias.copy_(bias)
            model.head_gain.copy_(gain)
    return model


def _copy_target_layer(mine, target, i: int) -> None:
    """A draft layer's weights from the target's layer i (its last layer past the end)."""
    theirs = target.model.layers[min(i, target.config.num_hidden_layers - 1)]
    mine["in_norm"].copy_(theirs.input_layernorm.weight)
    mine["post_norm"].copy_(theirs.post_attention_layernorm.weight)
    for name, lin in (("q", theirs.self_attn.q_proj), ("k", theirs.self_attn.k_proj), ("v", theirs.self_attn.v_proj),
                      ("o", theirs.self_attn.o_proj), ("gate", theirs.mlp.gate_proj), ("up", theirs.mlp.up_proj),
                      ("down", theirs.mlp.down_proj)):
        mine[name].copy_(lin.weight)


def grown(model: FeatureDraft, target, num_layers: int) -> FeatureDraft:
    """`model` with decoder layers appended up to `num_layers` (training a deeper draft from a trained one): layer i
    starts from the target's layer ℓ_e + i, as from_target starts it, but with its output maps o and down zero, so
    the grown draft computes exactly what `model` computes until training moves them (the residual stream passes
    each new layer unchanged; o and down get gradients from the first step, the rest once those are non-zero)."""
    c = model.cfg
    if num_layers < c.num_layers:
        raise MirrorError(f"cannot grow a {c.num_layers}-layer draft to {num_layers} layer(s)")
    if num_layers == c.num_layers:
        return model
    bigger = FeatureDraft(replace(c, num_layers=num_layers))
    with torch.no_grad():
        for i in range(c.num_layers, num_layers):
            _copy_target_layer(bigger.layers[i], target, c.feature_layer + i)
            bigger.layers[i]["o"].zero_()
            bigger.layers[i]["down"].zero_()
        bigger.load_state_dict(model.state_dict(), strict=False)  # every key but the new layers' (same shapes)
    return bigger.to(next(model.parameters()).dtype)


def unrolled_attention(q: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Depth d's attention in the training-time test, without a mask over d·T keys: q [B, Hq, T, D] attends to depth
    1's keys at positions ≤ p (causal) and to each later depth's key at its own position p only; past = the d
    depths' (k, v) [B, Hkv, T, D]. The same function as scaled_dot_product_attention under the mask
    [causal | diag | … | diag], at a quarter of its time here (the masked CPU kernel visits all d·T keys)."""
    rep = q.shape[1] // past[0][0].shape[1]
    k1, v1 = (t.repeat_interleave(rep, 1) for t in past[0])                                   # [B, Hq, T, D]
    t = q.shape[2]
    scale = q.shape[-1] ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()                        # [T, T]
    scores = [(q @ k1.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]           # [B, Hq, T, T]
    own = [(k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) for k, v in past[1:]]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k, _ in own]                          # [B, Hq, T, 1] each
    p = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)                           # [B, Hq, T, T+d−1]
    out = p[..., :t] @ v1                                                                        # [B, Hq, T, D]
    for j, (_, v) in enumerate(own):
        out = out + p[..., t + j: t + j + 1] * v
    return out


def train_step_outputs(model: FeatureDraft, ids: torch.Tensor, features: torch.Tensor, depths: int,
                       linear: Linear = plain_linear) -> list[torch.Tensor]:
    """Training-time test (EAGLE-3): the draft unrolled on its own predicted features, all positions at once.

    ids [B, T]: row p holds x_{p+1} (the token after position p); features [B, T, H]: the target's f_p.
    Depth 1 reads (x_{p+1}, f_p) at position p. Depth d reads (x_{p+d}, g^(d−1)_p) at position p+d−1 and attends
    to depth 1's keys at positions ≤ p (true features) and to depths 2..d's keys of its own row: exactly what a
    rollout at depth d sees in the engine. Returns g^(d) [B, T, H] for d = 1..depths (g^(d)_p ≈ f_{p+d}, and its
    logits predict x_{p+d+1}); rows past the end read padding and are masked by the caller. `linear`: how its products
    are computed (a held-out replay of a kernel format passes the kernel's packed maps).
    """
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device).expand(b, t)
    outs, feats = [], features
    kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in model.layers]
    for d in range(1, depths + 1):
        tok = ids if d == 1 else torch.cat([ids[:, d - 1:], ids.new_zeros(b, d - 1)], 1)         # x_{p+d}
        x = model.inputs(tok, feats, linear)                                                     # [B, T, H]
        for layer, past in zip(model.layers, kv):
            q, k, v = model.qkv(layer, x, pos + d - 1, linear)
            past.append((k, v))
            x = model.after_attention(layer, x, unrolled_attention(q, past), linear)
        outs.append(x)
        feats = x
    return outs
