// Exact small-row linear maps: y[M, N] = x[M, K] @ W[K, N] where row r of an M-row call is bit for bit the
// same as that row's own 1-row call, for every M and every place of the row in the call, by construction.
//
// Weight-stationary: W is packed once into column panels of PANEL (32) columns, panel p holding
// W[k][32p .. 32p+31] for k = 0..K-1 one after another (bfloat16: k in pairs, see pack_bf16). For each panel the
// kernel streams the panel once and, for each k, every row does one fused multiply-add into its own accumulators:
//     acc[r][j] = fma(x[r][k], W[k][j], acc[r][j])      k = 0, 1, ..., K-1 in that order, acc starting at 0.
// Each output is that one sequential chain whatever M is: rows never share an accumulator, K is never split, and
// the rows of a call are only grouped (GROUP at a time, to keep the accumulators in registers), which changes
// nothing in any row's chain. Columns past N are zero in the pack and never stored.
//
// Formats (the weights' bytes; accumulation is always float32):
//   f32   float32 weights, float32 x: one FMA per (row, k, column).
//   q4_1, q8_0   GGUF's own blocks (32 consecutive k of one column share a float16 scale d, and for q4_1 a float16
//         minimum m), streamed as they are and dequantised in registers to float32 with gguf's arithmetic:
//         q4_1 w = fp32(d)·q + fp32(m) (q in 0..15), q8_0 w = fp32(d)·q (q in −128..127). fp32(d)·q is exact in
//         float32 (11 by 8 significant bits), so w = fma(d, q, m) rounds once, as gguf's `d * q + m` does: w is bit
//         for bit the float32 weight gguf's dequantisation gives, and the chain below is then f32's, term for term.
//         A model stored in these blocks computes exactly what its dequantised float32 copy computes under f32.
//   i8    the same q4_1 / q8_0 blocks against activations rounded to int8, each row alone, per block of 32 k
//         (llama.cpp's kind of function): dx = max|x| / 127, qx = round_even(x · (1/dx)); per block and column the
//         integer sum Σ q·qx is exact (dpbusd with AVX512-VNNI, else maddubs + madd), then, in this order,
//         acc = fma(d·dx, sum, acc) and for q4_1 acc = fma(m, dx·Σqx, acc). One function for every row count, row
//         position, thread count and variant (the integer sums are exact and the float steps the same).
//   f16   float16 weights widened exactly to float32 (F16C), float32 x: the same chain as f32.
//   bf16  bfloat16 weights, x rounded to bfloat16 (round to nearest even, as torch's .to(torch.bfloat16)):
//         with AVX512-BF16 one dot-product instruction per pair of k (vdpbf16ps: acc += x[2i]·w[2i] + x[2i+1]·w[2i+1]),
//         else both widened exactly to float32 and two FMAs (k even, then k odd). The two variants round differently
//         from each other; each is the same function for every M.
// Threads: a calling thread may own a pool (msd_set_threads); a call then splits its panels (and a layer its
// attention heads) between the pool's threads in contiguous ranges. Each output is still one thread's one chain, so
// the result is the same bits for any thread count. Idle workers spin briefly, then sleep on a futex.
// Built once per machine by mirror_core/kernels/native.py with one of: -DMSD_AVX512 (with or without
// -mavx512bf16) or -DMSD_AVX2; the Python side checks dtype, shape, strides and alignment before every call.
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <vector>
#include <atomic>
#include <chrono>
#include <thread>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int64_t PANEL = 32;  // columns per packed panel (2 AVX-512 or 4 AVX2 vectors)

