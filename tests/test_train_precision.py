"""The training pipeline's dtype (train/precision.py): "auto" takes bfloat16 only where it is measured faster, on
every CPU kind (forced here both ways: with bf16 units, without), and what ran is what the records name."""
from __future__ import annotations

import pytest
import torch

from training import precision


@pytest.fixture
def bf16_units(monkeypatch):
    """Force the measurement's answer: a CPU whose bfloat16 products run at `speedup` times float32's speed."""
    def force(speedup: float) -> None:
        monkeypatch.setattr(precision, "bf16_speedup", lambda: speedup)
    return force


@pytest.mark.parametrize("speedup, chosen", [(8.0, "bfloat16"), (1.5, "bfloat16"), (1.05, "float32"),
                                             (0.12, "float32")])  # AMX, avx512_bf16, a tie, AVX2 only (measured 8x)
def test_auto_takes_bfloat16_only_where_it_is_measured_faster(bf16_units, speedup, chosen):
    bf16_units(speedup)
    assert precision.resolve("auto") == chosen and precision.torch_dtype("auto") == getattr(torch, chosen)
    assert precision.resolve("float32") == "float32" and precision.resolve("bfloat16") == "bfloat16"  # forced: as is
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with precision.autocast("auto"):
        y = torch.nn.functional.linear(x, w)
    assert y.dtype == getattr(torch, chosen)


def test_the_measurement_is_a_real_timing_made_once():
    precision.bf16_speedup.cache_clear()
    s = precision.bf16_speedup()
    assert s > 0 and precision.bf16_speedup() is s  # cached per process
    assert precision.resolve("auto") in ("bfloat16", "float32")


def test_an_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="auto, bfloat16, float32"):
        precision.resolve("float16")
