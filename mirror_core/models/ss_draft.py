"""Speculative-Streaming (SS) draft model: a Llama-style decoder with multi-stream attention on top.

Architecture (docs/ALGORITHM.md §5; [ours] marks choices the SS paper leaves open):
- Layers 0..N-N_s-1 are ordinary Llama decoder layers over the main stream only (same parameter
  names as `LlamaDecoderLayer`, so layers can be copied from a `LlamaForCausalLM`).
- At layer N-N_s each of the n_str lookahead streams starts as main_t + P_j (P_j = `stream_embed[j-1]`,
  identity f_η as in the paper). The top N_s layers apply multi-stream attention with shared weights:
  the main stream is ordinary causal attention; stream j at position t attends to the main-stream
  keys through t and to streams 1..j at t. Main queries never see stream keys, so main logits do not
  depend on the streams. Main and stream rows share one projection/attention/MLP call per layer
  (rows [B, T, 1+n_str, H], separated only by the attention mask), which keeps a CPU step cheap.
- [ours] Stream j at position t uses RoPE position `position_ids[t] + j` (it stands for token t+j).
- One LM head, tied to the embedding: logits = norm(h) @ embed_tokens.weight.T for every stream.
  Main logits at t predict token t+1; stream j (1-based) at t predicts token t+1+j.

Cache API (plain tensors, positions are arguments):
- A cache is `None` (empty) or a list with one `(k, v)` pair per layer (all N layers); k and v are
  `[B, H_kv, S, D]` main-stream keys (RoPE applied) and values for cache indices 0..S-1 in token
  order. Lookahead streams are never cached.
- `model(input_ids [B,T], position_ids [B,T], cache, attention_mask [B,S+T])` lets new token i attend
  cache indices <= S+i (causal by cache index; `position_ids` only feed RoPE and default to S+arange(T)).
  `attention_mask` (1 = real token, 0 = padding) masks keys, e.g. for left-padded batches.
  It returns `SSDraftOutput.cache`, a new list with the T new entries appended; the input list is
  never modified. `with_streams=False` skips the streams (main logits only, stream_logits None).
- `truncate_cache(cache, n)` keeps indices < n (drops rejected tokens); `cache_length(cache)` is S.

Importing this module registers the model with AutoConfig / AutoModelForCausalLM (model_type
"mirror_ss_draft"), so `AutoModelForCausalLM.from_pretrained(dir)` loads it without trust_remote_code.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM, PretrainedConfig, PreTrainedModel
from transformers import initialization as hf_init
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from .ops import apply_rope, default_inv_freq, rope_tables, t_major_rows

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class SSDraftConfig(PretrainedConfig):
    """Shapes of the SS draft; field names follow LlamaConfig so Llama weights map one to one."""

    model_type = "mirror_ss_draft"

    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 1
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    num_msa_layers: int = 1  # N_s: top layers with multi-stream attention
    num_streams: int = 2  # n_str lookahead streams
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 1024
    initializer_range: float = 0.02
    hidden_act: str = "silu"  # read by LlamaMLP
    mlp_bias: bool = False  # read by LlamaMLP

    def __post_init__(self, **kwargs):
        if not 1 <= self.num_msa_layers <= self.num_hidden_layers:
            raise ValueError(f"num_msa_layers must be in 1..{self.num_hidden_layers}, got {self.num_msa_layers}")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("hidden_size, num_attention_heads and num_key_value_heads do not divide")
        super().__post_init__(**kwargs)


@dataclass(frozen=True)
class SSDraftOutput:
    """What one forward returns; the cache already holds the new main-stream entries."""

    logits: torch.Tensor  # [B, T, V] fp32-or-model dtype; main stream, predicts token t+1
    stream_logits: torch.Tensor | None  # [B, T, n_str, V]; stream j (index j-1) predicts token t+1+j
    cache: KVCache  # per layer (k, v): [B, H_kv, S+T, D]
    stream_states: torch.Tensor | None = None  # [B, T, n_str, H] normed stream states (stream_head=False)


def cache_length(cache: KVCache | None) -> int:
    """Number of cached token indices (0 for an empty cache)."""
    return 0 if not cache else cache[0][0].shape[2]


def truncate_cache(cache: KVCache, length: int) -> KVCache:
    """Keep cache indices < length: how rejected lookahead tokens are dropped."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in cache]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention with a boolean mask (True = may attend). Not ops.attend: this is the
    trained, differentiable reference forward, and SDPA's kernel rounds differently from the fast runners'."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, Hq, S, D]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])  # [B, Hq, L, D]


