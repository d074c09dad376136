"""FeatureRunner: the feature-reading draft (models/feature_draft.py) in the target's token ids, with its KV cache.

Each call feeds tokens with one feature each (the target's h^(ℓ_e), or the draft's own prediction g) and returns the
logits over the target's vocabulary (−inf outside the draft's reduced vocabulary) and g, the draft's prediction of the
next position's feature. Cache entry i holds the keys and values of input (x_{i+1}, f_i).
Branch rows (fork) are copies of the sequence cache's first valid_lengths[r] entries, one row per branch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.native import PackedLinear, format_name
from ..models.feature_draft import FeatureDraft
from ..models.vocab import VocabMap
from .protocol import NO_KERNEL, KernelChoice, WeightFormats, lower_formats


@dataclass
class FeatureCache:
    k: torch.Tensor          # [L, Hkv, S_cap, D]
    v: torch.Tensor          # [L, Hkv, S_cap, D]
    length: int = 0


@dataclass
class FeatureBranches:
    k: torch.Tensor          # [L, R, Hkv, S_cap, D]
    v: torch.Tensor          # [L, R, Hkv, S_cap, D]
    lengths: torch.Tensor    # [R] entries each row holds (its next entry's position)


class FeatureRunner:
    """The draft lane's runner for a FeatureDraft; see the module docstring."""

    num_streams = 0
    reads_features = True
    plans_rows = False     # a draft's rounding never changes the output: its calls need no row plan
    row_plan = None
    exit_head = None       # a draft reads out nothing at ℓ_e
    weight_stream = None   # not drawn against a roofline

    def __init__(self, model: FeatureDraft, vmap: VocabMap, device: str | torch.device = "cpu",
                 kernel: KernelChoice = NO_KERNEL):
        self.model = model.to(device)
        self.cfg = model.cfg
        self.vmap = vmap
        self.device = torch.device(device)
        self.devices = (self.device,)
        self.vocab_size = vmap.target_vocab_size
        self.feature_layer = model.cfg.feature_layer
        self.num_layers = model.cfg.num_layers
        self.max_positions = model.cfg.max_positions
        # the exact small-row kernel (runners.choose_kernel decides): the weights stay float32 and every product
        # runs packed in the chosen format; none: set_dtypes moves the whole model
        self.kernel = kernel
        self._packed: dict[tuple, PackedLinear] = {}  # the packed map of each weight (FeatureDraft.weight_key)
        self._to_draft = vmap.to_draft.to(self.device)
        self._ids = vmap.target_ids.to(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed.dtype

    @property
    def formats(self) -> WeightFormats:
        return WeightFormats(lower_formats(self.dtype), whole_model=self.kernel.library is None)

    def set_dtypes(self, sequence: torch.dtype, rows: torch.dtype | None = None) -> None:
        """Run the draft's products in `sequence`, one format for every shape (runners/calibrate.py chooses it): with
        the kernel, its linear maps packed in that format (activations and the KV cache stay float32); else the
        whole draft (weights, activations, KV cache) in it. The logits and predicted features it returns stay
        float32."""
        if rows not in (None, sequence):
            raise ValueError("the feature-reading draft runs one format for every shape")
        if self.kernel.library is None:
            self.model.to(sequence)
            return
        fmt = format_name(sequence)
        self._packed = {self.model.weight_key(w): PackedLinear(w.detach().t(), fmt, self.kernel.library)
                        for w in self.model.matmul_weights()}

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [..., in] @ wᵀ for a weight w [out, in] of the draft: its packed map where set_dtypes packed it."""
        packed = self._packed.get(self.model.weight_key(w)) if self._packed else None
        return x @ w.t() if packed is None else packed(x)

    # -- sequences -------------------------------------------------------------------------------
    def new_cache(self, capacity: int = 256) -> FeatureCache:
        c = self.cfg
        shape = (c.num_layers, c.num_kv_heads, capacity, c.head_dim)
        return FeatureCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                            torch.zeros(shape, dtype=self.dtype, device=self.device))

    def cache_len(self, cache: FeatureCache) -> int:
        return cache.length

    def truncate(self, cache: FeatureCache, length: int) -> None:
        cache.length = min(cache.length, length)

    def _reserve(self, cache: FeatureCache, need: int) -> None:
        if need > cache.k.shape[2]:
            grow = max(need, 2 * cache.k.shape[2]) - cache.k.shape[2]
            pad = (0, 0, 0, grow)
            cache.k = torch.nn.functional.pad(cache.k, pad)
            cache.v = torch.nn.functional.pad(cache.v, pad)

    @torch.inference_mode()
    def forward(self, cache: FeatureCache, ids: list[int], features: torch.Tensor, rows: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append entries for (ids[t], features[t]) at positions cache_len..: logits [T, V] and g [T, H] (with
        `rows`: of the last `rows` entries only, so a long catch-up runs its head on those alone)."""
        t, start = len(ids), cache.length
        end = start + t
        self._reserve(cache, end)
        m = self.model
        x = m.inputs(self._draft_ids(torch.tensor(ids, device=self.device)).unsqueeze(0),
                     features.to(self.device, self.dtype).unsqueeze(0), self._linear)            # [1, T, H]
        pos = torch.arange(start, end, device=self.device).unsqueeze(0)                           # [1, T]
        may = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).unsqueeze(0)   # [1, T, S]
        for i, layer in enumerate(m.layers):
            q, k, v = m.qkv(layer, x, pos, self._linear)
            cache.k[i, :, start:end] = k[0]
            cache.v[i, :, start:end] = v[0]
            x = m.finish(layer, x, q, cache.k[i, :, :end].unsqueeze(0), cache.v[i, :, :end].unsqueeze(0), may,
                         self._linear)
        cache.length = end
        x = x[0] if rows is None else x[0, max(0, t - rows):]                                    # [T or rows, H]
        return self._out(m.logits(x, self._linear)), x.float()                                   # [.., V], [.., H]

    # -- branch rows -----------------------------------------------------------------------------
    def fork(self, cache: FeatureCache, valid_lengths: list[int]) -> FeatureBranches:
        rows = len(valid_lengths)
        k = cache.k.unsqueeze(1).expand(-1, rows, -1, -1, -1).clone()                            # [L, R, Hkv, S, D]
        v = cache.v.unsqueeze(1).expand(-1, rows, -1, -1, -1).clone()
        return FeatureBranches(k, v, torch.tensor(valid_lengths, device=self.device))

    @torch.inference_mode()
    def forward_rows(self, br: FeatureBranches, ids: torch.Tensor, features: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One entry per row: ids [R] (target ids) with features [R, H] at each row's next position → logits [R, V],
        g [R, H]."""
        rows = ids.shape[0]
        need = int(br.lengths.max()) + 1
        if need > br.k.shape[3]:
            grow = max(need, 2 * br.k.shape[3]) - br.k.shape[3]
            br.k = torch.nn.functional.pad(br.k, (0, 0, 0, grow))
            br.v = torch.nn.functional.pad(br.v, (0, 0, 0, grow))
        m = self.model
        x = m.inputs(self._draft_ids(ids.to(self.device)).unsqueeze(1),
                     features.to(self.device, self.dtype).unsqueeze(1), self._linear)            # [R, 1, H]
        pos = br.lengths.unsqueeze(1)                                                             # [R, 1]
        s = need
        may = (torch.arange(s, device=self.device).unsqueeze(0) <= br.lengths.unsqueeze(1)).unsqueeze(1)  # [R, 1, S]
        at = torch.arange(rows, device=self.device)
        for i, layer in enumerate(m.layers):
            q, k, v = m.qkv(layer, x, pos, self._linear)                                          # k [R, Hkv, 1, D]
            br.k[i, at, :, br.lengths] = k[:, :, 0]
            br.v[i, at, :, br.lengths] = v[:, :, 0]
            x = m.finish(layer, x, q, br.k[i, :, :, :s], br.v[i, :, :, :s], may, self._linear)
        br.lengths = br.lengths + 1
        return self._out(m.logits(x[:, 0], self._linear)), x[:, 0].float()                      # [R, V], [R, H]

    def select_row(self, br: FeatureBranches, row: int) -> FeatureCache:
        n = int(br.lengths[row])
        return FeatureCache(br.k[:, row, :, :].clone(), br.v[:, row, :, :].clone(), n)

    # -- vocabulary ------------------------------------------------------------------------------
    def _draft_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self._to_draft[ids]

    def _out(self, logits: torch.Tensor) -> torch.Tensor:
        full = logits.new_full(logits.shape[:-1] + (self.vocab_size,), float("-inf")).float()     # [..., V]
        full[..., self._ids] = logits[..., : self.vmap.size].float()                               # "other" dropped
        return full
