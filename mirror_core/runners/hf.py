"""Generic runner over any supported Hugging Face causal LM (Llama/Mistral/Qwen2/Qwen3 family, GPT-2).

The early exit is a forward hook on decoder layer ℓ_e that applies the model's own final norm and
LM head (the logit lens) and hands the readout to a callback before the remaining layers run. The
KV cache is transformers' DynamicCache; branch rows share a forked cache and see their own prefix
through a 2-D attention mask, with explicit position ids.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from ..config import MirrorError
from .protocol import ExitCallback

# model_type → (path to the decoder layer list, path to the final norm)
_LAYOUTS = {
    "llama": ("model.layers", "model.norm"),
    "mistral": ("model.layers", "model.norm"),
    "qwen2": ("model.layers", "model.norm"),
    "qwen3": ("model.layers", "model.norm"),
    "gpt2": ("transformer.h", "transformer.ln_f"),
}
SUPPORTED_MODEL_TYPES = tuple(_LAYOUTS)


def layout(model_type: str) -> tuple[str, str]:
    """(module path of the decoder layer list, module path of the final norm) for a supported architecture."""
    if model_type not in _LAYOUTS:
        raise MirrorError(f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _LAYOUTS[model_type]


def _attr_path(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@dataclass
class HFBranches:
    cache: DynamicCache
    mask: torch.Tensor       # [R, S] long: 1 where the row may attend
    positions: torch.Tensor  # [R] long: the position the row's next token gets


class HFRunner:
    """Runner over a loaded Hugging Face model; inference only."""

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, exit_head=None):
        layers_path, norm_path = layout(getattr(model.config, "model_type", "?"))
        self.model = model.eval()
        self.layers = _attr_path(model, layers_path)
        self.final_norm = _attr_path(model, norm_path)
        self.lm_head = model.get_output_embeddings()
        self.num_layers = len(self.layers)
        self.num_streams = 0  # plain next-token model: one token per forward
        self.vocab_size = int(vocab_size or model.config.vocab_size)
        limits = [getattr(model.config, n, None) for n in ("max_position_embeddings", "n_positions")]
        self.max_positions = next((v for v in limits if isinstance(v, int) and v > 0), None)  # probes stay inside
        self.exit_head = exit_head  # an exit_head.ExitHead: the layer-ℓ_e readout instead of the logit lens
        self.device = next(model.parameters()).device
        # a model spread over devices by an accelerate device map: each synchronised after a forward
        self.devices = tuple(dict.fromkeys(p.device for p in model.parameters()))

    # -- sequences -------------------------------------------------------------------------
    def new_cache(self) -> DynamicCache:
        # Full-attention layers for every model: contexts are checked to fit any sliding window.
        return DynamicCache()

    def cache_len(self, cache: DynamicCache) -> int:
        return int(cache.get_seq_length())

    @torch.inference_mode()
    def forward(self, cache: DynamicCache, ids: list[int], exit_layer: int | None = None,
                on_exit: ExitCallback | None = None) -> torch.Tensor:
        start = self.cache_len(cache)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)                        # [1, T]
        pos = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)          # [1, T]
        hook = None
        if exit_layer is not None and on_exit is not None:
            hook = self.layers[exit_layer - 1].register_forward_hook(self._exit_hook(on_exit, exit_layer))
        try:
            out = self.model(input_ids=x, position_ids=pos, cache=cache, use_cache=True)
        finally:
            if hook is not None:
                hook.remove()
        return out.logits[0, :, : self.vocab_size].float()                                  # [T, V]

    def _exit_hook(self, on_exit: ExitCallback, layer: int):
        def hook(_module, _args, output):
            h = output[0] if isinstance(output, tuple) else output                        # [1, T, H]
            on_exit(h[0].float())                                                          # [T, H]
        return hook

    @torch.inference_mode()
    def exit_readout(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        if self.exit_head is not None and self.exit_head.layer == layer:
            return self.exit_head.readout(h.to(self.exit_head.w.device))                   # [T, V]
        h = h.to(self.final_norm.weight.device, self.final_norm.weight.dtype)
        return self.lm_head(self.final_norm(h))[:, : self.vocab_size].float()             # [T, V]

    def truncate(self, cache: DynamicCache, length: int) -> None:
        drop = self.cache_len(cache) - length
        if drop > 0:
            cache.crop(-drop)

    # -- branch rows -----------------------------------------------------------------------
    def fork(self, cache: DynamicCache, valid_lengths: list[int]) -> HFBranches:
        rows = len(valid_lengths)
        s = self.cache_len(cache)
        forked = _cache_from([(layer.keys.expand(rows, -1, -1, -1),        # [R, H_kv, S, D]
                               layer.values.expand(rows, -1, -1, -1))     # [R, H_kv, S, D]
                              for layer in cache.layers])
        lengths = torch.tensor(valid_lengths, device=self.device)                 # [R]
        mask = (torch.arange(s, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)).long()  # [R, S]
        return HFBranches(forked, mask, lengths.clone())

    @torch.inference_mode()
    def forward_rows(self, branches: HFBranches, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        """ids [R, T] at each row's next positions; returns logits [R, T, V] (and no stream logits)."""
        rows, t = ids.shape
        pos = branches.positions.unsqueeze(1) + torch.arange(t, device=self.device)             # [R, T]
        branches.mask = torch.cat([branches.mask, torch.ones(rows, t, dtype=torch.long, device=self.device)], 1)  # [R, S+T]
        out = self.model(input_ids=ids.to(self.device), position_ids=pos, attention_mask=branches.mask,
                         cache=branches.cache, use_cache=True)
        branches.positions = branches.positions + t
        return out.logits[:, :, : self.vocab_size].float(), None

    def select_row(self, branches: HFBranches, row: int) -> DynamicCache:
        keep = branches.mask[row].nonzero().squeeze(-1)                                      # [S_row]
        return _cache_from([(layer.keys[row : row + 1, :, keep],     # [1, H_kv, S_row, D]
                             layer.values[row : row + 1, :, keep])
                            for layer in branches.cache.layers])


def _cache_from(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A full-attention DynamicCache holding copies of the given per-layer keys and values."""
    return DynamicCache(ddp_cache_data=[(k.contiguous(), v.contiguous()) for k, v in kv])
