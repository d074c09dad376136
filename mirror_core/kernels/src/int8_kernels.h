// int8 activations against GGUF blocks (llama.cpp's kind of function): a call first rounds each row of x alone to
// int8 per block of QK k (quantise_row): dx = max|x| / 127, qx = round_even(x · (1/dx)), and per block a record of
// qx[32], dx, sx = dx·Σqx, Σqx and −128·Σqx. Per block and column the integer sum Σ q·qx is exact (vpdpbusd with
// VNNI, else maddubs/madd, else C), then, in this order, acc = fma(d·dx, sum, acc) and for q4_1 acc = fma(m, sx, acc).
// One function for every row count, row position, thread count and variant: the integer sums are exact, and the
// float steps are the same lane by lane. The weights are packed for 4-k dot products (formats.h's _I8 layouts).
#pragma once

constexpr int64_t XREC = QK + 16;  // one row block's record: qx[32], dx, sx, Σqx, −128·Σqx
constexpr int64_t I8_ROWS = 32;    // rows a panel pass carries (their accumulators stay in L1)

static inline float rec_f32(const uint8_t* p) { float v; memcpy(&v, p, 4); return v; }
static inline int32_t rec_i32(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }

// One row x [k] → its records [k/QK, XREC]. Exact steps only (max, a correctly rounded product, round to nearest
// even, a clamp), lane by lane in simd.h's layer, so every variant gives the same bytes. A NaN never wins the max
// (vmax keeps its second operand) and rounds to −127.
static void quantise_row(const float* x, int64_t k, uint8_t* out) {
    for (int64_t b = 0; b < k / QK; b++) {
        const float* v = x + b * QK;
        uint8_t* rec = out + b * XREC;
        const vf v0 = vloadu(v), v1 = vloadu(v + VL);
        const float amax = hmax(vmax(vabs(v0), vmax(vabs(v1), vzero())));
        const float dx = amax / 127.0f, id = dx != 0.0f ? 1.0f / dx : 0.0f;
        const vi q0 = vtoi(vmin(vbcast(127.0f), vmax(vround(vmul(v0, vbcast(id))), vbcast(-127.0f))));
        const vi q1 = vtoi(vmin(vbcast(127.0f), vmax(vround(vmul(v1, vbcast(id))), vbcast(-127.0f))));
        istore_i8(rec, q0);
        istore_i8(rec + VL, q1);
        const int32_t sum = ihsum(iadd(q0, q1)), base = -128 * sum;
        const float sx = dx * (float)sum;
        memcpy(rec + QK, &dx, 4);
        memcpy(rec + QK + 4, &sx, 4);
        memcpy(rec + QK + 8, &sum, 4);
        memcpy(rec + QK + 12, &base, 4);
    }
}

// The float steps of one block for one row and 16 columns (shared with amx.h, lane for lane).
template <bool MIN>
static inline vf i8_epilogue(vf acc, vf dw, vf mw, const uint8_t* rec, vi sum) {
    acc = vfma(vmul(dw, vbcast(rec_f32(rec + QK))), vcvt(sum), acc);
    return MIN ? vfma(mw, vbcast(rec_f32(rec + QK + 4)), acc) : acc;
}

// Half h (16 columns) of one _I8-packed q4_1 (MIN) or q8_0 block: its 8 groups of 4 k, one 32-bit lane a column,
// ready for simd.h's dot32_u4 (q4_1: 0..15) or dot32_s8 (q8_0: through s8_weights).
template <bool MIN>
static inline void i8_half(const uint8_t* q, int h, vi wv[8]) {
    if (MIN) {  // groups g and g + 4 share a byte (low and high nibble)
        for (int g = 0; g < 4; g++) {
            const vi t = iload(q + h * 4 * 64 + g * 64);
            wv[g] = iand(t, iset(0x0F0F0F0F));
            wv[g + 4] = iand(isrl4(t), iset(0x0F0F0F0F));
        }
    } else {
        for (int g = 0; g < 8; g++) wv[g] = s8_weights(iload(q + h * 8 * 64 + g * 64));
    }
}

// `rows` (≤ I8_ROWS) row records against one panel of _I8-packed blocks. Block by block, each half's weights are
// unpacked once into registers and every row's sums and float steps run against them, the rows' accumulators in L1:
// the weights stream once for all the rows, and a row costs 16 dot products a block, whatever `rows` is.
template <bool MIN>
static void panel_i8(const uint8_t* x, int64_t xs, int64_t rows, const uint8_t* w, int64_t kb, float* y, int64_t ys,
                     int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? sizeof(PackedQ4_1) : sizeof(PackedQ8_0);
    alignas(64) float acc[I8_ROWS][PANEL];
    for (int64_t r = 0; r < rows; r++) for (int h = 0; h < NV; h++) vstore(&acc[r][h * VL], vzero());
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        for (int64_t i = 0; i < BYTES; i += 64) prefetch(blk + PREFETCH + i);
        const uint8_t* q = blk + (MIN ? 2 : 1) * PANEL * 2;
        for (int h = 0; h < NV; h++) {  // columns 16h .. 16h + 15
            const vf dw = vload_f16((const uint16_t*)blk + h * VL);
            const vf mw = MIN ? vload_f16((const uint16_t*)blk + PANEL + h * VL) : vzero();
            vi wv[8];
            i8_half<MIN>(q, h, wv);
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t* rec = x + r * xs + b * XREC;
                const vi sum = MIN ? dot32_u4(wv, rec) : dot32_s8(wv, rec, rec_i32(rec + QK + 12));
                vstore(&acc[r][h * VL], i8_epilogue<MIN>(vload(&acc[r][h * VL]), dw, mw, rec, sum));
            }
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < NV; h++) {
            const int64_t col = col0 + h * VL;
            if (col < n) vstore_cols(y + r * ys + col, vload(&acc[r][h * VL]), n - col);
        }
}

// Every panel once, split between the pool's threads; within a panel the rows in passes of at most I8_ROWS (as even
// as can be: 17 rows are one pass, 40 are two of 20).
template <bool MIN>
static void run_panels_i8(const uint8_t* x, int64_t m, int64_t xs, const uint8_t* w, int64_t kb, int64_t panel_bytes,
                          float* y, int64_t ys, int64_t n) {
    const int64_t panels = (n + PANEL - 1) / PANEL, passes = (m + I8_ROWS - 1) / I8_ROWS, per = (m + passes - 1) / passes;
    parallel_for(panels, [&](int64_t first, int64_t last, int) {
        for (int64_t p = first; p < last; p++)
            for (int64_t r0 = 0; r0 < m; r0 += per)
                panel_i8<MIN>(x + r0 * xs, xs, m - r0 < per ? m - r0 : per, w + p * panel_bytes, kb, y + r0 * ys, ys,
                              p * PANEL, n);
    });
}
