"""FeatureRunner: the feature-reading draft (models/feature_draft.py) in the target's token ids, with its KV cache.

Each call feeds tokens (target ids) with one feature each (the target's h^(ℓ_e), or the draft's own prediction g) and
returns the logits over the draft's own vocabulary ("other" at −inf: sampling them is sampling the target's vocabulary
with −inf outside the draft's; target_ids and over_target_vocab map what is drawn) and g, the draft's prediction of
the next position's feature. Cache entry i holds the keys and values of input (x_{i+1}, f_i).
Branch rows (fork) are copies of the sequence cache's first valid_lengths[r] entries, one row per branch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.formats import Q8_0
from ..kernels.native import STAND_INS, format_name
from ..models.feature_draft import FeatureDraft
from ..models.ops import RopeTable
from ..models.vocab import VocabMap
from .feature_kernel import PackedDraft, fits_blocks
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
        # the exact small-row kernel (runners.choose_kernel decides): the weights stay float32 and a step runs the
        # draft packed in the chosen format (feature_kernel.PackedDraft); none: set_dtypes moves the whole model
        self.kernel = kernel
        self._packed: PackedDraft | None = None
        self._rope = RopeTable(model.inv_freq, 1.0, torch.float32, exact=True)  # the kernel path's RoPE rows
        self._to_draft = vmap.to_draft.to(self.device)
        self._ids = vmap.target_ids.to(self.device)
        # over_target_vocab's gather: each target id's draft column, or "other"'s (p 0) for ids outside the vocabulary
        self._columns = torch.full((vmap.target_vocab_size,), vmap.size, dtype=torch.long, device=self.device)
        self._columns[self._ids] = torch.arange(vmap.size, device=self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed.dtype

    @property
    def formats(self) -> WeightFormats:
        """Without the kernel, every format the loaded weights round to (the whole draft moves); with it, also q8_0
        (Q8_0 blocks quantised from the draft's weights, int8 activations), where every map's inputs fill blocks."""
        quantised = (STAND_INS[Q8_0],) if self.kernel.library is not None and fits_blocks(self.model) else ()
        return WeightFormats(lower_formats(self.dtype) + quantised, whole_model=self.kernel.library is None)

    def set_dtypes(self, sequence: torch.dtype, rows: torch.dtype | None = None) -> None:
        """Run the draft in `sequence`, one format for every shape (runners/calibrate.py chooses it): with the kernel,
        packed in that format (feature_kernel.PackedDraft: activations and the KV cache stay float32); else the
        whole draft (weights, activations, KV cache) in it. The logits and predicted features it returns are
        float32."""
        if rows not in (None, sequence):
            raise ValueError("the feature-reading draft runs one format for every shape")
        if self.kernel.library is None:
            self.model.to(sequence)
            return
        self._packed = PackedDraft.of(self.model, format_name(sequence), self.kernel.library)

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
        """Append entries for (ids[t], features[t]) at positions cache_len..: logits [T, V_d+1] and g [T, H]; with
        `rows`, only the last rows' (0: none; a rollout reads the last, a branch batch's shared prefix none, a long
        catch-up its last alone)."""
        t, start = len(ids), cache.length
        end = start + t
        self._reserve(cache, end)
        draft_ids = self._draft_ids(torch.tensor(ids, device=self.device))                      # [T]
        if self._packed is not None:  # each layer one kernel call over the new rows, x [T, H] in place
            x = self._packed.inputs(draft_ids, features)                                          # [T, H]
            cos, sin = self._rope(torch.arange(start, end))                                       # [T, D] each
            for i, layer in enumerate(self._packed.layers):
                layer(x, cos, sin, cache.k[i], cache.v[i], start)
            cache.length = end
            x = x if rows is None else x[t - rows:]                                               # [T|rows, H]
            return self._out(self._packed.logits(x)), x
        m = self.model
        x = m.inputs(draft_ids.unsqueeze(0), features.to(self.device, self.dtype).unsqueeze(0))  # [1, T, H]
        pos = torch.arange(start, end, device=self.device).unsqueeze(0)                           # [1, T]
        may = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).unsqueeze(0)   # [1, T, S]
        for i, layer in enumerate(m.layers):
            q, k, v = m.qkv(layer, x, pos)
            cache.k[i, :, start:end] = k[0]
            cache.v[i, :, start:end] = v[0]
            x = m.finish(layer, x, q, cache.k[i, :, :end].unsqueeze(0), cache.v[i, :, :end].unsqueeze(0), may)
        cache.length = end
        x = x[0] if rows is None else x[0, max(0, t - rows):]                                    # [T or rows, H]
        return self._out(m.logits(x)), x.float()                                                  # [.., V_d+1], [.., H]

    # -- branch rows -----------------------------------------------------------------------------
    def fork(self, cache: FeatureCache, valid_lengths: list[int]) -> FeatureBranches:
        rows = len(valid_lengths)
        k = cache.k.unsqueeze(1).expand(-1, rows, -1, -1, -1).clone()                            # [L, R, Hkv, S, D]
        v = cache.v.unsqueeze(1).expand(-1, rows, -1, -1, -1).clone()
        return FeatureBranches(k, v, torch.tensor(valid_lengths, device=self.device))

    @torch.inference_mode()
    def forward_rows(self, br: FeatureBranches, ids: torch.Tensor, features: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One entry per row: ids [R] (target ids) with features [R, H] at each row's next position → logits
        [R, V_d+1], g [R, H]."""
        need = int(br.lengths.max()) + 1
        if need > br.k.shape[3]:
            grow = max(need, 2 * br.k.shape[3]) - br.k.shape[3]
            br.k = torch.nn.functional.pad(br.k, (0, 0, 0, grow))
            br.v = torch.nn.functional.pad(br.v, (0, 0, 0, grow))
        draft_ids = self._draft_ids(ids.to(self.device))                                          # [R]
        if self._packed is not None:  # each row its own kernel calls over its own cache row, x [R, H] in place
            x = self._packed.inputs(draft_ids, features)                                          # [R, H]
            cos, sin = self._rope(br.lengths)                                                     # [R, D] each
            for r, at in enumerate(br.lengths.tolist()):
                for i, layer in enumerate(self._packed.layers):
                    layer(x[r: r + 1], cos[r: r + 1], sin[r: r + 1], br.k[i, r], br.v[i, r], at)
            br.lengths = br.lengths + 1
            return self._out(self._packed.logits(x)), x                                          # [R, V_d+1], [R, H]
        m = self.model
        x = m.inputs(draft_ids.unsqueeze(1), features.to(self.device, self.dtype).unsqueeze(1))   # [R, 1, H]
        may = (torch.arange(need, device=self.device).unsqueeze(0) <= br.lengths.unsqueeze(1)).unsqueeze(1)  # [R,1,S]
        at = torch.arange(ids.shape[0], device=self.device)
        for i, layer in enumerate(m.layers):
            q, k, v = m.qkv(layer, x, br.lengths.unsqueeze(1))                                    # k [R, Hkv, 1, D]
            br.k[i, at, :, br.lengths] = k[:, :, 0]
            br.v[i, at, :, br.lengths] = v[:, :, 0]
            x = m.finish(layer, x, q, br.k[i, :, :, :need], br.v[i, :, :, :need], may)
        br.lengths = br.lengths + 1
        return self._out(m.logits(x[:, 0])), x[:, 0].float()                                    # [R, V_d+1], [R, H]

    def select_row(self, br: FeatureBranches, row: int) -> FeatureCache:
        n = int(br.lengths[row])
        return FeatureCache(br.k[:, row, :, :].clone(), br.v[:, row, :, :].clone(), n)

    # -- vocabulary ------------------------------------------------------------------------------
    def _draft_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self._to_draft[ids]

    def _out(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's logits [..., V_d+1] (a fresh tensor) as float32 with "other" at −inf (never drawn)."""
        logits = logits.float()
        logits[..., self.vmap.size] = float("-inf")
        return logits

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Tokens drawn from this runner's logits [...] → target ids [...]."""
        return self._ids[draft_ids.clamp(max=self.vmap.size - 1)]  # ("other", −inf, is drawn only from NaN logits)

    def over_target_vocab(self, p: torch.Tensor) -> torch.Tensor:
        """p_draft [..., V_d+1] over the draft's vocabulary → [..., V] over the target's, 0 outside it ("other"'s p
        is 0: each outside id reads it), one gather."""
        return p.index_select(-1, self._columns)                                                 # [..., V]
