"""The exact kernel's variants this CPU runs, split between the test tiers: the best one (what this machine runs),
the AVX2 one (the path of every CPU without AVX-512) and the scalar reference (what every variant must equal) in the
default tier, the ones between in the slow tier. Each variant is a build of its own (7-20 s), so the default tier
builds three."""
from __future__ import annotations

import pytest

from mirror_core.kernels import native
from mirror_core.kernels.variants import SCALAR

RUNNABLE = native.runnable_variants()
DEFAULT_TIER = tuple(dict.fromkeys(v for v in (RUNNABLE[:1] + tuple(x for x in RUNNABLE if x in ("avx2", SCALAR))) if v))


def variant_params() -> list:
    """Every runnable variant as a pytest param; those outside DEFAULT_TIER marked slow."""
    return [v if v in DEFAULT_TIER else pytest.param(v, marks=pytest.mark.slow) for v in RUNNABLE]