// The vector operations both variants spell alike (P: _mm512 or _mm256, B: its width in bits); FMA and fnmadd
// round once. vbf16_even/odd read 16 (8) bf16 pairs, k even in the low half of each 32-bit lane, and give the even
// and the odd weights as float32, exactly; vpow2 is 2^n for integral n in [−126, 127], exactly.
#define MSD_VECTOR_OPS(P, B)                                                                     \
    static inline vf vzero() { return P##_setzero_ps(); }                                        \
    static inline vf vbcast(float a) { return P##_set1_ps(a); }                                  \
    static inline vf vload(const float* p) { return P##_load_ps(p); }                            \
    static inline vf vloadu(const float* p) { return P##_loadu_ps(p); }                          \
    static inline vf vfma(vf a, vf b, vf c) { return P##_fmadd_ps(a, b, c); }                    \
    static inline vf vfnma(vf a, vf b, vf c) { return P##_fnmadd_ps(a, b, c); } /* c − a·b */   \
    static inline vf vadd(vf a, vf b) { return P##_add_ps(a, b); }                               \
    static inline vf vsub(vf a, vf b) { return P##_sub_ps(a, b); }                               \
    static inline vf vmul(vf a, vf b) { return P##_mul_ps(a, b); }                               \
    static inline vf vmax(vf a, vf b) { return P##_max_ps(a, b); }                               \
    static inline vf vmin(vf a, vf b) { return P##_min_ps(a, b); }                               \
    static inline vf vdiv(vf a, vf b) { return P##_div_ps(a, b); }                               \
    static inline vf vbf16_even(const uint32_t* p) {                                             \
        return P##_castsi##B##_ps(P##_slli_epi32(P##_load_si##B((const __m##B##i*)p), 16));      \
    }                                                                                            \
    static inline vf vbf16_odd(const uint32_t* p) {                                              \
        return P##_castsi##B##_ps(P##_and_si##B(P##_load_si##B((const __m##B##i*)p),             \
                                                P##_set1_epi32((int)0xFFFF0000u)));              \
    }                                                                                            \
    static inline vf vpow2(vf n) {                                                               \
        return P##_castsi##B##_ps(P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23)); \
    }

#if defined(MSD_AVX512)
constexpr int GROUP = 8;       // rows per register block: 8 rows x 2 zmm accumulators
constexpr int VEC = 16;
typedef __m512 vf;
MSD_VECTOR_OPS(_mm512, 512)
static inline vf vload_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)p)); }
static inline void vstore_cols(float* y, vf v, int64_t cols) {  // cols in 1..16 (of this vector) to store
    if (cols >= VEC) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << cols) - 1u), v);
}
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#elif defined(MSD_AVX2)
constexpr int GROUP = 3;       // rows per register block: 3 rows x 4 ymm accumulators
constexpr int VEC = 8;
typedef __m256 vf;
MSD_VECTOR_OPS(_mm256, 256)
static inline vf vload_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_load_si128((const __m128i*)p)); }
static inline void vstore_cols(float* y, vf v, int64_t cols) {
    if (cols >= VEC) { _mm256_storeu_ps(y, v); return; }
    alignas(32) int32_t m[VEC];
    for (int i = 0; i < VEC; i++) m[i] = i < cols ? -1 : 0;
    _mm256_maskstore_ps(y, _mm256_load_si256((const __m256i*)m), v);
}
static inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#else
#error "build with -DMSD_AVX512 or -DMSD_AVX2"
#endif

constexpr int NV = PANEL / VEC;  // vectors per panel row
template <typename X, typename W>
using Block = void (*)(const X*, int64_t, const W*, int64_t, float*, int64_t, int64_t, int64_t);

// e^x lane by lane (softmax's shifted scores, SiLU's sigmoid): 2^n · p(r) with n = round(x·log2 e), r = x − n·ln 2
// in two parts, p Cephes' degree-6 polynomial (relative error ~2e-7); x is clamped to [−87, 88], and a NaN stays NaN
// (max/min return their second operand when one is NaN), so a NaN or infinite score poisons its row as torch's
// softmax does. The same bits for a value wherever it sits, so a row's result never depends on its neighbours.
static inline vf vexp(vf x) {
    x = vmin(vbcast(88.0f), vmax(vbcast(-87.0f), x));
    vf n = vround(vmul(x, vbcast(1.44269504088896341f)));
    vf r = vfnma(n, vbcast(-2.12194440e-4f), vfnma(n, vbcast(0.693359375f), x));
    vf p = vbcast(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        p = vfma(p, r, vbcast(c));
    p = vfma(p, vmul(r, r), vadd(r, vbcast(1.0f)));
    return vmul(p, vpow2(n));
}

static inline void store_block(float* y, int64_t y_stride, int rows, vf acc[][NV], int64_t col0, int64_t n) {
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV; v++) {
            int64_t c = col0 + v * VEC;
            if (c < n) vstore_cols(y + r * y_stride + c, acc[r][v], n - c);
        }
}

// One register block: R rows of x against one panel of float32 or float16 weights (widened exactly on load).
static inline vf wload(const float* p) { return vload(p); }
static inline vf wload(const uint16_t* p) { return vload_f16(p); }

template <int R, typename W>
static void block_fma(const float* x, int64_t xs, const W* w, int64_t k, float* y, int64_t ys, int64_t col0, int64_t n) {
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t i = 0; i < k; i++) {
        const W* wk = w + i * PANEL;
        vf wv[NV];
        for (int v = 0; v < NV; v++) wv[v] = wload(wk + v * VEC);
        for (int r = 0; r < R; r++) {
            vf b = vbcast(x[r * xs + i]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(b, wv[v], acc[r][v]);
        }
    }
    store_block(y, ys, R, acc, col0, n);
}

// bf16: x is given as bfloat16 pairs (xp[r][i] = x[r][2i] | x[r][2i+1] << 16), the panel as k-pairs.
#if defined(MSD_AVX512) && defined(__AVX512BF16__)
template <int R>
static void block_bf16(const uint32_t* xp, int64_t xs, const uint32_t* w, int64_t k2, float* y, int64_t ys, int64_t col0, int64_t n) {
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t i = 0; i < k2; i++) {
        const uint32_t* wk = w + i * PANEL;
        __m512bh wv[NV];
        for (int v = 0; v < NV; v++) wv[v] = (__m512bh)_mm512_load_si512(wk + v * VEC);
        for (int r = 0; r < R; r++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)xp[r * xs + i]);
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], b, wv[v]);
        }
    }
    store_block(y, ys, R, acc, col0, n);
}
#else
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
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(be, vbf16_even(wk + v * VEC), acc[r][v]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(bo, vbf16_odd(wk + v * VEC), acc[r][v]);
        }
    }
    store_block(y, ys, R, acc, col0, n);
}
#endif

// GGUF blocks: per panel and block of 32 k, the panel's 32 scales (and minima) as float16, then the 32 k's values,
// one row of 32 columns each. q4_1: byte j of a row holds column j in its low nibble and column j + 16 in its high.
constexpr int64_t QK = 32;                                   // k per block (GGUF's QK4_1 and QK8_0)
constexpr int64_t Q4_1_BYTES = 2 * PANEL * 2 + QK * PANEL / 2;  // 640: d[32], m[32], 32 rows of 16 bytes
constexpr int64_t Q8_0_BYTES = PANEL * 2 + QK * PANEL;           // 1088: d[32], 32 rows of 32 int8
constexpr int64_t PREFETCH = 4096;                           // bytes ahead of the block being read

#if defined(MSD_AVX512)
static inline void q4_1_row(const uint8_t* q, const vf d[NV], const vf m[NV], vf w[NV]) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)q));                 // 16 bytes → 16 lanes
    w[0] = vfma(d[0], _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))), m[0]);  // columns 0..15
    w[1] = vfma(d[1], _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), m[1]);                     // columns 16..31
}
static inline void q8_0_row(const uint8_t* q, const vf d[NV], vf w[NV]) {
    __m256i v = _mm256_load_si256((const __m256i*)q);
    w[0] = vmul(d[0], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))));
    w[1] = vmul(d[1], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))));
}
#else
static inline void q4_1_row(const uint8_t* q, const vf d[NV], const vf m[NV], vf w[NV]) {
    __m128i b = _mm_load_si128((const __m128i*)q);
    __m256i a = _mm256_cvtepu8_epi32(b), c = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));   // bytes 0..7, 8..15
    __m256i lo = _mm256_set1_epi32(15);
    w[0] = vfma(d[0], _mm256_cvtepi32_ps(_mm256_and_si256(a, lo)), m[0]);                // columns 0..7
    w[1] = vfma(d[1], _mm256_cvtepi32_ps(_mm256_and_si256(c, lo)), m[1]);                // 8..15
    w[2] = vfma(d[2], _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), m[2]);                // 16..23
    w[3] = vfma(d[3], _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), m[3]);                // 24..31
}
static inline void q8_0_row(const uint8_t* q, const vf d[NV], vf w[NV]) {
    for (int v = 0; v < NV; v++)
        w[v] = vmul(d[v], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(q + v * VEC)))));
}
#endif

