// simd.h's vf and vi on one zmm register each (AVX-512 F/BW/VL with FMA and F16C; VNNI where the build has it).
#pragma once

constexpr int GROUP = 8;  // rows per register block: 8 rows x 2 vf accumulators per panel
typedef __m512 vf;
typedef __m512i vi;

static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vbcast(float a) { return _mm512_set1_ps(a); }
static inline vf vload(const float* p) { return _mm512_load_ps(p); }    // 64-byte aligned
static inline vf vloadu(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline void vstore_cols(float* y, vf v, int64_t cols) {  // lanes 0..cols−1 (cols ≥ 1)
    if (cols >= VL) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << cols) - 1u), v);
}
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }    // a·b + c, rounded once
static inline vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c − a·b, rounded once
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vpow2(vf n) {  // 2^n for integral n in [−126, 127], exactly
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline vf vcvt(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vi vtoi(vf a) { return _mm512_cvtps_epi32(a); }  // integral values in int32's range: exact
static inline vf vabs(vf a) { return _mm512_abs_ps(a); }
static inline float hmax(vf a) { return _mm512_reduce_max_ps(a); }  // no NaN lanes: any order is exact
static inline vf vload_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
// 16 bfloat16 pairs (k even in the low half of each 32-bit lane) → the even or the odd weights as float32, exactly
static inline vf vbf16_even(const uint32_t* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(p), 16)); }
static inline vf vbf16_odd(const uint32_t* p) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(p), _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline vi izero() { return _mm512_setzero_si512(); }
static inline vi iset(int32_t v) { return _mm512_set1_epi32(v); }
static inline vi iload(const uint8_t* p) { return _mm512_load_si512((const void*)p); }  // 64-byte aligned
static inline vi iload_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline vi iload_s8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline vi iand(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi iadd(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline int32_t ihsum(vi a) { return _mm512_reduce_add_epi32(a); }
static inline void istore_i8(uint8_t* p, vi a) { _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(a)); }  // −128..127
static inline vi isrl4(vi a) { return _mm512_srli_epi32(a, 4); }
static inline void istore(int32_t* p, vi a) { _mm512_storeu_si512((void*)p, a); }

// One row's exact dot products over a block's 32 k for 16 columns: w[g] holds group g's 4 k (byte t of lane l:
// column l's k = 4g + t), x the row's 32 int8 values. dot32_u4: w in 0..15 (q4_1); dot32_s8: int8 w as s8_weights
// made them once per block, base = −128·Σx (q8_0).
#if defined(__AVX512VNNI__)
// vpdpbusd, two chains. q8_0: the weights plus 128 as the unsigned operand; base takes the 128s back out.
static inline vi s8_weights(vi w) { return _mm512_xor_si512(w, iset((int32_t)0x80808080u)); }
template <bool U4>
static inline vi dot32(const vi w[8], const uint8_t* x, int32_t base) {
    vi s0 = U4 ? izero() : iset(base), s1 = izero();
    for (int g = 0; g < 8; g += 2) {
        int32_t a, b;
        memcpy(&a, x + 4 * g, 4);
        memcpy(&b, x + 4 * g + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, w[g], iset(a));
        s1 = _mm512_dpbusd_epi32(s1, w[g + 1], iset(b));
    }
    return _mm512_add_epi32(s0, s1);
}
#else
static inline vi s8_weights(vi w) { return w; }
template <bool U4>
static inline vi dot32(const vi w[8], const uint8_t* x, int32_t) {
    vi s = izero();
    if (U4) {  // maddubs pairs ≤ 2·15·127, so 8 groups' pairs add up in int16 (≤ 30480) before one madd
        vi p = izero();
        for (int g = 0; g < 8; g++) {
            int32_t a;
            memcpy(&a, x + 4 * g, 4);
            p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[g], iset(a)));
        }
        return _mm512_madd_epi16(p, _mm512_set1_epi16(1));
    }
    for (int g = 0; g < 8; g++) {  // the even and the odd bytes sign-extended to int16, then madd
        int32_t a;
        memcpy(&a, x + 4 * g, 4);
        const vi xv = iset(a);
        vi we = _mm512_srai_epi16(_mm512_slli_epi16(w[g], 8), 8), wo = _mm512_srai_epi16(w[g], 8);
        vi xe = _mm512_srai_epi16(_mm512_slli_epi16(xv, 8), 8), xo = _mm512_srai_epi16(xv, 8);
        s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_madd_epi16(we, xe), _mm512_madd_epi16(wo, xo)));
    }
    return s;
}
#endif
static inline vi dot32_u4(const vi w[8], const uint8_t* x) { return dot32<true>(w, x, 0); }
static inline vi dot32_s8(const vi w[8], const uint8_t* x, int32_t base) { return dot32<false>(w, x, base); }

// lane j = hsum(a[j]) for 16 vectors at once, by the same tree pair for pair: (i, i+8) of each vector, then (i, i+4),
// (i, i+2), (0, 1), each level adding two shuffled vectors; the keys come out in lanes 4k + t for j = 4t + k.
static inline vf hsum16(const vf a[16]) {
    vf c[8], d[4], f[2];
    for (int j = 0; j < 8; j++)
        c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44), _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; j++)
        d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88), _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++) {
        const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(d[2 * j]), _mm512_castps_pd(d[2 * j + 1]));
        const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(d[2 * j]), _mm512_castps_pd(d[2 * j + 1]));
        f[j] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    const vf h = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), h);
}

static inline float hsum(vf v) {  // simd.h's tree: (i, i+8), (i, i+4), (i, i+2), (0, 1)
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
