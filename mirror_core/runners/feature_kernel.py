"""The feature-reading draft (models/feature_draft.py) as the exact kernel runs it (kernels/native.py).

PackedDraft is what FeatureRunner steps on a CPU with the kernel: W_fc, each decoder layer whole (one kernel call:
norms, q|k|v, RoPE, attention over its cache, o, SiLU MLP) and the head's A and E, packed in one format; the rest of
a step is a gather, a bias and a norm. In q8_0 (the pair's draft format) every map is int8 activations against Q8_0
blocks quantised from the draft's stored weights, so the draft's tokens are the same on every CPU the kernel runs on.

PackedMaps is each of the draft's maps alone in one format, as the `linear` its own maths takes: the held-out replay
of a format (scripts/draft_profile.py --format) multiplies exactly as the kernel does, with torch's attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.formats import QK
from ..kernels.native import NativeLayer, PackedLinear, rms_norm
from ..models.feature_draft import FeatureDraft


def _pack(w: torch.Tensor, fmt: str, lib) -> PackedLinear:
    """A draft weight w [out, in] packed as the map x → x · wᵀ."""
    return PackedLinear(w.detach().t().contiguous(), fmt, lib)


def fits_blocks(model: FeatureDraft) -> bool:
    """Every map's inputs come in whole blocks of QK (the block formats' condition): H, 2H, Hq·D and I."""
    c = model.cfg
    return all(k % QK == 0 for k in (c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size))


@dataclass(frozen=True)
class PackedDraft:
    """The draft packed for the kernel in one format; see the module docstring."""

    model: FeatureDraft
    fc: PackedLinear                  # [2H → H]
    layers: tuple[NativeLayer, ...]
    adapter: PackedLinear             # A [H → H]
    head: PackedLinear                # Eᵀ [H → V_d+1]
    lib: object

    @staticmethod
    def of(model: FeatureDraft, fmt: str, lib) -> "PackedDraft":
        c = model.cfg
        layers = tuple(NativeLayer(lib, ln1=ly["in_norm"], ln2=ly["post_norm"],
                                   qkv=_pack(torch.cat([ly["q"], ly["k"], ly["v"]]), fmt, lib), b_qkv=None,
                                   q_norm=None, k_norm=None, o=_pack(ly["o"], fmt, lib),
                                   gate_up=_pack(torch.cat([ly["gate"], ly["up"]]), fmt, lib),
                                   down=_pack(ly["down"], fmt, lib), heads=c.num_heads, kv_heads=c.num_kv_heads,
                                   head_dim=c.head_dim, eps=c.rms_norm_eps) for ly in model.layers)
        return PackedDraft(model, _pack(model.fc, fmt, lib), layers, _pack(model.head_adapter.t(), fmt, lib),
                           _pack(model.embed, fmt, lib), lib)

    def inputs(self, draft_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """u = W_fc [embed(ids); f]: draft_ids [N], features [N, H] → [N, H] (float32, contiguous)."""
        e = self.model.embed[draft_ids]                                                   # [N, H]
        return self.fc(torch.cat([e, features.to(torch.float32)], -1))                   # [N, H]

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """The head: g [N, H] → logits over the draft vocabulary [N, V_d+1] ("other" included)."""
        m = self.model
        z = rms_norm(self.lib, self.adapter(g) + m.head_bias, m.head_gain, m.cfg.rms_norm_eps)   # [N, H]
        return self.head(z)                                                              # [N, V_d+1]


class PackedMaps:
    """Each weight of a draft packed alone in one format: `maps(x, w)` is x [..., in] · wᵀ as the kernel computes it
    (the `linear` FeatureDraft's maths take), w's map found by FeatureDraft.weight_key."""

    def __init__(self, model: FeatureDraft, fmt: str, lib):
        self.model = model
        self.packed = {model.weight_key(w): _pack(w, fmt, lib) for w in model.matmul_weights()}

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.packed[self.model.weight_key(w)](x.float().contiguous())