// R rows against one panel of q4_1 (MIN) or q8_0 blocks; kb blocks of QK k each. The dequantised weight of each k is
// made once and used by every row, so R rows cost one dequantisation and R FMAs per weight vector.
template <int R, bool MIN>
static void block_gguf(const float* x, int64_t xs, const uint8_t* w, int64_t kb, float* y, int64_t ys, int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? Q4_1_BYTES : Q8_0_BYTES, ROW = MIN ? PANEL / 2 : PANEL;
    vf acc[R][NV];
    for (int r = 0; r < R; r++) for (int v = 0; v < NV; v++) acc[r][v] = vzero();
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        vf d[NV], m[NV];
        for (int v = 0; v < NV; v++) {
            d[v] = vload_f16((const uint16_t*)blk + v * VEC);
            m[v] = MIN ? vload_f16((const uint16_t*)blk + PANEL + v * VEC) : vzero();
        }
        const uint8_t* q = blk + (MIN ? 2 : 1) * PANEL * 2;
        for (int64_t i = 0; i < QK; i++) {
            if (i * 64 < BYTES) _mm_prefetch((const char*)blk + PREFETCH + i * 64, _MM_HINT_T0);
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

// -- int8 activations against GGUF blocks ---------------------------------------------------------------------
// A call first rounds each row of x alone to int8 per block of QK k (quantise_rows): per block a record of QK int8,
// then dx, sx = dx·Σqx (float) and Σqx (int32). The weights are packed for 4-k dot products: per panel and block,
// the scales (and minima) as float16, then for each half of 16 columns the k in groups of 4, one 32-bit lane a
// column (byte 4j + t = column j's k = 4g + t); q4_1 holds groups g and g + 4 in the low and high nibbles.
constexpr int64_t XREC = QK + 12;                            // one row block's record: qx[32], dx, sx, Σqx
constexpr int64_t I8_Q4_1_BYTES = Q4_1_BYTES, I8_Q8_0_BYTES = Q8_0_BYTES;  // the same bytes, another order

static inline float rec_f32(const uint8_t* p) { float v; memcpy(&v, p, 4); return v; }
static inline int32_t rec_i32(const uint8_t* p) { int32_t v; memcpy(&v, p, 4); return v; }

// x [m, k] (row stride xs) → records [m, k/QK, XREC]. Exact steps only (max, a correctly rounded product, round to
// nearest even), so every variant gives the same bytes.
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

#if defined(__AVX512VNNI__)
constexpr int IL = 16;                                       // int32 lanes per dot-product vector
typedef __m512i vi;
typedef __m512 vfi;
static inline vi iload(const uint8_t* p) { return _mm512_load_si512((const void*)p); }
static inline vi iset(int32_t v) { return _mm512_set1_epi32(v); }
static inline vi izero() { return _mm512_setzero_si512(); }
static inline vi iand(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi isrl4(vi a) { return _mm512_srli_epi16(a, 4); }
static inline vi isub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vi isll7(vi a) { return _mm512_slli_epi32(a, 7); }
static inline vi dot_u8s8(vi acc, vi u, vi s) { return _mm512_dpbusd_epi32(acc, u, s); }
static inline vfi fcvt(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vfi fset(float v) { return _mm512_set1_ps(v); }
static inline vfi fzero() { return _mm512_setzero_ps(); }
static inline vfi fmul(vfi a, vfi b) { return _mm512_mul_ps(a, b); }
static inline vfi ffma(vfi a, vfi b, vfi c) { return _mm512_fmadd_ps(a, b, c); }
static inline vfi fload_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline void fstore_cols(float* y, vfi v, int64_t cols) {
    if (cols >= IL) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << cols) - 1u), v);
}
// q8_0 against activations: Σ (qx + 128)·q − 128·Σq, with the activations as dpbusd's unsigned operand
static inline vi dot_s8s8(vi acc, vi w, int32_t x4) { return dot_u8s8(acc, iset(x4 ^ (int32_t)0x80808080u), w); }
static inline vi s8_fix(vi sum, vi wsum) { return isub(sum, isll7(wsum)); }
static inline vi s8_wsum(vi acc, vi w) { return dot_u8s8(acc, iset(0x01010101), w); }
#else
constexpr int IL = 8;
typedef __m256i vi;
typedef __m256 vfi;
static inline vi iload(const uint8_t* p) { return _mm256_load_si256((const __m256i*)p); }
static inline vi iset(int32_t v) { return _mm256_set1_epi32(v); }
static inline vi izero() { return _mm256_setzero_si256(); }
static inline vi iand(vi a, vi b) { return _mm256_and_si256(a, b); }
static inline vi isrl4(vi a) { return _mm256_srli_epi16(a, 4); }
static inline vi dot_u8s8(vi acc, vi u, vi s) {  // u ≤ 15 here: a pair's sum ≤ 2·15·127 never saturates int16
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
static inline vfi fcvt(vi a) { return _mm256_cvtepi32_ps(a); }
static inline vfi fset(float v) { return _mm256_set1_ps(v); }
static inline vfi fzero() { return _mm256_setzero_ps(); }
static inline vfi fmul(vfi a, vfi b) { return _mm256_mul_ps(a, b); }
static inline vfi ffma(vfi a, vfi b, vfi c) { return _mm256_fmadd_ps(a, b, c); }
static inline vfi fload_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline void fstore_cols(float* y, vfi v, int64_t cols) {
    if (cols >= IL) { _mm256_storeu_ps(y, v); return; }
    alignas(32) int32_t mk[IL];
    for (int i = 0; i < IL; i++) mk[i] = i < cols ? -1 : 0;
    _mm256_maskstore_ps(y, _mm256_load_si256((const __m256i*)mk), v);
}
// q8_0: |q| (≤ 128) as the unsigned operand and qx with q's sign: a pair's sum ≤ 2·128·127 never saturates int16
static inline vi dot_s8s8(vi acc, vi w, int32_t x4) {
    vi x = iset(x4);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)),
                                                   _mm256_set1_epi16(1)));
}
static inline vi s8_fix(vi sum, vi) { return sum; }
static inline vi s8_wsum(vi acc, vi) { return acc; }
#endif
constexpr int IV = 16 / IL;  // dot-product vectors per half panel (16 columns)