class SSAttention(nn.Module):
    """Llama attention projections (same parameter names), applied to main and stream rows alike."""

    def __init__(self, config: SSDraftConfig):
        super().__init__()
        h, self.head_dim = config.hidden_size, config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(h, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, config.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, config.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple, past, allowed: torch.Tensor):
        """x [B, T, R, H] (row 0 main, rows 1..n streams); returns output [B, T, R, H] and main-only (k, v)."""
        b, t, r, hid = x.shape
        rows = x.reshape(b, t * r, hid)  # t-major rows
        q = apply_rope(self.q_proj(rows).view(b, t * r, -1, self.head_dim).transpose(1, 2), *rope)  # [B, Hq, T*R, D]
        k = apply_rope(self.k_proj(rows).view(b, t * r, -1, self.head_dim).transpose(1, 2), *rope)  # [B, Hkv, T*R, D]
        v = self.v_proj(rows).view(b, t * r, -1, self.head_dim).transpose(1, 2)  # [B, Hkv, T*R, D]
        main_k, main_v = k.unflatten(2, (t, r))[:, :, :, 0], v.unflatten(2, (t, r))[:, :, :, 0]  # [B, Hkv, T, D]
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)  # [B, Hkv, S+T*R, D]
            main_k, main_v = torch.cat((past[0], main_k), dim=2), torch.cat((past[1], main_v), dim=2)
        out = _attend(q, k, v, allowed).transpose(1, 2).reshape(b, t, r, -1)  # [B, T, R, Hq*D]
        return self.o_proj(out), (main_k, main_v)


class SSDecoderLayer(nn.Module):
    """Pre-norm decoder layer; same parameter names as LlamaDecoderLayer."""

    def __init__(self, config: SSDraftConfig):
        super().__init__()
        self.self_attn = SSAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple, past, allowed: torch.Tensor):
        """Residual attention then residual MLP over all rows [B, T, R, H]; norms and MLP act per row."""
        a, kv = self.self_attn(self.input_layernorm(x), rope, past, allowed)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


def _rows_mask(key_mask: torch.Tensor, t: int, r: int) -> torch.Tensor:
    """Who may attend to whom, [B, T*R, S+T*R] with rows t-major (row 0 main, j = stream j).

    Main row t: cached keys and new main rows ≤ t. Stream row (t, j): the same main keys plus stream
    rows 1..j at t. Padded keys (key_mask 0) are masked; every row sees itself, so none is empty.
    """
    b, total = key_mask.shape
    past, dev = total - t, key_mask.device
    t_of, a_of = t_major_rows(t, r, 0, dev)  # [T*R] each: position index of each row; 0 = main, j = stream j
    main_keys = (a_of[None, :] == 0) & (t_of[None, :] <= t_of[:, None])  # [T*R, T*R]
    stream_keys = (a_of[None, :] >= 1) & (a_of[None, :] <= a_of[:, None]) & (t_of[None, :] == t_of[:, None])
    valid_new = key_mask[:, past:].repeat_interleave(r, dim=1)  # [B, T*R]
    new = ((main_keys | stream_keys)[None] & valid_new[:, None, :]) | torch.eye(t * r, dtype=torch.bool, device=dev)
    return torch.cat((key_mask[:, None, :past].expand(b, t * r, past), new), dim=2)  # [B, T*R, S+T*R]


