"""Generic runner over any supported Hugging Face causal LM (Llama/Mistral/Qwen2/Qwen3 family, GPT-2).

The early exit stops the model's own forward where it calls decoder layer ℓ_e+1 (a pre-hook that keeps
that layer's inputs: h^(ℓ_e) and the masks, positions and cache every layer gets); finish_pass calls
layers ℓ_e+1..N with those inputs and applies the final norm and LM head, as the model's forward does. The
KV cache is transformers' DynamicCache; branch rows share a forked cache and see their own prefix
through a 2-D attention mask, with explicit position ids. Where each architecture keeps its layers and final norm:
models/architectures.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from ..models.architectures import layout
from ..models.exit_head import ExitLogits
from .protocol import ExitPass, KernelChoice, WholeModelFormats


def _attr_path(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


class _AtExit(Exception):
    """Raised by the pre-hook of layer ℓ_e+1: the model's forward stops there (forward_to_exit)."""


@dataclass
class _HFPass:
    """One forward between forward_to_exit and finish_pass."""
    args: tuple                  # layer ℓ_e+1's positional inputs (args[0]: h^(ℓ_e) [1, T, H], or in kwargs)
    kwargs: dict                 # its keyword inputs (mask, positions, rotary tables, cache)
    masks: dict = field(default_factory=dict)  # attention type → the mask the model gave layers of that type
    logits: torch.Tensor | None = None  # the whole pass already run (a suffix layer type the prefix never showed)


@dataclass
class HFBranches:
    cache: DynamicCache
    mask: torch.Tensor       # [R, S] long: 1 where the row may attend
    positions: torch.Tensor  # [R] long: the position the row's next token gets


class HFRunner(WholeModelFormats):
    """Runner over a loaded Hugging Face model; inference only."""

    kernel = KernelChoice(None, "the generic runner has no kernel")
    plans_rows = False     # the model's own forward takes no row plan: check_rows measures it as it is
    row_plan = None
    reads_features = False
    weight_stream = None   # the model's forward streams what it streams: the roofline is not drawn for it

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, exit_head=None):
        layers_path, norm_path = layout(getattr(model.config, "model_type", "?"))
        self.model = model.eval()
        self.layers = _attr_path(model, layers_path)
        self.final_norm = _attr_path(model, norm_path)
        self.lm_head = model.get_output_embeddings()
        self.num_layers = len(self.layers)
        self.layer_types = tuple(getattr(model.config, "layer_types", None) or ())  # e.g. Qwen's full / sliding attention
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

    def _inputs(self, cache: DynamicCache, ids: list[int]) -> dict[str, Any]:
        start = self.cache_len(cache)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)                        # [1, T]
        pos = torch.arange(start, start + len(ids), device=self.device).unsqueeze(0)          # [1, T]
        return {"input_ids": x, "position_ids": pos, "cache": cache, "use_cache": True}

    @torch.inference_mode()
    def forward(self, cache: DynamicCache, ids: list[int], rows: int | None = None) -> torch.Tensor:
        logits = self.model(**self._inputs(cache, ids)).logits[0, :, : self.vocab_size].float()  # [T, V]
        return logits if rows is None else logits[logits.shape[0] - rows:]                    # [rows, V]

    @torch.inference_mode()
    def forward_to_exit(self, cache: DynamicCache, ids: list[int], layer: int) -> ExitPass:
        types = self.layer_types
        if set(types[layer:]) - set(types[: layer + 1]):  # a suffix layer's mask is not shown before ℓ_e+1
            return self._whole_pass(cache, ids, layer)
        kept = _HFPass((), {})

        def keep(i: int):
            def hook(_module, args, kwargs):
                if types:
                    kept.masks[types[i]] = kwargs.get("attention_mask")
                if i == layer:
                    kept.args, kept.kwargs = args, kwargs
                    raise _AtExit()
            return hook

        hooks = [self.layers[i].register_forward_pre_hook(keep(i), with_kwargs=True) for i in range(layer + 1)]
        try:
            self.model(**self._inputs(cache, ids))
        except _AtExit:
            pass
        finally:
            for hook in hooks:
                hook.remove()
        h = kept.args[0] if kept.args else kept.kwargs["hidden_states"]                  # [1, T, H]
        return ExitPass(h[0].float(), layer, kept)                                        # h^(ℓ_e) [T, H]

    def _whole_pass(self, cache: DynamicCache, ids: list[int], layer: int) -> ExitPass:
        """forward_to_exit without the stop: the whole pass runs now (no overlap), h^(ℓ_e) read on the way."""
        seen: list[torch.Tensor] = []

        def after_exit_layer(_module, _args, out):
            seen.append(out[0] if isinstance(out, tuple) else out)                        # [1, T, H]

        hook = self.layers[layer - 1].register_forward_hook(after_exit_layer)
        try:
            logits = self.forward(cache, ids)                                              # [T, V]
        finally:
            hook.remove()
        return ExitPass(seen[0][0].float(), layer, _HFPass((), {}, logits=logits))

    @torch.inference_mode()
    def finish_pass(self, exit_pass: ExitPass, rows: int | None = None) -> torch.Tensor:
        p: _HFPass = exit_pass.rest
        if p.logits is not None:
            return p.logits if rows is None else p.logits[p.logits.shape[0] - rows:]          # [rows, V]
        types = self.layer_types
        args, kwargs = p.args, dict(p.kwargs)
        hidden = args[0] if args else kwargs.pop("hidden_states")                        # [1, T, H]
        for i in range(exit_pass.layer, self.num_layers):
            if types:
                kwargs["attention_mask"] = p.masks[types[i]]
            out = self.layers[i](hidden, *args[1:], **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out                            # [1, T, H]
        hidden = hidden if rows is None else hidden[:, hidden.shape[1] - rows:]           # [1, rows, H]
        hidden = self.final_norm(hidden.to(self.final_norm.weight.device))
        return self.lm_head(hidden)[0, :, : self.vocab_size].float()                     # [T, V] ([rows, V])

    @torch.inference_mode()
    def exit_readout(self, h: torch.Tensor, layer: int) -> ExitLogits:
        if self.exit_head is not None and self.exit_head.layer == layer:
            return self.exit_head.columns(h.to(self.exit_head.w.device))                   # [T, V_e]
        h = h.to(self.final_norm.weight.device, self.final_norm.weight.dtype)
        return ExitLogits(self.lm_head(self.final_norm(h))[:, : self.vocab_size].float(), None,
                          self.vocab_size)                                                # [T, V]

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