// R row records against one panel of i8-packed q4_1 (MIN) or q8_0 blocks.
template <int R, bool MIN>
static void block_i8(const uint8_t* x, int64_t xs, const uint8_t* w, int64_t kb, float* y, int64_t ys, int64_t col0, int64_t n) {
    constexpr int64_t BYTES = MIN ? I8_Q4_1_BYTES : I8_Q8_0_BYTES, HALF = MIN ? 4 * 64 : 8 * 64;
    vfi acc[R][2 * IV];
    for (int r = 0; r < R; r++) for (int v = 0; v < 2 * IV; v++) acc[r][v] = fzero();
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        for (int64_t i = 0; i < BYTES; i += 64) _mm_prefetch((const char*)blk + PREFETCH + i, _MM_HINT_T0);
        const uint8_t* q = blk + (MIN ? 2 : 1) * PANEL * 2;
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < IV; v++) {  // IL columns: 16h + IL·v ..
                const int c = h * IV + v;   // this vector's index among the panel's 32 columns
                vfi dw = fload_f16((const uint16_t*)blk + c * IL);
                vfi mw = MIN ? fload_f16((const uint16_t*)blk + PANEL + c * IL) : fzero();
                vi wv[8];
                vi wsum = izero();
                if (MIN) {
                    for (int g = 0; g < 4; g++) {
                        vi t = iload(q + h * HALF + g * 64 + v * IL * 4);
                        wv[g] = iand(t, iset(0x0F0F0F0F));
                        wv[g + 4] = iand(isrl4(t), iset(0x0F0F0F0F));
                    }
                } else {
                    for (int g = 0; g < 8; g++) wsum = s8_wsum(wsum, wv[g] = iload(q + h * HALF + g * 64 + v * IL * 4));
                }
                for (int r = 0; r < R; r++) {
                    const uint8_t* rec = x + r * xs + b * XREC;
                    vi sum = izero();
                    for (int g = 0; g < 8; g++) {
                        const int32_t x4 = rec_i32(rec + 4 * g);
                        sum = MIN ? dot_u8s8(sum, wv[g], iset(x4)) : dot_s8s8(sum, wv[g], x4);
                    }
                    if (!MIN) sum = s8_fix(sum, wsum);
                    acc[r][c] = ffma(fmul(dw, fset(rec_f32(rec + QK))), fcvt(sum), acc[r][c]);
                    if (MIN) acc[r][c] = ffma(mw, fset(rec_f32(rec + QK + 4)), acc[r][c]);
                }
            }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 2 * IV; c++) {
            int64_t col = col0 + c * IL;
            if (col < n) fstore_cols(y + r * ys + col, acc[r][c], n - col);
        }
}

// -- the calling thread's pool: workers that run a job's share and sleep when idle ------------------------------
constexpr int MAX_THREADS = 64;
constexpr auto SPIN = std::chrono::microseconds(100);  // an idle worker spins this long before it sleeps

struct Pool {
    using Fn = void (*)(void*, int);
    std::vector<std::thread> workers;
    std::atomic<uint32_t> gen{0};     // bumped once per job
    std::atomic<int> sleepers{0};     // workers asleep on gen (a job wakes them only when some are)
    std::atomic<int> pending{0};      // workers yet to finish the current job
    std::atomic<bool> quit{false};
    Fn fn = nullptr;
    void* ctx = nullptr;
    int active = 1;                   // threads a job uses, the caller included

    void work(int tid, uint32_t seen) {  // seen: the job count when this worker was made (it runs only later jobs)
        for (;;) {
            auto t0 = std::chrono::steady_clock::now();
            uint32_t g;
            for (int spins = 0; (g = gen.load(std::memory_order_acquire)) == seen; spins++) {
                _mm_pause();
                if ((spins & 255) == 255 && std::chrono::steady_clock::now() - t0 > SPIN) {
                    sleepers.fetch_add(1);
                    gen.wait(seen);
                    sleepers.fetch_sub(1);
                    t0 = std::chrono::steady_clock::now();
                }
            }
            seen = g;
            if (quit.load(std::memory_order_acquire)) return;
            if (tid < active) fn(ctx, tid);
            pending.fetch_sub(1, std::memory_order_release);
        }
    }

    void run(Fn f, void* c, int threads) {  // f(c, tid) for tid 0..threads−1; tid 0 on the calling thread
        fn = f, ctx = c, active = threads;
        pending.store((int)workers.size(), std::memory_order_relaxed);
        gen.fetch_add(1);
        if (sleepers.load() > 0) gen.notify_all();
        f(c, 0);
        while (pending.load(std::memory_order_acquire) != 0) _mm_pause();
    }

    void resize(int threads) {  // threads − 1 workers (kept when fewer are asked for later: they sleep)
        active = threads;
        while ((int)workers.size() < threads - 1) {
            int tid = (int)workers.size() + 1;
            uint32_t now = gen.load();
            workers.emplace_back([this, tid, now] { work(tid, now); });
        }
    }

    ~Pool() {
        quit.store(true, std::memory_order_release);
        pending.store((int)workers.size());
        gen.fetch_add(1);
        gen.notify_all();
        for (auto& t : workers) t.join();
    }
};

thread_local Pool tl_pool;

// f(lo, hi, tid) over [0, units) split into the calling thread's pool's contiguous shares (on this thread alone when the
// pool has one thread or there is one unit).
template <typename F>
static void parallel_for(int64_t units, F&& f) {
    int threads = (int)(tl_pool.active < units ? tl_pool.active : units);
    if (threads <= 1) { f((int64_t)0, units, 0); return; }
    struct Ctx { F* f; int64_t units; int threads; } ctx{&f, units, threads};
    tl_pool.run([](void* c, int tid) {
        auto* k = (Ctx*)c;
        int64_t lo = k->units * tid / k->threads, hi = k->units * (tid + 1) / k->threads;
        if (lo < hi) (*k->f)(lo, hi, tid);
    }, &ctx, threads);
}

// Every panel once, the panels split between the pool's threads; within a panel, the rows GROUP at a time (the panel
// stays in L1/L2 for the next group). panel_bytes: one panel's packed bytes.
template <typename X, typename W>
static void run_panels(const Block<X, W>* blocks, const X* x, int64_t m, int64_t xs, const W* w, int64_t kk, int64_t panel_bytes,
                       float* y, int64_t ys, int64_t n) {
    int64_t panels = (n + PANEL - 1) / PANEL;
    parallel_for(panels, [&](int64_t first, int64_t last, int) {
        for (int64_t p = first; p < last; p++) {
            const W* wp = (const W*)((const uint8_t*)w + p * panel_bytes);
            for (int64_t r0 = 0; r0 < m; r0 += GROUP) {
                int64_t rows = m - r0 < GROUP ? m - r0 : GROUP;
                blocks[rows - 1](x + r0 * xs, xs, wp, kk, y + r0 * ys, ys, p * PANEL, n);
            }
        }
    });
}

#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
// -- AMX tiles for the int8 format's windows -----------------------------------------------------------------
// One tile dot product gives every row's integer block sum for 16 columns at once (tdpbsud: int8 activations ×
// q4_1's 0..15; tdpbssd: × q8_0's int8), where VNNI spends 8 instructions a row. The sums are the same exact
// integers, and the float steps after them are block_i8's, lane for lane, so a row's output is the same bits
// whichever path ran it: calls of at least amx_rows rows take this one (msd_set_amx_rows; 0 = never). Each block
// ends in a store of its sums and a float epilogue per row, so the tiles only pay on long calls (prefills).
constexpr int64_t TILE_ROWS = 16;
static bool amx_ready = false;  // the OS let this process use tile data (msd_amx_init)
static int64_t amx_rows = 16;  // prefills; scripts/target_rows.py --amx-rows times the tiles against VNNI

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

