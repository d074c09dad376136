// GGUF's blocks streamed as they are and dequantised in registers to float32 with gguf's arithmetic:
//   q4_1 w = fp32(d)·q + fp32(m) (q in 0..15), q8_0 w = fp32(d)·q (q in −128..127).
// fp32(d)·q is exact in float32 (11 by 8 significant bits), so w = fma(d, q, m) rounds once, as gguf's d * q + m
// does: w is bit for bit the float32 weight gguf's dequantisation gives, and the chain is then float_kernels.h's,
// term for term. A model stored in these blocks computes exactly what its dequantised float32 copy computes.
#pragma once

constexpr int64_t PREFETCH = 4096;  // bytes ahead of the block being read

static inline void q4_1_row(const uint8_t* q, const vf d[NV], const vf m[NV], vf w[NV]) {
    vi v = iload_u8(q);                                             // 16 bytes → 16 lanes
    w[0] = vfma(d[0], vcvt(iand(v, iset(15))), m[0]);               // columns 0..15
    w[1] = vfma(d[1], vcvt(isrl4(v)), m[1]);                        // columns 16..31
}
static inline void q8_0_row(const uint8_t* q, const vf d[NV], vf w[NV]) {
    w[0] = vmul(d[0], vcvt(iload_s8(q)));
    w[1] = vmul(d[1], vcvt(iload_s8(q + VL)));
}

// R rows against one panel of q4_1 (MIN) or q8_0 blocks; kb blocks of QK k each. The dequantised weight of each k is
// made once and used by every row, so R rows cost one dequantisation and R FMAs per weight vector.
template <int R, bool MIN>
static void block_gguf(const float* x, int64_t xs, const uint8_t* w, int64_t kb, float* y, int64_t ys, int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? sizeof(PackedQ4_1) : sizeof(PackedQ8_0), ROW = MIN ? PANEL / 2 : PANEL;
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        vf d[NV], m[NV];
        for (int v = 0; v < NV; v++) {
            d[v] = vload_f16((const uint16_t*)blk + v * VL);
            m[v] = MIN ? vload_f16((const uint16_t*)blk + PANEL + v * VL) : vzero();
        }
        const uint8_t* q = blk + (MIN ? 2 : 1) * PANEL * 2;
        for (int64_t i = 0; i < QK; i++) {
            if (i * 64 < BYTES) prefetch(blk + PREFETCH + i * 64);
            vf wv[NV];
            if (MIN) q4_1_row(q + i * ROW, d, m, wv); else q8_0_row(q + i * ROW, d, wv);
            const float* xk = x + b * QK + i;
            for (int r = 0; r < R; r++) {
                vf bx = vbcast(xk[r * xs]);
                for (int v = 0; v < NV; v++) acc[r][v] = vfma(bx, wv[v], acc[r][v]);
            }
        }
    }
    store_block(y, ys, R, acc, col0, n);
}
