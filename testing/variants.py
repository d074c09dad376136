"""The exact kernel's variants this CPU runs, split between the test tiers: the best one (what this machine runs)
and the AVX2 one (the path of every CPU without AVX-512) in the default tier, the ones between in the slow tier.
Each variant is a build of its own (about 7 s), so the default tier builds two."""
from __future__ import annotations

import pytest

from mirror_core.kernels import native

RUNNABLE = native.runnable_variants()
DEFAULT_TIER = tuple(dict.fromkeys(v for v in (RUNNABLE[:1] + tuple(x for x in RUNNABLE if x == "avx2")) if v))


def variant_params() -> list:
    """Every runnable variant as a pytest param; those outside DEFAULT_TIER marked slow."""
    return [v if v in DEFAULT_TIER else pytest.param(v, marks=pytest.mark.slow) for v in RUNNABLE]