// One block's epilogue from its stored sums: block_i8's float steps, lane for lane.
template <bool MIN>
static inline void amx_epilogue(const uint8_t* x, int64_t xs, int64_t rows, const uint8_t* blk, int64_t b,
                                const int32_t (*sums)[TILE_ROWS][16], float (*acc)[PANEL]) {
    for (int c = 0; c < 2; c++) {
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)blk + 16 * c)));
        __m512 mw = MIN ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)blk + PANEL + 16 * c)))
                        : _mm512_setzero_ps();
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t* rec = x + r * xs + b * XREC;
            __m512 a = _mm512_load_ps(&acc[r][16 * c]);
            a = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(rec_f32(rec + QK))),
                                _mm512_cvtepi32_ps(_mm512_load_si512((const void*)sums[c][r])), a);
            if (MIN) a = _mm512_fmadd_ps(mw, _mm512_set1_ps(rec_f32(rec + QK + 4)), a);
            _mm512_store_ps(&acc[r][16 * c], a);
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
    constexpr int64_t BYTES = MIN ? I8_Q4_1_BYTES : I8_Q8_0_BYTES, QOFF = (MIN ? 2 : 1) * PANEL * 2;
    alignas(64) float acc[TILE_ROWS][PANEL];
    alignas(64) int32_t sums[2][TILE_ROWS][16];
    alignas(64) uint8_t tmp[2][2][8 * 64];
    for (int64_t r = 0; r < rows; r++) for (int c = 0; c < 2; c++) _mm512_store_ps(&acc[r][16 * c], _mm512_setzero_ps());
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t* blk = w + b * BYTES;
        for (int64_t i = 0; i < BYTES; i += 64) _mm_prefetch((const char*)blk + PREFETCH + i, _MM_HINT_T0);
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
        for (int c = 0; c < 2; c++) {
            int64_t col = col0 + 16 * c;
            if (col < n) fstore_cols(y + r * ys + col, _mm512_load_ps(&acc[r][16 * c]), n - col);
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

// The register blocks by row count: BLOCKS[R − 1] computes R rows (Block: x, its row stride, a panel, K, y, its
// row stride, the panel's first column, N).
#if defined(MSD_AVX512)
#define MSD_BLOCKS(f, ...) {f<1, ##__VA_ARGS__>, f<2, ##__VA_ARGS__>, f<3, ##__VA_ARGS__>, f<4, ##__VA_ARGS__>, \
                            f<5, ##__VA_ARGS__>, f<6, ##__VA_ARGS__>, f<7, ##__VA_ARGS__>, f<8, ##__VA_ARGS__>}
#else
#define MSD_BLOCKS(f, ...) {f<1, ##__VA_ARGS__>, f<2, ##__VA_ARGS__>, f<3, ##__VA_ARGS__>}
#endif
static const Block<float, float> F32[GROUP] = MSD_BLOCKS(block_fma, float);
static const Block<float, uint16_t> F16[GROUP] = MSD_BLOCKS(block_fma, uint16_t);
static const Block<uint32_t, uint32_t> BF16[GROUP] = MSD_BLOCKS(block_bf16);
static const Block<float, uint8_t> Q4_1[GROUP] = MSD_BLOCKS(block_gguf, true);
static const Block<float, uint8_t> Q8_0[GROUP] = MSD_BLOCKS(block_gguf, false);
static const Block<uint8_t, uint8_t> I8_Q4_1[GROUP] = MSD_BLOCKS(block_i8, true);
static const Block<uint8_t, uint8_t> I8_Q8_0[GROUP] = MSD_BLOCKS(block_i8, false);

static inline uint16_t to_bf16(float f) {  // round to nearest even; a NaN stays a (quiet) NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One packed element from the weights at w (the next k's weight `stride` floats on, present or not).
static inline float as_f32(const float* w, int64_t, bool) { return w[0]; }
static inline uint16_t as_f16(const float* w, int64_t, bool) { return _cvtss_sh(w[0], _MM_FROUND_TO_NEAREST_INT); }
static inline uint32_t as_bf16_pair(const float* w, int64_t stride, bool has_next) {  // k even low, k + 1 high
    return (uint32_t)to_bf16(w[0]) | ((has_next ? (uint32_t)to_bf16(w[stride]) : 0u) << 16);
}

// W [k, n] (row stride ws) into panels of PANEL columns, `per` rows of k in each packed element (2: bf16 pairs);
// columns past n stay as the caller zeroed them.
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

// Where value i (the k within its block) of panel column j goes in a packed block, and its shift (4: q4_1's high
// nibble). The scales come first: d[32] float16, then q4_1's m[32].
struct Place {
    int64_t at;
    int shift;
};
static Place place_q4_1(int64_t j, int64_t i) {  // byte j % 16 of row i: column j (j < 16) or j + 16 (high nibble)
    return {4 * PANEL + i * (PANEL / 2) + j % (PANEL / 2), j < PANEL / 2 ? 0 : 4};
}
static Place place_q8_0(int64_t j, int64_t i) { return {2 * PANEL + i * PANEL + j, 0}; }
static Place place_q4_1_i8(int64_t j, int64_t i) {  // half j / 16, group i / 4 (groups 4..7 in the high nibbles)
    return {4 * PANEL + (j / 16) * 256 + (i / 4 % 4) * 64 + 4 * (j % 16) + i % 4, i / 4 < 4 ? 0 : 4};
}
static Place place_q8_0_i8(int64_t j, int64_t i) { return {2 * PANEL + (j / 16) * 512 + (i / 4) * 64 + 4 * (j % 16) + i % 4, 0}; }

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

static bool bad(int64_t m, int64_t k, int64_t n, int64_t xs, int64_t ys, const void* x, const void* w, const void* y) {
    return m < 1 || k < 1 || n < 1 || xs < k || ys < n || !x || !w || !y || ((uintptr_t)w % 64) != 0;
}

}  // namespace

extern "C" {

// The read bandwidth one core reaches here: sum n floats (64-byte aligned, n a multiple of 4·VEC) with four
// independent vector accumulators, the way the kernel streams its panels. The sum is returned so the loop stays.
static double stream_sum(const float* p, int64_t n) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t i = 0; i < n; i += 4 * VEC) {
        a0 = vfma(vbcast(1.0f), vload(p + i), a0);
        a1 = vfma(vbcast(1.0f), vload(p + i + VEC), a1);
        a2 = vfma(vbcast(1.0f), vload(p + i + 2 * VEC), a2);
        a3 = vfma(vbcast(1.0f), vload(p + i + 3 * VEC), a3);
    }
    alignas(64) float lanes[VEC];
    double s = 0.0;
    for (vf a : {a0, a1, a2, a3}) {
        memcpy(lanes, &a, sizeof(lanes));
        for (int l = 0; l < VEC; l++) s += lanes[l];
    }
    return s;
}

