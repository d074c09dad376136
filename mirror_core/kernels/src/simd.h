// The one SIMD layer: every kernel is written once against a float vector `vf` of 16 lanes and an integer vector
// `vi` of 16 int32 lanes (64 bytes), and this file maps both onto each variant's registers:
//   MSD_AVX512  one zmm register (AVX-512 F/BW/VL, FMA, F16C; VNNI's vpdpbusd where __AVX512VNNI__)
//   MSD_AVX2    a pair of ymm registers, lanes 0..7 and 8..15 (AVX2, FMA, F16C)
//   MSD_SCALAR  plain C arrays of 16 (no -m flags: any CPU, ARM included; the reference the others must equal)
// The width is the function's, not the CPU's: a lane is a lane on every variant, and every operation here is exact
// or rounds once, lane by lane (fma rounds once; hsum adds in one fixed tree), so a kernel computes the same bits
// whichever variant runs it. Integer dot products are exact, so their grouping is free.
// hsum(v), the one horizontal sum: a[i] = v[i] + v[i+8] (i < 8), b[i] = a[i] + a[i+4], c[i] = b[i] + b[i+2],
// then c[0] + c[1].
#pragma once
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(MSD_AVX512) || defined(MSD_AVX2)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() {}
#endif
static inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

constexpr int VL = 16;  // lanes of vf and vi

// float16 bits ↔ float32, exactly as F16C does (round to nearest even; subnormals, infinities and NaNs kept)
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
    if (exp == 0x1F) u = sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u);  // inf, quiet NaN
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN stays a quiet NaN
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                         // rounds to infinity
    if (a >= 0x38800000u) {                                                           // normal half
        const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - (112u << 23);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign;                                       // below half the least subnormal
    const uint32_t e = a >> 23, man = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;   // subnormal half
    const uint32_t half = man >> shift, rest = man & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    return (uint16_t)(sign | (half + (rest > mid || (rest == mid && (half & 1u)))));
}

#if defined(MSD_AVX512)
#include "simd_avx512.h"
#elif defined(MSD_AVX2)
#include "simd_avx2.h"
#else
#include "simd_scalar.h"
#endif

// e^x lane by lane (softmax's shifted scores, SiLU's sigmoid): 2^n · p(r) with n = round(x·log2 e), r = x − n·ln 2
// in two parts, p Cephes' degree-6 polynomial (relative error ~2e-7); x is clamped to [−87, 88], and a NaN stays NaN
// (max/min return their second operand when one is NaN), so a NaN or infinite score poisons its row as torch's
// softmax does. The same bits for a value wherever it sits, so a row's result never depends on its neighbours.
static inline vf vexp(vf x) {
    x = vmin(vbcast(88.0f), vmax(vbcast(-87.0f), x));
    vf n = vround(vmul(x, vbcast(1.44269504088896341f)));
    vf r = vfnma(n, vbcast(-2.12194440e-4f), vfnma(n, vbcast(0.693359375f), x));
    vf p = vbcast(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        p = vfma(p, r, vbcast(c));
    p = vfma(p, vmul(r, r), vadd(r, vbcast(1.0f)));
    return vmul(p, vpow2(n));
}

// silu(g)·u = g / (1 + e^(−g)) · u, lane by lane
static inline vf vsilu_mul(vf g, vf u) { return vmul(vdiv(g, vadd(vbcast(1.0f), vexp(vsub(vzero(), g)))), u); }
