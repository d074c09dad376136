// AMX tiles for the int8 format's long calls (prefills). One tile dot product gives every row's integer block sum
// for 16 columns at once (tdpbsud: int8 activations × q4_1's 0..15; tdpbssd: × q8_0's int8), where VNNI spends 8
// instructions a row. The sums are the same exact integers, and the float steps after them are int8_kernels.h's
// i8_epilogue, lane for lane, so a row's output is the same bits whichever path ran it: calls of at least amx_rows
// rows take this one (msd_set_amx_rows; 0 = never). Each block ends in a store of its sums and a float epilogue per
// row, so the tiles only pay on long calls.
#pragma once

#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
constexpr int64_t TILE_ROWS = 16;
static bool amx_ready = false;  // the OS let this process use tile data (msd_amx_init)
static int64_t amx_rows = 16;   // prefills; scripts/target_rows.py --amx-rows times the tiles against VNNI

struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// tiles 0, 1 and 5, 6: sums [r, 16 int32] of the two halves (even and odd blocks); 2: activations [r, 32 int8];
// 3, 4: weights [8, 64] per half. Loaded on every call, never cached: another library on the same thread (torch's
// oneDNN after its own AMX kernels) may release the tiles (TILERELEASE), and a tile load after that is an illegal
// instruction.
static void configure_tiles(int64_t r) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = (uint8_t)r, c.colsb[t] = 64;
    c.rows[2] = (uint8_t)r, c.colsb[2] = QK;
    for (int t = 3; t < 5; t++) c.rows[t] = 8, c.colsb[t] = 64;
    for (int t = 5; t < 7; t++) c.rows[t] = (uint8_t)r, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

// One block's epilogue from its stored sums.
template <bool MIN>
static inline void amx_epilogue(const uint8_t* x, int64_t xs, int64_t rows, const uint8_t* blk, int64_t b,
                                const int32_t (*sums)[TILE_ROWS][16], float (*acc)[PANEL]) {
    for (int c = 0; c < NV; c++) {
        vf dw = vload_f16((const uint16_t*)blk + VL * c);
        vf mw = MIN ? vload_f16((const uint16_t*)blk + PANEL + VL * c) : vzero();
        for (int64_t r = 0; r < rows; r++) {
            vf a = i8_epilogue<MIN>(vload(&acc[r][VL * c]), dw, mw, x + r * xs + b * XREC, iload((const uint8_t*)sums[c][r]));
            vstore(&acc[r][VL * c], a);
        }
    }
}

// Block b's weights into tiles 3 and 4 (q4_1 unpacked to one value a byte through `tmp`).
template <bool MIN>
static inline void amx_weights(const uint8_t* q, uint8_t (*tmp)[8 * 64]) {
    constexpr int64_t HALF = MIN ? 4 * 64 : 8 * 64;
    if (MIN) {
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) {
                __m512i t = _mm512_load_si512((const void*)(q + h * HALF + g * 64));
                _mm512_store_si512((void*)(tmp[h] + g * 64), _mm512_and_si512(t, _mm512_set1_epi8(15)));
                _mm512_store_si512((void*)(tmp[h] + (g + 4) * 64),
                                   _mm512_and_si512(_mm512_srli_epi16(t, 4), _mm512_set1_epi8(15)));
            }
        _tile_loadd(3, tmp[0], 64);
        _tile_loadd(4, tmp[1], 64);
    } else {
        _tile_loadd(3, q, 64);
        _tile_loadd(4, q + HALF, 64);
    }
}

// One panel over all blocks. Blocks alternate between two pairs of sum tiles (0, 1 and 5, 6), so one block's tile
// products run while the previous block's sums are stored and scaled.
template <bool MIN>
static void panel_amx(const uint8_t* x, int64_t xs, int64_t rows, const uint8_t* w, int64_t kb, float* y, int64_t ys,
                      int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? sizeof(PackedQ4_1) : sizeof(PackedQ8_0), QOFF = (MIN ? 2 : 1) * PANEL * 2;
    alignas(64) float acc[TILE_ROWS][PANEL];
    alignas(64) int32_t sums[2][TILE_ROWS][16];
    alignas(64) uint8_t tmp[2][2][8 * 64];
    for (int64_t r = 0; r < rows; r++) for (int c = 0; c < NV; c++) vstore(&acc[r][VL * c], vzero());
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        for (int64_t i = 0; i < BYTES; i += 64) prefetch(blk + PREFETCH + i);
        _tile_loadd(2, x + b * XREC, xs);
        amx_weights<MIN>(blk + QOFF, tmp[b & 1]);
        if (b & 1) {
            _tile_zero(5);
            _tile_zero(6);
            if (MIN) { _tile_dpbsud(5, 2, 3); _tile_dpbsud(6, 2, 4); } else { _tile_dpbssd(5, 2, 3); _tile_dpbssd(6, 2, 4); }
            _tile_stored(0, sums[0], 64);  // the previous (even) block's sums
            _tile_stored(1, sums[1], 64);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            if (MIN) { _tile_dpbsud(0, 2, 3); _tile_dpbsud(1, 2, 4); } else { _tile_dpbssd(0, 2, 3); _tile_dpbssd(1, 2, 4); }
            if (b) {
                _tile_stored(5, sums[0], 64);  // the previous (odd) block's sums
                _tile_stored(6, sums[1], 64);
            }
        }
        if (b) amx_epilogue<MIN>(x, xs, rows, blk - BYTES, b - 1, sums, acc);
    }
    if (kb & 1) {
        _tile_stored(0, sums[0], 64);
        _tile_stored(1, sums[1], 64);
    } else {
        _tile_stored(5, sums[0], 64);
        _tile_stored(6, sums[1], 64);
    }
    amx_epilogue<MIN>(x, xs, rows, w + (kb - 1) * BYTES, kb - 1, sums, acc);
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < NV; c++) {
            int64_t col = col0 + VL * c;
            if (col < n) vstore_cols(y + r * ys + col, vload(&acc[r][VL * c]), n - col);
        }
}

// The whole call on tiles: panels split between the pool's threads, rows 16 at a time.
static bool linear_amx(bool q4_1, const uint8_t* x, int64_t m, int64_t xs, const uint8_t* w, int64_t kb,
                       int64_t panel_bytes, float* y, int64_t ys, int64_t n) {
    if (!amx_ready || amx_rows < 1 || m < amx_rows) return false;
    int64_t panels = (n + PANEL - 1) / PANEL;
    parallel_for(panels, [&](int64_t first, int64_t last, int) {
        for (int64_t r0 = 0; r0 < m; r0 += TILE_ROWS) {
            int64_t rows = m - r0 < TILE_ROWS ? m - r0 : TILE_ROWS;
            configure_tiles(rows);
            for (int64_t p = first; p < last; p++) {
                const uint8_t* wp = w + p * panel_bytes;
                if (q4_1) panel_amx<true>(x + r0 * xs, xs, rows, wp, kb, y + r0 * ys, ys, p * PANEL, n);
                else panel_amx<false>(x + r0 * xs, xs, rows, wp, kb, y + r0 * ys, ys, p * PANEL, n);
            }
        }
    });
    return true;
}
#else
static bool linear_amx(bool, const uint8_t*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t,
                       int64_t) {
    return false;
}
#endif