class SSDraftForCausalLM(PreTrainedModel):
    """SS draft: one forward gives the main next-token logits and n_str lookahead logits per position."""

    config_class = SSDraftConfig
    config: SSDraftConfig
    base_model_prefix = "ss_draft"
    _no_split_modules = ["SSDecoderLayer"]

    def __init__(self, config: SSDraftConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([SSDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.stream_embed = nn.Parameter(torch.zeros(config.num_streams, config.hidden_size))  # P_j
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """HF default init plus the stream embeddings (skips anything loaded from a checkpoint)."""
        super()._init_weights(module)
        if isinstance(module, SSDraftForCausalLM):
            hf_init.normal_(module.stream_embed, mean=0.0, std=self.config.initializer_range)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def first_msa_layer(self) -> int:
        """Index N - N_s of the first multi-stream layer (where streams are initialised)."""
        return self.config.num_hidden_layers - self.config.num_msa_layers

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None, attention_mask: torch.Tensor | None = None,
                with_streams: bool = True, stream_head: bool = True) -> SSDraftOutput:
        """Main + stream logits for T new tokens appended after the cache (see module docstring).

        stream_head=False returns the streams' normed states instead of their logits, so a caller
        that needs the lookahead at one position only applies the head there (`head`).
        """
        b, t = input_ids.shape
        past = cache_length(cache)
        dev = input_ids.device
        if position_ids is None:
            position_ids = (past + torch.arange(t, device=dev)).expand(b, t)  # [B, T]
        if attention_mask is None:
            attention_mask = torch.ones(b, past + t, dtype=torch.bool, device=dev)
        n = self.config.num_streams if with_streams else 0
        key_mask = attention_mask.bool()
        x = self.embed_tokens(input_ids)[:, :, None]  # [B, T, 1, H] main rows only
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        inv_freq = default_inv_freq(head_dim, self.config.rope_theta, dev)  # [D/2]
        new_cache = []
        for i, layer in enumerate(self.layers):
            if i == 0 or (n and i == self.first_msa_layer()):
                if n and i == self.first_msa_layer():
                    x = torch.cat((x, x + self.stream_embed.to(x.dtype)), dim=2)  # [B, T, 1+n, H]: main_t + P_j
                r = x.shape[2]
                pos = (position_ids[:, :, None] + torch.arange(r, device=dev)).flatten(1)  # [ours] stream j at t + j
                rope = rope_tables(pos[:, None], inv_freq, 1.0, x.dtype)  # [B, 1, T*R, D] each
                allowed = _rows_mask(key_mask, t, r)
            x, kv = layer(x, rope, None if cache is None else cache[i], allowed)
            new_cache.append(kv)
        if n and stream_head:
            all_logits = self.head(self.norm(x))  # [B, T, R, V]: one matmul over main and stream rows
            return SSDraftOutput(logits=all_logits[:, :, 0], stream_logits=all_logits[:, :, 1:], cache=new_cache)
        states = self.norm(x)  # [B, T, R, H]
        return SSDraftOutput(self.head(states[:, :, 0]), None, new_cache, states[:, :, 1:] if n else None)

    def head(self, states: torch.Tensor) -> torch.Tensor:
        """The tied LM head over normed states [..., H] → logits [..., V] (main or stream rows)."""
        return F.linear(states, self.embed_tokens.weight)


def ss_draft_from_llama(llama: LlamaForCausalLM, num_layers: int, num_msa_layers: int, num_streams: int,
                        generator: torch.Generator) -> SSDraftForCausalLM:
    """Initialise an SS draft from a target's embedding, first layers and final norm (drafts share its width)."""
    c = llama.config
    config = SSDraftConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, num_msa_layers=num_msa_layers, num_streams=num_streams,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_parameters["rope_theta"],
        max_position_embeddings=c.max_position_embeddings, initializer_range=c.initializer_range,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    model = SSDraftForCausalLM(config).to(llama.device)
    model.embed_tokens.load_state_dict(llama.model.embed_tokens.state_dict())
    for i in range(num_layers):
        model.layers[i].load_state_dict(llama.model.layers[i].state_dict())
    model.norm.load_state_dict(llama.model.norm.state_dict())
    with torch.no_grad():
        p = torch.randn(model.stream_embed.shape, generator=generator) * c.initializer_range
        model.stream_embed.copy_(p.to(model.stream_embed.device))
    return model


AutoConfig.register(SSDraftConfig.model_type, SSDraftConfig, exist_ok=True)
AutoModelForCausalLM.register(SSDraftConfig, SSDraftForCausalLM, exist_ok=True)
