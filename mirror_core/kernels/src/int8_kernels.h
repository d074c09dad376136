// int8 activations against GGUF blocks (llama.cpp's kind of function): a call first rounds each row of x alone to
// int8 per block of QK k (quantise_rows): dx = max|x| / 127, qx = round_even(x · (1/dx)), and per block a record of
// qx[32], dx, sx = dx·Σqx and Σqx. Per block and column the integer sum Σ q·qx is exact (vpdpbusd with VNNI, else
// maddubs/madd, else C), then, in this order, acc = fma(d·dx, sum, acc) and for q4_1 acc = fma(m, sx, acc).
// One function for every row count, row position, thread count and variant: the integer sums are exact, and the
// float steps are the same lane by lane. The weights are packed for 4-k dot products (formats.h's _I8 layouts).
#pragma once

constexpr int64_t XREC = QK + 12;  // one row block's record: qx[32], dx, sx, Σqx

static inline float rec_f32(const uint8_t* p) { float v; memcpy(&v, p, 4); return v; }
static inline int32_t rec_i32(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }

// x [m, k] (row stride xs) → records [m, k/QK, XREC]. Exact steps only (max, a correctly rounded product, round to
// nearest even), in plain C on every variant, so every variant gives the same bytes.
static void quantise_rows(const float* x, int64_t m, int64_t k, int64_t xs, uint8_t* out) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k / QK; b++) {
            const float* v = x + r * xs + b * QK;
            uint8_t* rec = out + (r * (k / QK) + b) * XREC;
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            const float dx = amax / 127.0f, id = dx != 0.0f ? 1.0f / dx : 0.0f;
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) {
                float t = nearbyintf(v[i] * id);  // the default rounding mode: to nearest even
                int32_t q = t > 127.0f ? 127 : t < -127.0f ? -127 : (int32_t)t;
                rec[i] = (uint8_t)(int8_t)q;
                sum += q;
            }
            float sx = dx * (float)sum;
            memcpy(rec + QK, &dx, 4);
            memcpy(rec + QK + 4, &sx, 4);
            memcpy(rec + QK + 8, &sum, 4);
        }
}

// The float steps of one block for one row and 16 columns (shared with amx.h, lane for lane).
template <bool MIN>
static inline vf i8_epilogue(vf acc, vf dw, vf mw, const uint8_t* rec, vi sum) {
    acc = vfma(vmul(dw, vbcast(rec_f32(rec + QK))), vcvt(sum), acc);
    return MIN ? vfma(mw, vbcast(rec_f32(rec + QK + 4)), acc) : acc;
}

// R row records against one panel of _I8-packed q4_1 (MIN) or q8_0 blocks. Per block, the weights of both halves
// are unpacked once (wv), then each row broadcasts each of its 8 groups of 4 activations once for both halves: per
// row and block 8 broadcasts and 16 dot products, whatever R is.
template <int R, bool MIN>
static void block_i8(const uint8_t* x, int64_t xs, const uint8_t* w, int64_t kb, float* y, int64_t ys, int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? sizeof(PackedQ4_1) : sizeof(PackedQ8_0), HALF = MIN ? 4 * 64 : 8 * 64;
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        for (int64_t i = 0; i < BYTES; i += 64) prefetch(blk + PREFETCH + i);
        const uint8_t* q = blk + (MIN ? 2 : 1) * PANEL * 2;
        vi wv[NV][8];  // each half's 8 groups of 4 k, one 32-bit lane a column
        vf dw[NV], mw[NV];
        vi wsum[NV];
        for (int h = 0; h < NV; h++) {  // columns 16h .. 16h + 15
            dw[h] = vload_f16((const uint16_t*)blk + h * VL);
            mw[h] = MIN ? vload_f16((const uint16_t*)blk + PANEL + h * VL) : vzero();
            wsum[h] = izero();
            for (int g = 0; g < 8; g++) {
                if (MIN) {  // q4_1: groups g and g + 4 share a byte (low and high nibble)
                    vi t = iload(q + h * HALF + (g % 4) * 64);
                    wv[h][g] = iand(g < 4 ? t : isrl4(t), iset(0x0F0F0F0F));
                } else {
                    wsum[h] = s8_wsum(wsum[h], wv[h][g] = iload(q + h * HALF + g * 64));
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const uint8_t* rec = x + r * xs + b * XREC;
            vi sum[NV];
            for (int h = 0; h < NV; h++) sum[h] = izero();
            for (int g = 0; g < 8; g++) {
                const vi x4 = iset(rec_i32(rec + 4 * g));
                for (int h = 0; h < NV; h++)
                    sum[h] = MIN ? dot_u4s8(sum[h], wv[h][g], x4) : dot_s8s8(sum[h], wv[h][g], x4);
            }
            for (int h = 0; h < NV; h++)
                acc[r][h] = i8_epilogue<MIN>(acc[r][h], dw[h], mw[h], rec, MIN ? sum[h] : s8_fix(sum[h], wsum[h]));
        }
    }
    store_block(y, ys, R, acc, col0, n);
}
