// Packing, once per weight, in plain C on every variant (the same bytes everywhere). Output buffers are zero-filled
// by the caller and 64-byte aligned; columns past n stay zero and are never stored.
#pragma once

// One packed element from the weights at w (the next k's weight `stride` floats on, present or not).
static inline float as_f32(const float* w, int64_t, bool) { return w[0]; }
static inline uint16_t as_f16(const float* w, int64_t, bool) { return f32_to_f16(w[0]); }
static inline uint32_t as_bf16_pair(const float* w, int64_t stride, bool has_next) {  // k even low, k + 1 high
    return (uint32_t)to_bf16(w[0]) | ((has_next ? (uint32_t)to_bf16(w[stride]) : 0u) << 16);
}

// W [k, n] (row stride ws) into panels of PANEL columns, `per` rows of k in each packed element (2: bf16 pairs).
template <typename T, T (*ELEMENT)(const float*, int64_t, bool)>
static int pack_panels(const float* w, int64_t k, int64_t n, int64_t ws, T* out, int64_t per) {
    if (k < 1 || n < 1 || ws < n || !w || !out) return 1;
    const int64_t panels = (n + PANEL - 1) / PANEL, kp = (k + per - 1) / per;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t i = 0; i < kp; i++)
            for (int64_t j = 0; j < PANEL && p * PANEL + j < n; j++)
                out[(p * kp + i) * PANEL + j] = ELEMENT(w + (per * i) * ws + p * PANEL + j, ws, per * i + 1 < k);
    return 0;
}

// Where value i (the k within its block) of panel column j goes in a packed block (formats.h), and its shift
// (4: a high nibble).
struct Place {
    int64_t at;
    int shift;
};
static Place place_q4_1(int64_t j, int64_t i) {
    return {(int64_t)offsetof(PackedQ4_1, q) + i * (PANEL / 2) + j % (PANEL / 2), j < PANEL / 2 ? 0 : 4};
}
static Place place_q8_0(int64_t j, int64_t i) { return {(int64_t)offsetof(PackedQ8_0, q) + i * PANEL + j, 0}; }
static Place place_q4_1_i8(int64_t j, int64_t i) {  // half j / 16, group i / 4 (groups 4..7 in the high nibbles)
    return {(int64_t)offsetof(PackedQ4_1, q) + (j / 16) * 256 + (i / 4 % 4) * 64 + 4 * (j % 16) + i % 4, i / 4 < 4 ? 0 : 4};
}
static Place place_q8_0_i8(int64_t j, int64_t i) {
    return {(int64_t)offsetof(PackedQ8_0, q) + (j / 16) * 512 + (i / 4) * 64 + 4 * (j % 16) + i % 4, 0};
}

// GGUF blocks of a weight W [n, k] (GGUF's own order: column j of y, its k in blocks of 32) into panels:
// d, m [n, k/32] float16 bits, q [n, k/32, 32] the blocks' values (q4_1: 0..15; q8_0: int8), k a multiple of 32.
template <Place (*PLACE)(int64_t, int64_t), bool MIN>
static int pack_blocks(const uint16_t* d, const uint16_t* m, const uint8_t* q, int64_t k, int64_t n, uint8_t* out,
                       int64_t bytes) {
    if (k < QK || k % QK || n < 1 || !d || (MIN && !m) || !q || !out) return 1;
    const int64_t kb = k / QK, panels = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t b = 0; b < kb; b++) {
            uint8_t* blk = out + (p * kb + b) * bytes;
            for (int64_t j = 0; j < PANEL && p * PANEL + j < n; j++) {
                const int64_t col = p * PANEL + j;
                memcpy(blk + 2 * j, d + col * kb + b, 2);
                if (MIN) memcpy(blk + 2 * PANEL + 2 * j, m + col * kb + b, 2);
                for (int64_t i = 0; i < QK; i++) {
                    const uint8_t v = q[(col * kb + b) * QK + i];
                    if (MIN && v > 15) return 1;
                    const Place at = PLACE(j, i);
                    blk[at.at] |= (uint8_t)(v << at.shift);
                }
            }
        }
    return 0;
}

// llama.cpp's Q8_0 quantisation (quantize_row_q8_0_ref) of one block of QK weights `stride` floats apart: d = max|w| /
// 127, q = roundf(w · (1/d)) (to nearest, halves away from zero; all 0 where d is 0), d kept as float16 (to nearest
// even). Exact steps only (max, a correctly rounded quotient and product, roundf), so every variant gives these bytes.
static uint16_t quantise_q8_0(const float* w, int64_t stride, uint8_t* q) {
    float amax = 0.0f;
    for (int64_t i = 0; i < QK; i++) amax = fabsf(w[i * stride]) > amax ? fabsf(w[i * stride]) : amax;
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < QK; i++) q[i] = (uint8_t)(int8_t)roundf(w[i * stride] * id);
    return f32_to_f16(d);
}

// Float weights W [k, n] (row stride ws; finite, checked by the caller) quantised per column and block of QK k
// (quantise_q8_0) into GGUF's order, then packed as a GGUF's q8_0 blocks for int8 activations (Q8_0_I8's layout).
static int pack_quantised_q8_0(const float* w, int64_t k, int64_t n, int64_t ws, uint8_t* out) {
    if (k < QK || k % QK || n < 1 || ws < n || !w || !out) return 1;
    const int64_t kb = k / QK;
    std::vector<uint16_t> d(n * kb);
    std::vector<uint8_t> q(n * k);
    for (int64_t col = 0; col < n; col++)
        for (int64_t b = 0; b < kb; b++) d[col * kb + b] = quantise_q8_0(w + b * QK * ws + col, ws, &q[(col * kb + b) * QK]);
    return pack_blocks<place_q8_0_i8, false>(d.data(), nullptr, q.data(), k, n, out, sizeof(PackedQ8_0));
}
