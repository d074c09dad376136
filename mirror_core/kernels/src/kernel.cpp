// The exact small-row kernel: y[M, N] = x[M, K] @ W[K, N] for packed weights, and a whole Llama-family decoder
// layer, where row r of an M-row call is bit for bit that row's own 1-row call, for every M, every place of the
// row in the call, every thread count, and every variant this file is built as (the scalar reference included).
// The one translation unit: each job is a header of its own, included in this order.
//   simd.h            the one SIMD layer (16 lanes on every variant) and the variants' mappings
//   formats.h         the weight formats: enum, packed block structs, the traits table
//   float_kernels.h   f32, f16, bf16 register blocks
//   gguf_kernels.h    q4_1 / q8_0 blocks dequantised in registers (float32's function)
//   pool.h            the calling thread's pool and the panel split
//   int8_kernels.h    q4_1 / q8_0 blocks against int8 activations (the int8 function)
//   amx.h             AMX-INT8 tiles for long int8 calls (amx variant only)
//   pack.h            the packers
//   layer.h           the decoder layer
//   probes.h          the bandwidth probe
// Built once per machine by mirror_core/kernels/native.py with -DMSD_AVX512, -DMSD_AVX2 or neither (the scalar
// reference, no -m flags) and -ffp-contract=off; the Python side checks dtype, shape, strides and alignment before
// every call.
#include <stddef.h>
#include <array>
#include <utility>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "simd.h"

namespace {
#include "formats.h"
#include "float_kernels.h"
#include "gguf_kernels.h"
#include "pool.h"
#include "int8_kernels.h"
#include "amx.h"
#include "pack.h"
#include "layer.h"
#include "probes.h"

// The register blocks by row count: BLOCKS[R − 1] computes R rows.
template <template <int> class F, typename B, int... R>
constexpr auto blocks_of(std::integer_sequence<int, R...>) { return std::array<B, sizeof...(R)>{F<R + 1>::fn...}; }
#define MSD_ROWS(name, X, W, call)                                                                     \
    template <int R> struct name##_r { static constexpr Block<X, W> fn = call; };                      \
    static constexpr auto name = blocks_of<name##_r, Block<X, W>>(std::make_integer_sequence<int, GROUP>{});
MSD_ROWS(F32_BLOCKS, float, float, (block_fma<R, float>))
MSD_ROWS(F16_BLOCKS, float, uint16_t, (block_fma<R, uint16_t>))
MSD_ROWS(BF16_BLOCKS, uint32_t, uint32_t, (block_bf16<R>))
MSD_ROWS(Q4_1_BLOCKS, float, uint8_t, (block_gguf<R, true>))
MSD_ROWS(Q8_0_BLOCKS, float, uint8_t, (block_gguf<R, false>))

static bool bad(int64_t m, int64_t k, int64_t n, int64_t xs, int64_t ys, const void* x, const void* w, const void* y) {
    return m < 1 || k < 1 || n < 1 || xs < k || ys < n || !x || !w || !y || ((uintptr_t)w % 64) != 0;
}

// y = (x rounded to int8 per row and block) against _I8-packed blocks.
static int linear_i8(bool q4_1, const float* x, int64_t m, int64_t k, int64_t xs, const uint8_t* w, int64_t n,
                     float* y, int64_t ys) {
    if (bad(m, k, n, xs, ys, x, w, y) || k % QK) return 1;
    const int64_t kb = k / QK, bytes = q4_1 ? sizeof(PackedQ4_1) : sizeof(PackedQ8_0);
    thread_local std::vector<uint8_t> recs;
    if ((int64_t)recs.size() < m * kb * XREC) recs.resize(m * kb * XREC);
    uint8_t* rec = recs.data();
    each_row(m, k, [&](int64_t r) { quantise_row(x + r * xs, k, rec + r * kb * XREC); });
    if (linear_amx(q4_1, recs.data(), m, kb * XREC, w, kb, kb * bytes, y, ys, n)) return 0;
    if (q4_1) run_panels_i8<true>(recs.data(), m, kb * XREC, w, kb, kb * bytes, y, ys, n);
    else run_panels_i8<false>(recs.data(), m, kb * XREC, w, kb, kb * bytes, y, ys, n);
    return 0;
}

// y[m, n] (row stride ys) = x[m, k] (row stride xs) @ W packed in `fmt`. Returns 0, or 1 on arguments it refuses.
static int linear_any(int32_t fmt, const float* x, int64_t m, int64_t k, int64_t xs, const void* w, int64_t n, float* y,
                      int64_t ys) {
    if (fmt < 0 || fmt >= FORMAT_COUNT || bad(m, k, n, xs, ys, x, w, y)) return 1;
    if (fmt == Q4_1_I8 || fmt == Q8_0_I8 || fmt == Q8_0_QUANT)
        return linear_i8(fmt == Q4_1_I8, x, m, k, xs, (const uint8_t*)w, n, y, ys);
    if ((fmt == Q4_1 || fmt == Q8_0) && k % QK) return 1;
    const int64_t kb = k / QK;
    switch (fmt) {
    case F32: run_panels<float, float>(F32_BLOCKS.data(), x, m, xs, (const float*)w, k, k * PANEL * 4, y, ys, n); break;
    case F16: run_panels<float, uint16_t>(F16_BLOCKS.data(), x, m, xs, (const uint16_t*)w, k, k * PANEL * 2, y, ys, n); break;
    case Q4_1: run_panels<float, uint8_t>(Q4_1_BLOCKS.data(), x, m, xs, (const uint8_t*)w, kb, kb * sizeof(PackedQ4_1), y, ys, n); break;
    case Q8_0: run_panels<float, uint8_t>(Q8_0_BLOCKS.data(), x, m, xs, (const uint8_t*)w, kb, kb * sizeof(PackedQ8_0), y, ys, n); break;
    default: {  // BF16: x rounded to bfloat16 pairs first
        const int64_t k2 = (k + 1) / 2;
        thread_local std::vector<uint32_t> xp;  // [m, k2]
        if ((int64_t)xp.size() < m * k2) xp.resize(m * k2);
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < k2; i++) xp[r * k2 + i] = as_bf16_pair(x + r * xs + 2 * i, 1, 2 * i + 1 < k);
        run_panels<uint32_t, uint32_t>(BF16_BLOCKS.data(), xp.data(), m, k2, (const uint32_t*)w, k2, k2 * PANEL * 4, y, ys, n);
    }
    }
    return 0;
}