double msd_stream_read(const float* p, int64_t n) {
    if (!p || n < 4 * VEC || n % (4 * VEC) || ((uintptr_t)p % 64) != 0) return -1.0;
    return stream_sum(p, n);
}

// The same read split between the calling thread's pool (the whole lane's, or the whole machine's, bandwidth).
double msd_stream_read_par(const float* p, int64_t n) {
    if (!p || n < 4 * VEC || n % (4 * VEC) || ((uintptr_t)p % 64) != 0) return -1.0;
    double parts[MAX_THREADS] = {0};
    const int64_t chunks = n / (4 * VEC);
    parallel_for(chunks, [&](int64_t lo, int64_t hi, int tid) { parts[tid] = stream_sum(p + lo * 4 * VEC, (hi - lo) * 4 * VEC); });
    double s = 0.0;
    for (double v : parts) s += v;
    return s;
}

// The variant this file was built as: 2 = AVX2, 3 = AVX-512, 4 = AVX-512 with BF16 dot products, 5 = and VNNI,
// 6 = and AMX-INT8 tiles.
int msd_variant(void) {
#if defined(MSD_AVX512) && defined(__AVX512BF16__) && defined(__AVX512VNNI__) && defined(__AMX_INT8__)
    return 6;
#elif defined(MSD_AVX512) && defined(__AVX512BF16__) && defined(__AVX512VNNI__)
    return 5;
#elif defined(MSD_AVX512) && defined(__AVX512BF16__)
    return 4;
#elif defined(MSD_AVX512)
    return 3;
#else
    return 2;
#endif
}

int msd_panel(void) { return (int)PANEL; }

int msd_qk(void) { return (int)QK; }

// AMX for the int8 format's windows: ask the OS for tile data (once per process); 0 when granted (or already),
// 1 when refused or when this build has no AMX path.
int msd_amx_init(void) {
#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
    if (!amx_ready) amx_ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return amx_ready ? 0 : 1;
#else
    return 1;
#endif
}

// Calls of at least `rows` rows run on AMX tiles (0: never). The same bits either way; tests force both paths.
void msd_set_amx_rows(int64_t rows) {
#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
    amx_rows = rows;
#else
    (void)rows;
#endif
}

// The packed bytes of one panel and block of 32 k in a GGUF block format (3 q4_1, 4 q8_0), or 0.
// (5 and 6: the same blocks packed for int8 activations, i8)
int64_t msd_block_bytes(int fmt) {
    return fmt == 3 ? Q4_1_BYTES : fmt == 4 ? Q8_0_BYTES : fmt == 5 ? I8_Q4_1_BYTES : fmt == 6 ? I8_Q8_0_BYTES : 0;
}

// The calling thread's pool: later calls from this thread use `threads` threads (itself and threads − 1 workers,
// created now with this thread's CPU affinity). Returns 0, or 1 for a count outside 1..MAX_THREADS.
int msd_set_threads(int threads) {
    if (threads < 1 || threads > MAX_THREADS) return 1;
    tl_pool.resize(threads);
    return 0;
}

int msd_threads(void) { return tl_pool.active; }

// Ask the OS for 2 MB pages under [p, p + n) (p 2 MB aligned, not yet written): packed weights are read once per
// token from end to end, and 4 KB pages cost a TLB miss every 4 KB of that stream. 0, or the OS's refusal.
int msd_advise_huge(void* p, int64_t n) {
#ifdef MADV_HUGEPAGE
    return madvise(p, (size_t)n, MADV_HUGEPAGE);
#else
    return 1;
#endif
}

// Packing (called once per weight). w: row-major [K, N] float32 (row stride ws). Output buffers are
// zero-filled by the caller and 64-byte aligned: f32 panels*K*32 floats; f16 the same count of uint16 (F16C,
// round to nearest even); bf16 panels*ceil(K/2)*32 uint32 (pairs of bf16, k even in the low half).
int msd_pack_f32(const float* w, int64_t k, int64_t n, int64_t ws, float* out) {
    return pack_panels<float, as_f32>(w, k, n, ws, out, 1);
}

int msd_pack_f16(const float* w, int64_t k, int64_t n, int64_t ws, uint16_t* out) {
    return pack_panels<uint16_t, as_f16>(w, k, n, ws, out, 1);
}

int msd_pack_bf16(const float* w, int64_t k, int64_t n, int64_t ws, uint32_t* out) {
    return pack_panels<uint32_t, as_bf16_pair>(w, k, n, ws, out, 2);
}

// GGUF blocks of a weight W [n, k] (GGUF's own order: column j of y, its k in blocks of 32) into panels:
// d, m [n, k/32] float16 bits, q [n, k/32, 32] the blocks' values (q4_1: 0..15; q8_0: int8), k a multiple of 32.
// out (zero-filled, 64-byte aligned): panels·(k/32)·msd_block_bytes(format) bytes; columns past n stay zero.
// The _i8 packers lay the same values out for int8 activations (the i8 layout above).
int msd_pack_q4_1(const uint16_t* d, const uint16_t* m, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q4_1, true>(d, m, q, k, n, out, Q4_1_BYTES);
}

int msd_pack_q8_0(const uint16_t* d, const int8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q8_0, false>(d, nullptr, (const uint8_t*)q, k, n, out, Q8_0_BYTES);
}

int msd_pack_q4_1_i8(const uint16_t* d, const uint16_t* m, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q4_1_i8, true>(d, m, q, k, n, out, I8_Q4_1_BYTES);
}

int msd_pack_q8_0_i8(const uint16_t* d, const int8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q8_0_i8, false>(d, nullptr, (const uint8_t*)q, k, n, out, I8_Q8_0_BYTES);
}

// y[m, n] (row stride ys) = x[m, k] (row stride xs) @ packed W. Returns 0, or 1 on arguments it refuses.
int msd_linear_f32(const float* x, int64_t m, int64_t k, int64_t xs, const float* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y)) return 1;
    run_panels<float, float>(F32, x, m, xs, w, k, k * PANEL * 4, y, ys, n);
    return 0;
}

int msd_linear_f16(const float* x, int64_t m, int64_t k, int64_t xs, const uint16_t* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y)) return 1;
    run_panels<float, uint16_t>(F16, x, m, xs, w, k, k * PANEL * 2, y, ys, n);
    return 0;
}

