"""A linear map's weight in a GGUF file's own blocks (BlockWeights): what models/gguf_blocks.py reads from a file and
what the kernel packs (native.PackedLinear), checked here once for every user.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import QK


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """A linear map's weight W [N, K] (out, in: rows as a GGUF file stores them) in GGUF blocks of QK k:
    q4_1 (w = fp32(d)·q + fp32(m), q in 0..15) or q8_0 (w = fp32(d)·q, q int8)."""

    kind: str                        # "q4_1" or "q8_0"
    d: torch.Tensor                  # [N, K/QK] float16: each block's scale
    q: torch.Tensor                  # [N, K/QK, QK] uint8 (q4_1: 0..15) or int8 (q8_0)
    m: torch.Tensor | None = None    # [N, K/QK] float16: each block's minimum (q4_1 only)

    def __post_init__(self):
        want = {"q4_1": torch.uint8, "q8_0": torch.int8}.get(self.kind)
        if want is None:
            raise ValueError(f"unknown block format {self.kind!r} (known: q4_1, q8_0)")
        n, kb = self.d.shape if self.d.dim() == 2 else (-1, -1)
        ok = (self.d.dtype == torch.float16 and self.q.dtype == want and tuple(self.q.shape) == (n, kb, QK)
              and (self.m is None) == (self.kind == "q8_0")
              and (self.m is None or (self.m.dtype == torch.float16 and self.m.shape == self.d.shape)))
        if not ok:
            raise ValueError(f"{self.kind} blocks: d {tuple(self.d.shape)} {self.d.dtype}, q {tuple(self.q.shape)} "
                             f"{self.q.dtype}, m {None if self.m is None else tuple(self.m.shape)} do not fit")

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): outputs and inputs."""
        return int(self.d.shape[0]), int(self.d.shape[1]) * QK

    def dequantize(self) -> torch.Tensor:
        """W [N, K] float32 as gguf dequantises it (d·q is exact in float32, then + m rounds once)."""
        w = self.d.float().unsqueeze(-1) * self.q.float()                                 # [N, K/QK, QK]
        if self.m is not None:
            w = w + self.m.float().unsqueeze(-1)
        return w.reshape(self.shape)                                                      # [N, K]

    def rows(self, index: torch.Tensor) -> "BlockWeights":
        """The weight's rows `index` (outputs), e.g. the exit head's readout tokens of a tied LM head."""
        return BlockWeights(self.kind, self.d[index], self.q[index], None if self.m is None else self.m[index])

    @staticmethod
    def cat(parts: list["BlockWeights"]) -> "BlockWeights":
        """Outputs stacked (fused maps: q|k|v, gate|up); every part in one block format."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"fused blocks must share one format, got {sorted(kinds)}")
        m = None if parts[0].m is None else torch.cat([p.m for p in parts])
        return BlockWeights(parts[0].kind, torch.cat([p.d for p in parts]), torch.cat([p.q for p in parts]), m)

    @staticmethod
    def random(kind: str, n: int, k: int, gen: torch.Generator) -> "BlockWeights":
        """Random blocks of a weight [N, K] (q4_1: values 0..15, a scale and a minimum; q8_0: int8 values and a
        scale): what the kernel's timings (scripts/kernel_rows.py) and its tests run on."""
        d = (torch.rand(n, k // QK, generator=gen) * 0.02).half()
        if kind == "q4_1":
            q = torch.randint(0, 16, (n, k // QK, QK), generator=gen, dtype=torch.uint8)
            return BlockWeights(kind, d, q, (-torch.rand(n, k // QK, generator=gen) * 0.1).half())
        return BlockWeights(kind, d, torch.randint(-128, 128, (n, k // QK, QK), generator=gen, dtype=torch.int8))
