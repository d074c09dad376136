// The read bandwidth the kernel's own loads reach here (the denominator of a step's roofline).
#pragma once

// Sum n floats (64-byte aligned, n a multiple of 4·VL) with four independent vector accumulators, the way the
// kernel streams its panels. The sum is returned so the loop stays.
static double stream_sum(const float* p, int64_t n) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t i = 0; i < n; i += 4 * VL) {
        a0 = vadd(vload(p + i), a0);
        a1 = vadd(vload(p + i + VL), a1);
        a2 = vadd(vload(p + i + 2 * VL), a2);
        a3 = vadd(vload(p + i + 3 * VL), a3);
    }
    return (double)hsum(a0) + hsum(a1) + hsum(a2) + hsum(a3);
}

// On the calling thread alone, or split between its pool's threads (the whole lane's, or machine's, bandwidth).
static double stream_read(const float* p, int64_t n, bool pool) {
    if (!p || n < 4 * VL || n % (4 * VL) || ((uintptr_t)p % 64) != 0) return -1.0;
    if (!pool) return stream_sum(p, n);
    double parts[MAX_THREADS] = {0};
    const int64_t chunks = n / (4 * VL);
    parallel_for(chunks, [&](int64_t lo, int64_t hi, int tid) { parts[tid] += stream_sum(p + lo * 4 * VL, (hi - lo) * 4 * VL); });
    double s = 0.0;
    for (double v : parts) s += v;
    return s;
}