int msd_linear_bf16(const float* x, int64_t m, int64_t k, int64_t xs, const uint32_t* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y)) return 1;
    int64_t k2 = (k + 1) / 2;
    thread_local std::vector<uint32_t> xp;  // x as bf16 pairs [m, k2]
    if ((int64_t)xp.size() < m * k2) xp.resize(m * k2);
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < k2; i++) xp[r * k2 + i] = as_bf16_pair(x + r * xs + 2 * i, 1, 2 * i + 1 < k);
    run_panels<uint32_t, uint32_t>(BF16, xp.data(), m, k2, w, k2, k2 * PANEL * 4, y, ys, n);
    return 0;
}

int msd_linear_q4_1(const float* x, int64_t m, int64_t k, int64_t xs, const uint8_t* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y) || k % QK) return 1;
    run_panels<float, uint8_t>(Q4_1, x, m, xs, w, k / QK, k / QK * Q4_1_BYTES, y, ys, n);
    return 0;
}

int msd_linear_q8_0(const float* x, int64_t m, int64_t k, int64_t xs, const uint8_t* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y) || k % QK) return 1;
    run_panels<float, uint8_t>(Q8_0, x, m, xs, w, k / QK, k / QK * Q8_0_BYTES, y, ys, n);
    return 0;
}

// y = (x rounded to int8 per row and block) against i8-packed blocks (i8 in the header).
static int linear_i8(const Block<uint8_t, uint8_t>* blocks, int64_t bytes, const float* x, int64_t m, int64_t k,
                     int64_t xs, const uint8_t* w, int64_t n, float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y) || k % QK) return 1;
    thread_local std::vector<uint8_t> recs;
    if ((int64_t)recs.size() < m * (k / QK) * XREC) recs.resize(m * (k / QK) * XREC);
    quantise_rows(x, m, k, xs, recs.data());
    if (!linear_amx(blocks == I8_Q4_1, recs.data(), m, (k / QK) * XREC, w, k / QK, k / QK * bytes, y, ys, n))
        run_panels<uint8_t, uint8_t>(blocks, recs.data(), m, (k / QK) * XREC, w, k / QK, k / QK * bytes, y, ys, n);
    return 0;
}

int msd_linear_q4_1_i8(const float* x, int64_t m, int64_t k, int64_t xs, const uint8_t* w, int64_t n, float* y, int64_t ys) {
    return linear_i8(I8_Q4_1, I8_Q4_1_BYTES, x, m, k, xs, w, n, y, ys);
}

int msd_linear_q8_0_i8(const float* x, int64_t m, int64_t k, int64_t xs, const uint8_t* w, int64_t n, float* y, int64_t ys) {
    return linear_i8(I8_Q8_0, I8_Q8_0_BYTES, x, m, k, xs, w, n, y, ys);
}

}  // extern "C"

// -- one Llama-family decoder layer over T new rows, every row computed alone -----------------------------------
// The layer's own arithmetic (norms, RoPE, attention, SiLU) runs row by row with fixed loop orders, and its linear
// maps are the kernel above, so a row's output depends only on its own input and the cache entries before it:
// an AR step and a window give every position the same bits without any row plan.
struct msd_layer {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    int32_t fmt[4];                   // each map's packed format (q|k|v, o, gate|up, down): 0 float32, 1 float16,
                                      // 2 bfloat16, 3 q4_1, 4 q8_0, 5 q4_1 i8, 6 q8_0 i8
    float eps, scale;                 // RMS-norm epsilon; attention's 1/sqrt(D)
    const float* ln1;                 // [H]
    const float* ln2;                 // [H]
    const void* w_qkv;                // packed [H, (Hq + 2·Hkv)·D]
    const float* b_qkv;               // [(Hq + 2·Hkv)·D] or NULL (Qwen2)
    const float* q_norm;              // [D] or NULL (Qwen3)
    const float* k_norm;              // [D] or NULL
    const void* w_o;                  // packed [Hq·D, H]
    const void* w_gate_up;            // packed [H, 2·I]
    const void* w_down;               // packed [I, H]
};

namespace {

static int linear(int32_t fmt, const float* x, int64_t m, int64_t k, const void* w, int64_t n, float* y) {
    if (fmt == 0) return msd_linear_f32(x, m, k, k, (const float*)w, n, y, n);
    if (fmt == 1) return msd_linear_f16(x, m, k, k, (const uint16_t*)w, n, y, n);
    if (fmt == 2) return msd_linear_bf16(x, m, k, k, (const uint32_t*)w, n, y, n);
    if (fmt == 3) return msd_linear_q4_1(x, m, k, k, (const uint8_t*)w, n, y, n);
    if (fmt == 4) return msd_linear_q8_0(x, m, k, k, (const uint8_t*)w, n, y, n);
    if (fmt == 5) return msd_linear_q4_1_i8(x, m, k, k, (const uint8_t*)w, n, y, n);
    if (fmt == 6) return msd_linear_q8_0_i8(x, m, k, k, (const uint8_t*)w, n, y, n);
    return 1;
}

// y = gain · x / sqrt(mean(x²) + eps) over n values (LlamaRMSNorm's order: normalise, then the gain)
static void rms_norm_row(const float* x, const float* gain, int64_t n, float eps, float* y) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += x[i + l] * x[i + l];
    float ss = 0.0f;
    for (int l = 0; l < 16; l++) ss += lanes[l];
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t j = 0; j < n; j++) y[j] = gain[j] * (x[j] * inv);
}

