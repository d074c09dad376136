"""The kernel's builds, one per CPU kind: what each needs from the CPU and the compiler flags that make it. Every
variant computes the same bits as the scalar reference (src/simd.h says why), so the choice is only speed. No torch
here: config.py derives KERNEL_CHOICES from it.
"""
from __future__ import annotations

_AVX512 = ("-DMSD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c")
VARIANTS = {  # name → (CPU flags it needs, compiler flags), best first
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8", "fma", "f16c"),
            _AVX512 + ("-mavx512vnni", "-mamx-tile", "-mamx-int8")),
    "avx512_vnni": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"), _AVX512 + ("-mavx512vnni",)),
    "avx512": (("avx512f", "avx512bw", "avx512vl", "fma", "f16c"), _AVX512),
    "avx2": (("avx2", "fma", "f16c"), ("-DMSD_AVX2", "-mavx2", "-mfma", "-mf16c")),
    "scalar": ((), ()),  # plain C, no -m flags: any CPU, and the reference every other variant equals bit for bit
}
VARIANT_CODES = {6: "amx", 5: "avx512_vnni", 3: "avx512", 2: "avx2", 1: "scalar"}  # src/kernel.cpp's msd_variant
SCALAR = "scalar"
