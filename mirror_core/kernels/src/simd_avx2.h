// simd.h's vf and vi on a pair of ymm registers: lo holds lanes 0..7, hi lanes 8..15 (AVX2, FMA, F16C).
#pragma once

constexpr int GROUP = 3;  // rows per register block: 3 rows x 2 vf (4 ymm) accumulators per panel
struct vf { __m256 lo, hi; };
struct vi { __m256i lo, hi; };

#define MSD_F2(op, ...) vf{op(a.lo, ##__VA_ARGS__), op(a.hi, ##__VA_ARGS__)}
static inline vf vzero() { return vf{_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vf vbcast(float x) { __m256 v = _mm256_set1_ps(x); return vf{v, v}; }
static inline vf vload(const float* p) { return vf{_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }  // 32-byte aligned
static inline vf vloadu(const float* p) { return vf{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline void store8_cols(float* y, __m256 v, int64_t cols) {
    if (cols >= 8) { _mm256_storeu_ps(y, v); return; }
    alignas(32) int32_t m[8];
    for (int i = 0; i < 8; i++) m[i] = i < cols ? -1 : 0;
    _mm256_maskstore_ps(y, _mm256_load_si256((const __m256i*)m), v);
}
static inline void vstore_cols(float* y, vf v, int64_t cols) {  // lanes 0..cols−1 (cols ≥ 1)
    store8_cols(y, v.lo, cols);
    if (cols > 8) store8_cols(y + 8, v.hi, cols - 8);
}
static inline vf vfma(vf a, vf b, vf c) { return vf{_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
static inline vf vfnma(vf a, vf b, vf c) { return vf{_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
static inline vf vadd(vf a, vf b) { return vf{_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline vf vsub(vf a, vf b) { return vf{_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline vf vmul(vf a, vf b) { return vf{_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline vf vdiv(vf a, vf b) { return vf{_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
static inline vf vmax(vf a, vf b) { return vf{_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline vf vmin(vf a, vf b) { return vf{_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
static inline vf vround(vf a) { return MSD_F2(_mm256_round_ps, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline __m256 pow2_8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf vpow2(vf a) { return MSD_F2(pow2_8); }  // 2^n for integral n in [−126, 127], exactly
static inline vf vcvt(vi a) { return vf{_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
static inline vi vtoi(vf a) { return vi{_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }  // integral: exact
static inline vf vabs(vf a) {
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return vf{_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
static inline float hmax(vf a) {  // no NaN lanes: any order is exact
    alignas(32) float t[VL];
    vstore(t, a);
    float r = t[0];
    for (int i = 1; i < VL; i++) r = t[i] > r ? t[i] : r;
    return r;
}
static inline vf vload_f16(const uint16_t* p) {
    return vf{_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
static inline vf vbf16_even(const uint32_t* p) {  // simd_avx512.h's, 8 lanes at a time
    return vf{_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256((const __m256i*)p), 16)),
              _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256((const __m256i*)(p + 8)), 16))};
}
static inline vf vbf16_odd(const uint32_t* p) {
    const __m256i m = _mm256_set1_epi32((int)0xFFFF0000u);
    return vf{_mm256_castsi256_ps(_mm256_and_si256(_mm256_load_si256((const __m256i*)p), m)),
              _mm256_castsi256_ps(_mm256_and_si256(_mm256_load_si256((const __m256i*)(p + 8)), m))};
}
#undef MSD_F2

static inline vi izero() { return vi{_mm256_setzero_si256(), _mm256_setzero_si256()}; }
static inline vi iset(int32_t x) { __m256i v = _mm256_set1_epi32(x); return vi{v, v}; }
static inline vi iload(const uint8_t* p) { return vi{_mm256_load_si256((const __m256i*)p), _mm256_load_si256((const __m256i*)(p + 32))}; }
static inline vi iload_u8(const uint8_t* p) {
    __m128i b = _mm_loadu_si128((const __m128i*)p);
    return vi{_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))};
}
static inline vi iload_s8(const uint8_t* p) {
    __m128i b = _mm_loadu_si128((const __m128i*)p);
    return vi{_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))};
}
static inline vi iand(vi a, vi b) { return vi{_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
static inline vi isrl4(vi a) { return vi{_mm256_srli_epi32(a.lo, 4), _mm256_srli_epi32(a.hi, 4)}; }
static inline vi iadd(vi a, vi b) { return vi{_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
static inline void istore(int32_t* p, vi a) { _mm256_storeu_si256((__m256i*)p, a.lo); _mm256_storeu_si256((__m256i*)(p + 8), a.hi); }

// One row's exact dot products over a block's 32 k for 16 columns (simd_avx512.h's dot32_u4 / dot32_s8).
static inline vi s8_weights(vi w) { return w; }
static inline __m256i bcast8(const uint8_t* x) { int32_t a; memcpy(&a, x, 4); return _mm256_set1_epi32(a); }
static inline vi dot32_u4(const vi w[8], const uint8_t* x) {  // int16 pairs ≤ 2·15·127: 8 groups add up to ≤ 30480
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        const __m256i xv = bcast8(x + 4 * g);
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w[g].lo, xv));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w[g].hi, xv));
    }
    const __m256i one = _mm256_set1_epi16(1);
    return vi{_mm256_madd_epi16(lo, one), _mm256_madd_epi16(hi, one)};
}
static inline __m256i dot8_s8s8(__m256i acc, __m256i w, __m256i x) {  // |w| ≤ 128 unsigned, x with w's sign
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)),
                                                   _mm256_set1_epi16(1)));
}
static inline vi dot32_s8(const vi w[8], const uint8_t* x, int32_t) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        const __m256i xv = bcast8(x + 4 * g);
        lo = dot8_s8s8(lo, w[g].lo, xv);
        hi = dot8_s8s8(hi, w[g].hi, xv);
    }
    return vi{lo, hi};
}
static inline int32_t ihsum(vi a) {
    alignas(32) int32_t t[VL];
    istore(t, a);
    int32_t s = 0;
    for (int i = 0; i < VL; i++) s += t[i];
    return s;
}
static inline void istore_i8(uint8_t* p, vi a) {  // −128..127
    alignas(32) int32_t t[VL];
    istore(t, a);
    for (int i = 0; i < VL; i++) p[i] = (uint8_t)(int8_t)t[i];
}

static inline float hsum(vf v) {  // simd.h's tree: (i, i+8) is lo + hi, then (i, i+4), (i, i+2), (0, 1)
    __m256 h = _mm256_add_ps(v.lo, v.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

static inline vf hsum16(const vf a[16]) {  // lane j = hsum(a[j])
    alignas(64) float t[VL];
    for (int j = 0; j < VL; j++) t[j] = hsum(a[j]);
    return vloadu(t);
}