static inline float hsum(vf v) {  // the lanes added pairwise in a fixed tree (the same for every call)
#if defined(MSD_AVX512)
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
#else
    __m256 h = v;
#endif
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

// act[j] = silu(g[j]) · u[j] = g / (1 + e^(−g)) · u over n values, VEC at a time (the tail through the same vexp)
static void silu_mul(const float* g, const float* u, int64_t n, float* act) {
    int64_t j = 0;
    for (; j + VEC <= n; j += VEC) {
        vf gv = vloadu(g + j);
        vstore_cols(act + j, vmul(vdiv(gv, vadd(vbcast(1.0f), vexp(vsub(vzero(), gv)))), vloadu(u + j)), VEC);
    }
    if (j < n) {
        alignas(64) float gt[VEC] = {0}, ut[VEC] = {0};
        memcpy(gt, g + j, sizeof(float) * (n - j));
        memcpy(ut, u + j, sizeof(float) * (n - j));
        vf gv = vloadu(gt);
        vstore_cols(act + j, vmul(vdiv(gv, vadd(vbcast(1.0f), vexp(vsub(vzero(), gv)))), vloadu(ut)), n - j);
    }
}


static float dot(const float* a, const float* b, int64_t n) {  // one FMA chain per lane, then hsum, then the tail
    vf acc = vzero();
    int64_t i = 0;
    for (; i + VEC <= n; i += VEC) acc = vfma(vloadu(a + i), vloadu(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// One query row of one head over its n visible keys: out[D] = Σ_j softmax(q·k_j · scale)_j v_j. w: n floats scratch.
static void attend_row(const float* q, const float* keys, const float* values, int64_t n, int64_t d, float scale,
                       float* w, float* out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        w[j] = dot(q, keys + j * d, d) * scale;
        mx = w[j] > mx ? w[j] : mx;
    }
    vf vsum = vzero(), vmx = vbcast(mx);
    int64_t j = 0;
    for (; j + VEC <= n; j += VEC) {
        vf e = vexp(vsub(vloadu(w + j), vmx));
        vstore_cols(w + j, e, VEC);
        vsum = vadd(vsum, e);
    }
    alignas(64) float tail[VEC];
    for (int l = 0; l < VEC; l++) tail[l] = j + l < n ? w[j + l] - mx : -INFINITY;
    vf e = vexp(vloadu(tail));
    vstore_cols(w + j, e, n - j);
    alignas(64) float el[VEC];
    memcpy(el, &e, sizeof(el));
    float sum = hsum(vsum);
    for (int l = 0; j + l < n; l++) sum += el[l];
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < d; i++) out[i] = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        const float p = w[k] * inv;
        const float* v = values + k * d;
        for (int64_t i = 0; i < d; i++) out[i] += p * v[i];
    }
}

// x[d] ← x[d]·cos[d] + rotate_half(x)[d]·sin[d]  (rotate_half(x) = [−x[D/2:], x[:D/2]])
static void rope(float* x, const float* cos, const float* sin, int64_t d) {
    int64_t h = d / 2;
    float tmp[512];
    for (int64_t i = 0; i < d; i++) tmp[i] = x[i];
    for (int64_t i = 0; i < h; i++) x[i] = tmp[i] * cos[i] + (-tmp[i + h]) * sin[i];
    for (int64_t i = h; i < d; i++) x[i] = tmp[i] * cos[i] + tmp[i - h] * sin[i];
}

}  // namespace

extern "C" {

// x [t, H] (in/out: the residual stream) through one layer at positions start..start+t−1; the layer's keys and
// values are written into kc/vc [Hkv, cap, D] at those positions, and row r attends to entries 0..start+r.
// cos/sin: [t, D]. Returns 0, or 1 on arguments it refuses.
int64_t msd_layer_size(void) { return (int64_t)sizeof(msd_layer); }

int msd_layer_forward(const msd_layer* L, float* x, int64_t t, const float* cos, const float* sin,
                      float* kc, float* vc, int64_t cap, int64_t start) {
    if (!L || !x || !cos || !sin || !kc || !vc || t < 1 || start < 0 || start + t > cap) return 1;
    const int64_t H = L->hidden, Hq = L->heads, Hkv = L->kv_heads, D = L->head_dim, I = L->inter;
    if (H < 1 || Hq < 1 || Hkv < 1 || Hq % Hkv || D < 2 || D % 2 || D > 512 || I < 1) return 1;
    const int64_t nq = Hq * D, nkv = Hkv * D, nqkv = nq + 2 * nkv, rep = Hq / Hkv, keys = start + t;
    // scratch: kept between calls for windows (no allocation per step); a long prefill's is freed when it returns
    thread_local std::vector<float> kept;
    std::vector<float> once;
    const int64_t threads = tl_pool.active;
    size_t need = (size_t)(t * H + t * nqkv + t * nq + t * 2 * I + t * I + threads * keys);
    std::vector<float>& buf = need <= ((size_t)1 << 22) ? kept : once;
    if (buf.size() < need) buf.resize(need);
    float* xn = buf.data();            // [t, H]
    float* qkv = xn + t * H;           // [t, nqkv]
    float* att = qkv + t * nqkv;       // [t, nq]
    float* gu = att + t * nq;          // [t, 2I]
    float* act = gu + t * 2 * I;       // [t, I]
    float* w = act + t * I;            // [threads, keys] attention weights of one row and head, per thread

    for (int64_t r = 0; r < t; r++) rms_norm_row(x + r * H, L->ln1, H, L->eps, xn + r * H);
    if (linear(L->fmt[0], xn, t, H, L->w_qkv, nqkv, qkv)) return 1;
    for (int64_t r = 0; r < t; r++) {
        float* row = qkv + r * nqkv;
        if (L->b_qkv) for (int64_t j = 0; j < nqkv; j++) row[j] = row[j] + L->b_qkv[j];
        for (int64_t h = 0; h < Hq + Hkv; h++) {  // the query heads, then the key heads
            float* head = row + h * D;
            if (L->q_norm) {
                float tmp[512];
                rms_norm_row(head, h < Hq ? L->q_norm : L->k_norm, D, L->eps, tmp);
                memcpy(head, tmp, sizeof(float) * D);
            }
            rope(head, cos + r * D, sin + r * D, D);
        }
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(kc + (g * cap + start + r) * D, row + nq + g * D, sizeof(float) * D);
            memcpy(vc + (g * cap + start + r) * D, row + nq + nkv + g * D, sizeof(float) * D);
        }
    }
    parallel_for(t * Hq, [&](int64_t lo, int64_t hi, int tid) {  // (row, head) pairs split between the threads
        float* scratch = w + tid * keys;                           // this thread's own
        for (int64_t u = lo; u < hi; u++) {
            const int64_t r = u / Hq, h = u % Hq, n = start + r + 1;  // row r sees entries 0..start+r
            const float* q = qkv + r * nqkv + h * D;
            attend_row(q, kc + (h / rep) * cap * D, vc + (h / rep) * cap * D, n, D, L->scale, scratch,
                       att + r * nq + h * D);
        }
    });
    if (linear(L->fmt[1], att, t, nq, L->w_o, H, xn)) return 1;                    // xn ← o_proj(att)
    for (int64_t i = 0; i < t * H; i++) x[i] = x[i] + xn[i];
    for (int64_t r = 0; r < t; r++) rms_norm_row(x + r * H, L->ln2, H, L->eps, xn + r * H);
    if (linear(L->fmt[2], xn, t, H, L->w_gate_up, 2 * I, gu)) return 1;
    for (int64_t r = 0; r < t; r++) silu_mul(gu + r * 2 * I, gu + r * 2 * I + I, I, act + r * I);  // silu(gate)·up
    if (linear(L->fmt[3], act, t, I, L->w_down, H, xn)) return 1;
    for (int64_t i = 0; i < t * H; i++) x[i] = x[i] + xn[i];
    return 0;
}

}  // extern "C"
