// One Llama-family decoder layer over T new rows, every row computed alone. The layer's own arithmetic (norms, RoPE,
// attention, SiLU) runs row by row with fixed orders written for 16 lanes (simd.h), and its linear maps are the
// kernels above, so a row's output depends only on its own input and the cache entries before it (an AR step and a
// window give every position the same bits without any row plan), and is the same on every variant.
#pragma once

struct msd_layer {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    int32_t fmt[4];                   // each map's Format (formats.h): q|k|v, o, gate|up, down
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

static int linear(int32_t fmt, const float* x, int64_t m, int64_t k, const void* w, int64_t n, float* y);

// y = gain · (x / sqrt(mean(x²) + eps)) over n values (LlamaRMSNorm's order: normalise, then the gain); the squares
// summed in 16 lanes (i mod 16), the lanes then in order, the tail last.
static void rms_norm_row(const float* x, const float* gain, int64_t n, float eps, float* y) {
    float lanes[VL] = {0};
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        for (int l = 0; l < VL; l++) lanes[l] += x[i + l] * x[i + l];
    float ss = 0.0f;
    for (int l = 0; l < VL; l++) ss += lanes[l];
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t j = 0; j < n; j++) y[j] = gain[j] * (x[j] * inv);
}

// act[j] = silu(g[j]) · u[j] over n values, 16 at a time (the tail through the same lanes)
static void silu_mul(const float* g, const float* u, int64_t n, float* act) {
    int64_t j = 0;
    for (; j + VL <= n; j += VL) vstore(act + j, vsilu_mul(vloadu(g + j), vloadu(u + j)));
    if (j < n) {
        alignas(64) float gt[VL] = {0}, ut[VL] = {0};
        memcpy(gt, g + j, sizeof(float) * (n - j));
        memcpy(ut, u + j, sizeof(float) * (n - j));
        vstore_cols(act + j, vsilu_mul(vloadu(gt), vloadu(ut)), n - j);
    }
}