static int linear(int32_t fmt, const float* x, int64_t m, int64_t k, const void* w, int64_t n, float* y) {
    return linear_any(fmt, x, m, k, k, w, n, y, n);
}
}  // namespace

extern "C" {

// The variant this library was built as: 1 scalar reference, 2 AVX2, 3 AVX-512, 5 and VNNI, 6 and AMX-INT8 tiles.
int msd_variant(void) {
#if defined(MSD_AVX512) && defined(__AVX512VNNI__) && defined(__AMX_INT8__)
    return 6;
#elif defined(MSD_AVX512) && defined(__AVX512VNNI__)
    return 5;
#elif defined(MSD_AVX512)
    return 3;
#elif defined(MSD_AVX2)
    return 2;
#else
    return 1;
#endif
}

int msd_panel(void) { return (int)PANEL; }
int msd_qk(void) { return (int)QK; }
const msd_format_info* msd_format_table(int64_t* count) { *count = FORMAT_COUNT; return FORMAT_TABLE; }
int64_t msd_layer_size(void) { return (int64_t)sizeof(msd_layer); }

// AMX for the int8 format's long calls: ask the OS for tile data (once per process); 0 when granted (or already),
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

// Per-element formats. w: row-major [K, N] float32 (row stride ws); out: formats.h's panels.
int msd_pack_f32(const float* w, int64_t k, int64_t n, int64_t ws, float* out) {
    return pack_panels<float, as_f32>(w, k, n, ws, out, 1);
}
int msd_pack_f16(const float* w, int64_t k, int64_t n, int64_t ws, uint16_t* out) {
    return pack_panels<uint16_t, as_f16>(w, k, n, ws, out, 1);
}
int msd_pack_bf16(const float* w, int64_t k, int64_t n, int64_t ws, uint32_t* out) {
    return pack_panels<uint32_t, as_bf16_pair>(w, k, n, ws, out, 2);
}

// Block formats (pack.h's pack_blocks): d, m float16 bits [n, k/32], q [n, k/32, 32]; q8_0 has no m (NULL).
int msd_pack_q4_1(const uint16_t* d, const uint16_t* m, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q4_1, true>(d, m, q, k, n, out, sizeof(PackedQ4_1));
}
int msd_pack_q8_0(const uint16_t* d, const uint16_t*, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q8_0, false>(d, nullptr, q, k, n, out, sizeof(PackedQ8_0));
}
int msd_pack_q4_1_i8(const uint16_t* d, const uint16_t* m, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q4_1_i8, true>(d, m, q, k, n, out, sizeof(PackedQ4_1));
}
int msd_pack_q8_0_i8(const uint16_t* d, const uint16_t*, const uint8_t* q, int64_t k, int64_t n, uint8_t* out) {
    return pack_blocks<place_q8_0_i8, false>(d, nullptr, q, k, n, out, sizeof(PackedQ8_0));
}
// Float weights W [k, n] (row stride ws) quantised to Q8_0 as llama.cpp quantises (pack.h), packed as q8_0_i8's blocks.
int msd_pack_q8_0_quant(const float* w, int64_t k, int64_t n, int64_t ws, uint8_t* out) {
    return pack_quantised_q8_0(w, k, n, ws, out);
}

// y[m, n] (row stride ys) = x[m, k] (row stride xs) @ W packed in `fmt` (formats.h). 0, or 1 on refused arguments.
int msd_linear(int32_t fmt, const float* x, int64_t m, int64_t k, int64_t xs, const void* w, int64_t n, float* y,
               int64_t ys) {
    return linear_any(fmt, x, m, k, xs, w, n, y, ys);
}

// y[m, n] = each row of x [m, n] RMS-normalised with `gain` (layer.h's rms_norm_row: the final norm of a model).
int msd_rms_norm(const float* x, int64_t m, int64_t n, const float* gain, float eps, float* y) {
    if (!x || !gain || !y || m < 1 || n < 1) return 1;
    for (int64_t r = 0; r < m; r++) rms_norm_row(x + r * n, gain, n, eps, y + r * n);
    return 0;
}

int msd_layer_forward(const msd_layer* L, float* x, int64_t t, const float* cos, const float* sin, float* kc, float* vc,
                      int64_t cap, int64_t start) {
    return layer_forward(L, x, t, cos, sin, kc, vc, cap, start);
}

double msd_stream_read(const float* p, int64_t n) { return stream_read(p, n, false); }
double msd_stream_read_par(const float* p, int64_t n) { return stream_read(p, n, true); }

}  // extern "C"
