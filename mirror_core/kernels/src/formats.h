// The weight formats the kernel packs, one enum and one traits table (exported by msd_format_table and checked at
// load against mirror_core/kernels/formats.py's table, which names each format's function and entry points).
//
// Packed layout (every format): W [K, N] in column panels of PANEL (32) columns, panel after panel; within a panel
// either one element per (k, column) (f32, f16) or per (k pair, column) (bf16), or, for GGUF's blocks, one packed
// block per QK (32) consecutive k: the panel's 32 scales d (and q4_1's minima m) as float16, then the values.
#pragma once
#include <stdint.h>

constexpr int64_t PANEL = 32;  // columns per packed panel: 2 vf
constexpr int64_t QK = 32;     // k per GGUF block (QK4_1 and QK8_0)
constexpr int NV = PANEL / VL;  // vf per panel row

enum Format : int32_t {
    F32 = 0,       // float32 weights, float32 activations
    F16 = 1,       // float16 weights (widened exactly), float32 activations
    BF16 = 2,      // bfloat16 weights and activations (x rounded to nearest even), widened exactly, two FMAs per pair
    Q4_1 = 3,      // GGUF q4_1 blocks dequantised in registers to gguf's exact float32 weights: f32's function
    Q8_0 = 4,      // GGUF q8_0 blocks, likewise
    Q4_1_I8 = 5,   // q4_1 blocks against activations rounded to int8 per row and block (int8_kernels.h)
    Q8_0_I8 = 6,   // q8_0 blocks, likewise
    Q8_0_QUANT = 7,  // Q8_0_I8's blocks quantised at packing from float weights (pack.h's quantise_q8_0)
    FORMAT_COUNT = 8
};

// One packed GGUF block of a panel (32 columns x 32 k). The _I8 layouts hold the same bytes in another order:
// for each half of 16 columns the k in groups of 4, one 32-bit lane a column (byte 4j + t = column j's k = 4g + t);
// q4_1 keeps groups g and g + 4 in the low and high nibbles.
struct PackedQ4_1 {
    uint16_t d[PANEL], m[PANEL];   // float16 bits: scale and minimum of each column's block
    uint8_t q[QK][PANEL / 2];      // row i (k), byte j: column j in the low nibble, column j + 16 in the high one
};
struct PackedQ8_0 {
    uint16_t d[PANEL];
    int8_t q[QK][PANEL];           // row i (k), byte j: column j
};
static_assert(sizeof(PackedQ4_1) == 640, "a packed q4_1 block is 640 bytes");
static_assert(sizeof(PackedQ8_0) == 1088, "a packed q8_0 block is 1088 bytes");
static_assert(sizeof(PackedQ4_1) % 64 == 0 && sizeof(PackedQ8_0) % 64 == 0, "blocks keep 64-byte alignment");

// What a format stores and reads. element_bytes: bytes per packed element of a panel row (per-element formats; a
// bf16 element holds a pair of k), block_bytes: bytes per packed block (block formats).
struct msd_format_info {
    int32_t code;
    int32_t element_bytes;
    int32_t k_per_element;  // 1, or 2 (bf16 pairs)
    int32_t block_bytes;
    int32_t int8_activations;
    char name[12];          // its entry points: msd_pack_<name>, msd_linear_<name>
};

static const msd_format_info FORMAT_TABLE[FORMAT_COUNT] = {
    {F32, 4, 1, 0, 0, "f32"},
    {F16, 2, 1, 0, 0, "f16"},
    {BF16, 4, 2, 0, 0, "bf16"},
    {Q4_1, 0, 0, (int32_t)sizeof(PackedQ4_1), 0, "q4_1"},
    {Q8_0, 0, 0, (int32_t)sizeof(PackedQ8_0), 0, "q8_0"},
    {Q4_1_I8, 0, 0, (int32_t)sizeof(PackedQ4_1), 1, "q4_1_i8"},
    {Q8_0_I8, 0, 0, (int32_t)sizeof(PackedQ8_0), 1, "q8_0_i8"},
    {Q8_0_QUANT, 0, 0, (int32_t)sizeof(PackedQ8_0), 1, "q8_0_quant"},
};
