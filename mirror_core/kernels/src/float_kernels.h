// Register blocks of float weights: R rows of x against one panel, each output one sequential FMA chain over k,
//     acc[r][j] = fma(x[r][k], W[k][j], acc[r][j])      k = 0, 1, ..., K−1, acc starting at 0,
// whatever R is: rows never share an accumulator and K is never split, so a row's output is the same bits in a call
// of any size and at any place in it, and on every variant (an FMA rounds once, lane by lane).
#pragma once

template <typename X, typename W>
using Block = void (*)(const X*, int64_t, const W*, int64_t, float*, int64_t, int64_t, int64_t);

static inline void store_block(float* y, int64_t y_stride, int rows, vf acc[][NV], int64_t col0, int64_t n) {
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV; v++) {
            int64_t c = col0 + v * VL;
            if (c < n) vstore_cols(y + r * y_stride + c, acc[r][v], n - c);
        }
}

static inline vf wload(const float* p) { return vload(p); }
static inline vf wload(const uint16_t* p) { return vload_f16(p); }  // float16, widened exactly

// f32 and f16: x [R rows, row stride xs], one panel w [k][PANEL].
template <int R, typename W>
static void block_fma(const float* x, int64_t xs, const W* w, int64_t k, float* y, int64_t ys, int64_t col0, int64_t n) {
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t i = 0; i < k; i++) {
        const W* wk = w + i * PANEL;
        vf wv[NV];
        for (int v = 0; v < NV; v++) wv[v] = wload(wk + v * VL);
        for (int r = 0; r < R; r++) {
            vf b = vbcast(x[r * xs + i]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(b, wv[v], acc[r][v]);
        }
    }
    store_block(y, ys, R, acc, col0, n);
}

// bf16: x as bfloat16 pairs (xp[r][i] = x[r][2i] | x[r][2i+1] << 16), the panel as k-pairs; both widened exactly to
// float32, then two FMAs per pair (k even, then k odd): the f32 chain over the rounded values.
static inline float bf16_lo(uint32_t p) { uint32_t u = p << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float bf16_hi(uint32_t p) { uint32_t u = p & 0xFFFF0000u; float f; memcpy(&f, &u, 4); return f; }
template <int R>
static void block_bf16(const uint32_t* xp, int64_t xs, const uint32_t* w, int64_t k2, float* y, int64_t ys, int64_t col0, int64_t n) {
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t i = 0; i < k2; i++) {
        const uint32_t* wk = w + i * PANEL;
        for (int r = 0; r < R; r++) {
            uint32_t p = xp[r * xs + i];
            vf be = vbcast(bf16_lo(p)), bo = vbcast(bf16_hi(p));
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(be, vbf16_even(wk + v * VL), acc[r][v]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(bo, vbf16_odd(wk + v * VL), acc[r][v]);
        }
    }
    store_block(y, ys, R, acc, col0, n);
}

static inline uint16_t to_bf16(float f) {  // round to nearest even; a NaN stays a (quiet) NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