static float dot(const float* a, const float* b, int64_t n) {  // one FMA chain per lane, then hsum, then the tail
    vf acc = vzero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc = vfma(vloadu(a + i), vloadu(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// w_a[j] = dot(q_a, k_j)·scale for Q queries and j < n: where d is a multiple of 16, 16 keys at a time (each key's
// lane chains, and hsum16's tree, are dot's pair for pair; the 16 keys stay in L1 for the Q queries), the rest key by
// key.
template <int Q>
static void scores(const float* const q[Q], const float* keys, int64_t n, int64_t d, float scale, float* const w[Q]) {
    int64_t j = 0;
    for (; d % VL == 0 && j + VL <= n; j += VL)
        for (int a = 0; a < Q; a++) {
            vf acc[VL];
            for (int t = 0; t < VL; t++) acc[t] = vzero();
            for (int64_t i = 0; i < d; i += VL) {
                const vf qi = vloadu(q[a] + i);
                for (int t = 0; t < VL; t++) acc[t] = vfma(qi, vloadu(keys + (j + t) * d + i), acc[t]);
            }
            vstore(w[a] + j, vmul(hsum16(acc), vbcast(scale)));
        }
    for (; j < n; j++)
        for (int a = 0; a < Q; a++) w[a][j] = dot(q[a], keys + j * d, d) * scale;
}

// w[0..n) ← e^(w − max w) · (1 / Σ e), the product rounded once (a NaN never the max: vmax keeps its second operand).
static void softmax(float* w, int64_t n) {
    vf vmx = vbcast(-INFINITY);
    int64_t j = 0;
    for (; j + VL <= n; j += VL) vmx = vmax(vloadu(w + j), vmx);
    float mx = hmax(vmx);
    for (; j < n; j++) mx = w[j] > mx ? w[j] : mx;
    vf vsum = vzero();
    vmx = vbcast(mx);
    for (j = 0; j + VL <= n; j += VL) {
        vf e = vexp(vsub(vloadu(w + j), vmx));
        vstore(w + j, e);
        vsum = vadd(vsum, e);
    }
    alignas(64) float tail[VL];
    for (int l = 0; l < VL; l++) tail[l] = j + l < n ? w[j + l] - mx : -INFINITY;
    vf e = vexp(vloadu(tail));
    alignas(64) float el[VL];
    vstore(el, e);
    float sum = hsum(vsum);
    for (int l = 0; j + l < n; l++) sum += (w[j + l] = el[l]);
    const float inv = 1.0f / sum;
    for (j = 0; j + VL <= n; j += VL) vstore(w + j, vmul(vloadu(w + j), vbcast(inv)));
    for (; j < n; j++) w[j] = w[j] * inv;
}

// out_a[i] = Σ_k p_a[k]·v_k[i], k in order (each product rounded, then added), for Q queries and i in [i, d)
// in runs of V vectors held in registers over the keys (each value vector loaded once for the Q queries); returns
// where the runs stopped.
template <int Q, int V>
static int64_t weighted_sums(const float* const p[Q], const float* values, int64_t n, int64_t d, int64_t i,
                             float* const out[Q]) {
    for (; i + V * VL <= d; i += V * VL) {
        vf o[Q][V];
        for (int a = 0; a < Q; a++) for (int v = 0; v < V; v++) o[a][v] = vzero();
        for (int64_t k = 0; k < n; k++) {
            vf vk[V];
            for (int v = 0; v < V; v++) vk[v] = vloadu(values + k * d + i + v * VL);
            for (int a = 0; a < Q; a++) {
                const vf pk = vbcast(p[a][k]);
                for (int v = 0; v < V; v++) o[a][v] = vadd(o[a][v], vmul(pk, vk[v]));
            }
        }
        for (int a = 0; a < Q; a++) for (int v = 0; v < V; v++) vstore(out[a] + i + v * VL, o[a][v]);
    }
    return i;
}

// Q query heads that share one KV head, at one row over its n visible keys: out_a[D] = Σ_j softmax(q_a·k_j·scale)_j
// v_j, each head by its own steps (the same as alone); the keys and values are read once for the Q heads.
// q, out: the Q heads' D floats each, one after another; w: Q·n floats scratch.
template <int Q>
static void attend_heads(const float* q, const float* keys, const float* values, int64_t n, int64_t d, float scale,
                         float* w, float* out) {
    const float* qa[Q];
    float* wa[Q];
    float* oa[Q];
    for (int a = 0; a < Q; a++) qa[a] = q + a * d, wa[a] = w + a * n, oa[a] = out + a * d;
    scores<Q>(qa, keys, n, d, scale, wa);
    for (int a = 0; a < Q; a++) softmax(wa[a], n);
    int64_t i = weighted_sums<Q, 1>(wa, values, n, d, weighted_sums<Q, 4>(wa, values, n, d, 0, oa), oa);
    for (; i < d; i++)
        for (int a = 0; a < Q; a++) {
            oa[a][i] = 0.0f;
            for (int64_t k = 0; k < n; k++) oa[a][i] += wa[a][k] * values[k * d + i];
        }
}

constexpr int64_t HEADS_TOGETHER = 4;  // query heads of one KV head attended together (their accumulators fit)

static void attend(int64_t heads, const float* q, const float* keys, const float* values, int64_t n, int64_t d,
                   float scale, float* w, float* out) {
    switch (heads) {
    case 1: attend_heads<1>(q, keys, values, n, d, scale, w, out); break;
    case 2: attend_heads<2>(q, keys, values, n, d, scale, w, out); break;
    case 3: attend_heads<3>(q, keys, values, n, d, scale, w, out); break;
    default: attend_heads<4>(q, keys, values, n, d, scale, w, out);
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

// The attention half of a row: bias, q/k norms, RoPE, and the new keys and values into the cache.
static void qkv_row(const msd_layer* L, float* row, int64_t r, const float* cos, const float* sin, float* kc, float* vc,
                    int64_t cap, int64_t start) {
    const int64_t Hq = L->heads, Hkv = L->kv_heads, D = L->head_dim, nq = Hq * D, nkv = Hkv * D;
    if (L->b_qkv) for (int64_t j = 0; j < nq + 2 * nkv; j++) row[j] = row[j] + L->b_qkv[j];
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

// x [t, H] (in/out: the residual stream) through one layer at positions start..start+t−1; the layer's keys and
// values are written into kc/vc [Hkv, cap, D] at those positions, and row r attends to entries 0..start+r.
// cos/sin: [t, D]. Returns 0, or 1 on arguments it refuses.
static int layer_forward(const msd_layer* L, float* x, int64_t t, const float* cos, const float* sin, float* kc,
                         float* vc, int64_t cap, int64_t start) {
    if (!L || !x || !cos || !sin || !kc || !vc || t < 1 || start < 0 || start + t > cap) return 1;
    const int64_t H = L->hidden, Hq = L->heads, Hkv = L->kv_heads, D = L->head_dim, I = L->inter;
    if (H < 1 || Hq < 1 || Hkv < 1 || Hq % Hkv || D < 2 || D % 2 || D > 512 || I < 1) return 1;
    const int64_t nq = Hq * D, nkv = Hkv * D, nqkv = nq + 2 * nkv, rep = Hq / Hkv, keys = start + t;
    // scratch: kept between calls for windows (no allocation per step); a long prefill's is freed when it returns
    thread_local std::vector<float> kept;
    std::vector<float> once;
    const int64_t threads = tl_pool.active;
    size_t need = (size_t)(t * H + t * nqkv + t * nq + t * 2 * I + t * I + threads * HEADS_TOGETHER * keys);
    std::vector<float>& buf = need <= ((size_t)1 << 22) ? kept : once;
    if (buf.size() < need) buf.resize(need);
    float* xn = buf.data();            // [t, H]
    float* qkv = xn + t * H;           // [t, nqkv]
    float* att = qkv + t * nqkv;       // [t, nq]
    float* gu = att + t * nq;          // [t, 2I]
    float* act = gu + t * 2 * I;       // [t, I]
    float* w = act + t * I;            // [threads, 4, keys] attention weights of one row's heads, per thread

    each_row(t, H, [&](int64_t r) { rms_norm_row(x + r * H, L->ln1, H, L->eps, xn + r * H); });
    if (linear(L->fmt[0], xn, t, H, L->w_qkv, nqkv, qkv)) return 1;
    each_row(t, nqkv, [&](int64_t r) { qkv_row(L, qkv + r * nqkv, r, cos, sin, kc, vc, cap, start); });
    const int64_t parts = (rep + HEADS_TOGETHER - 1) / HEADS_TOGETHER;  // of each KV head's query heads
    parallel_for(t * Hkv * parts, [&](int64_t lo, int64_t hi, int tid) {  // (row, KV head, part) split between threads
        float* scratch = w + tid * HEADS_TOGETHER * keys;                   // this thread's own
        for (int64_t u = lo; u < hi; u++) {
            const int64_t r = u / (Hkv * parts), g = u / parts % Hkv, h = g * rep + u % parts * HEADS_TOGETHER;
            const int64_t n = start + r + 1;                                // row r sees entries 0..start+r
            const int64_t heads = g * rep + rep - h < HEADS_TOGETHER ? g * rep + rep - h : HEADS_TOGETHER;
            attend(heads, qkv + r * nqkv + h * D, kc + g * cap * D, vc + g * cap * D, n, D, L->scale, scratch,
                   att + r * nq + h * D);
        }
    });
    if (linear(L->fmt[1], att, t, nq, L->w_o, H, xn)) return 1;                    // xn ← o_proj(att)
    each_row(t, H, [&](int64_t r) {
        for (int64_t i = r * H; i < (r + 1) * H; i++) x[i] = x[i] + xn[i];
        rms_norm_row(x + r * H, L->ln2, H, L->eps, xn + r * H);
    });
    if (linear(L->fmt[2], xn, t, H, L->w_gate_up, 2 * I, gu)) return 1;
    each_row(t, I, [&](int64_t r) { silu_mul(gu + r * 2 * I, gu + r * 2 * I + I, I, act + r * I); });  // silu(gate)·up
    if (linear(L->fmt[3], act, t, I, L->w_down, H, xn)) return 1;
    each_row(t, H, [&](int64_t r) { for (int64_t i = r * H; i < (r + 1) * H; i++) x[i] = x[i] + xn[i]; });
    return 0;
}
