"""Construct, initialise and save the three bundled models (target, AR draft, SS draft).

Width choice [ours]: both drafts have the target's hidden size, so they start from the target's
embedding, first layers and final norm. That initialisation was the largest single gain measured
over drafts trained from scratch (measured: BENCHMARKS.md's history), and a narrower draft would need a
learned projection and saves little latency: at batch 1 a CPU forward of a 1-layer draft is
dominated by per-op overhead and the 4096-wide tied head, not by layer width. The cost is
disk/memory: 1-layer drafts keep the fp16 total of the three models under 48 MB.

Default shapes (TrainConfig) and why, from one-token cached step times after a 128-token prefix
(measured: BENCHMARKS.md's history):
- target: 10 layers, hidden 384, 6 heads / 2 KV heads, MLP 1024 → 17.3 M params, 34.6 MB fp16 (shipped as an
  18.5 MB Q8_0 GGUF: to_gguf.py); ℓ_e = 5.
- AR draft: 1 layer of the same width → 3.15 M params, 6.3 MB; the same layer at hidden 256 saved
  too little time to give up the initialisation.
- SS draft: 1 layer, N_s = 1, 2 streams → 3.15 M params, 6.3 MB; its streams cost less per step
  than a second layer would.
- total fp16 47.2 MB (≤ 48 MB); an 8-layer target with 2-layer drafts fits too, but its step is too
  close to a draft step.
"""
import copy
import json
import math
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from mirror_core.models.ss_draft import SSDraftForCausalLM, ss_draft_from_llama


def llama_config(vocab_size: int, eot_id: int, hidden_size: int, intermediate_size: int, num_layers: int,
                 num_heads: int, num_kv_heads: int, max_positions: int) -> LlamaConfig:
    """A Llama config with tied embeddings; EOT is bos, eos and pad."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=eot_id,
                       eos_token_id=eot_id, pad_token_id=eot_id)


@torch.no_grad()
def init_weights_(model: torch.nn.Module, generator: torch.Generator, std: float = 0.02) -> None:
    """GPT-2-style init from an explicit generator: N(0, std), residual outputs scaled by 1/√(2·layers), norms 1."""
    n_layers = model.config.num_hidden_layers
    for name, p in model.named_parameters():  # tied weights appear once
        if p.dim() == 1:
            p.fill_(1.0)
            continue
        scale = 1.0 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
        p.copy_(torch.randn(p.shape, generator=generator) * std * scale)


def make_target(config: LlamaConfig, generator: torch.Generator) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config)
    init_weights_(model, generator)
    return model


@torch.no_grad()
def make_ar_draft(target: LlamaForCausalLM, num_layers: int) -> LlamaForCausalLM:
    """AR draft = the target's embedding + first num_layers layers + final norm (tied head)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    draft = LlamaForCausalLM(config).to(target.device)
    draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    for i in range(num_layers):
        draft.model.layers[i].load_state_dict(target.model.layers[i].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    return draft


def make_ss_draft(source: LlamaForCausalLM, num_layers: int, num_msa_layers: int, num_streams: int,
                  generator: torch.Generator) -> SSDraftForCausalLM:
    """SS draft = source's embedding + first num_layers layers + final norm, plus random stream embeddings P_j.

    source is the target (the AR draft's initialisation) or the trained AR draft (--ss-init ar_draft)."""
    return ss_draft_from_llama(source, num_layers, num_msa_layers, num_streams, generator)


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def save_fp16(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out_dir: str) -> None:
    """fp16 safetensors + config + tokenizer files, loadable offline by the Auto classes."""
    os.makedirs(out_dir, exist_ok=True)
    half = copy.deepcopy(model).to(device="cpu", dtype=torch.float16)
    half.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    compact_tokenizer_json(out_dir)


def compact_tokenizer_json(folder: str) -> None:
    """Rewrite tokenizer.json without indentation (same JSON, ~60% smaller): the shipped pair has three copies."""
    path = os.path.join(folder, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, ensure_ascii=False, separators=(",", ":"))
