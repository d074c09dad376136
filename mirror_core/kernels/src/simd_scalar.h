// simd.h's vf and vi as plain arrays of 16 lanes, every operation a C loop in lane order: the reference variant,
// built with no -m flags. fmaf rounds once, as the vector FMAs do; nothing else fuses (-ffp-contract=off).
#pragma once

constexpr int GROUP = 4;  // rows per register block
struct vf { float l[VL]; };
struct vi { int32_t l[VL]; };

#define MSD_LANES(T, expr) T r; for (int i = 0; i < VL; i++) r.l[i] = (expr); return r
static inline vf vzero() { MSD_LANES(vf, 0.0f); }
static inline vf vbcast(float a) { MSD_LANES(vf, a); }
static inline vf vloadu(const float* p) { MSD_LANES(vf, p[i]); }
static inline vf vload(const float* p) { return vloadu(p); }
static inline void vstore(float* p, vf v) { for (int i = 0; i < VL; i++) p[i] = v.l[i]; }
static inline void vstore_cols(float* y, vf v, int64_t cols) { for (int i = 0; i < VL && i < cols; i++) y[i] = v.l[i]; }
static inline vf vfma(vf a, vf b, vf c) { MSD_LANES(vf, fmaf(a.l[i], b.l[i], c.l[i])); }
static inline vf vfnma(vf a, vf b, vf c) { MSD_LANES(vf, fmaf(-a.l[i], b.l[i], c.l[i])); }
static inline vf vadd(vf a, vf b) { MSD_LANES(vf, a.l[i] + b.l[i]); }
static inline vf vsub(vf a, vf b) { MSD_LANES(vf, a.l[i] - b.l[i]); }
static inline vf vmul(vf a, vf b) { MSD_LANES(vf, a.l[i] * b.l[i]); }
static inline vf vdiv(vf a, vf b) { MSD_LANES(vf, a.l[i] / b.l[i]); }
static inline vf vmax(vf a, vf b) { MSD_LANES(vf, a.l[i] > b.l[i] ? a.l[i] : b.l[i]); }  // maxps: b when either is NaN
static inline vf vmin(vf a, vf b) { MSD_LANES(vf, a.l[i] < b.l[i] ? a.l[i] : b.l[i]); }  // minps: b when either is NaN
static inline vf vround(vf a) { MSD_LANES(vf, nearbyintf(a.l[i])); }                      // to nearest even
static inline float pow2_1(float n) {  // 2^n for integral n in [−126, 127], exactly; NaN → as cvtps_epi32 does
    int32_t e = (n == n && n > -2147483648.0f && n < 2147483648.0f) ? (int32_t)n : INT32_MIN;
    uint32_t u = ((uint32_t)e + 127u) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline vf vpow2(vf n) { MSD_LANES(vf, pow2_1(n.l[i])); }
static inline vf vcvt(vi a) { MSD_LANES(vf, (float)a.l[i]); }
static inline vi vtoi(vf a) { MSD_LANES(vi, (int32_t)a.l[i]); }  // integral values in int32's range: exact
static inline vf vabs(vf a) { MSD_LANES(vf, fabsf(a.l[i])); }
static inline float hmax(vf a) {  // no NaN lanes: any order is exact
    float r = a.l[0];
    for (int i = 1; i < VL; i++) r = a.l[i] > r ? a.l[i] : r;
    return r;
}
static inline vf vload_f16(const uint16_t* p) { MSD_LANES(vf, f16_to_f32(p[i])); }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline vf vbf16_even(const uint32_t* p) { MSD_LANES(vf, bits_f32(p[i] << 16)); }
static inline vf vbf16_odd(const uint32_t* p) { MSD_LANES(vf, bits_f32(p[i] & 0xFFFF0000u)); }

static inline vi izero() { MSD_LANES(vi, 0); }
static inline vi iset(int32_t v) { MSD_LANES(vi, v); }
static inline vi iload(const uint8_t* p) { vi r; memcpy(r.l, p, 64); return r; }
static inline vi iload_u8(const uint8_t* p) { MSD_LANES(vi, (int32_t)p[i]); }
static inline vi iload_s8(const uint8_t* p) { MSD_LANES(vi, (int32_t)(int8_t)p[i]); }
static inline vi iand(vi a, vi b) { MSD_LANES(vi, a.l[i] & b.l[i]); }
static inline vi isrl4(vi a) { MSD_LANES(vi, (int32_t)((uint32_t)a.l[i] >> 4)); }
static inline vi iadd(vi a, vi b) { MSD_LANES(vi, a.l[i] + b.l[i]); }
static inline int32_t ihsum(vi a) { int32_t s = 0; for (int i = 0; i < VL; i++) s += a.l[i]; return s; }
static inline void istore_i8(uint8_t* p, vi a) { for (int i = 0; i < VL; i++) p[i] = (uint8_t)(int8_t)a.l[i]; }
static inline void istore(int32_t* p, vi a) { memcpy(p, a.l, 64); }
static inline int32_t byte_of(int32_t v, int t, bool sign) {
    uint32_t b = ((uint32_t)v >> (8 * t)) & 0xFFu;
    return sign ? (int32_t)(int8_t)b : (int32_t)b;
}
static inline int32_t dot4(int32_t a, int32_t b, bool a_signed) {
    int32_t s = 0;
    for (int t = 0; t < 4; t++) s += byte_of(a, t, a_signed) * byte_of(b, t, true);
    return s;
}
// One row's exact dot products over a block's 32 k for 16 columns (simd_avx512.h's dot32_u4 / dot32_s8).
static inline vi s8_weights(vi w) { return w; }
static inline vi dot32(const vi w[8], const uint8_t* x, bool w_signed) {
    vi s = izero();
    for (int g = 0; g < 8; g++) {
        int32_t a;
        memcpy(&a, x + 4 * g, 4);
        for (int i = 0; i < VL; i++) s.l[i] += dot4(w[g].l[i], a, w_signed);
    }
    return s;
}
static inline vi dot32_u4(const vi w[8], const uint8_t* x) { return dot32(w, x, false); }
static inline vi dot32_s8(const vi w[8], const uint8_t* x, int32_t) { return dot32(w, x, true); }
#undef MSD_LANES

static inline float hsum(vf v) {  // simd.h's tree
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = v.l[i] + v.l[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

static inline vf hsum16(const vf a[16]) {  // lane j = hsum(a[j])
    alignas(64) float t[VL];
    for (int j = 0; j < VL; j++) t[j] = hsum(a[j]);
    return vloadu(t);
}
