// The calling thread's pool: workers that help with a job and sleep when idle. A call's panels (a layer's attention
// heads) are claimed in chunks by the pool's threads; every output is still one thread's one chain, so the bits do
// not depend on the thread count or on who ran what.
#pragma once

constexpr int MAX_THREADS = 64;
constexpr auto SPIN = std::chrono::microseconds(100);  // an idle worker spins this long before it sleeps

struct Pool {
    using Fn = void (*)(void*, int);
    std::vector<std::thread> workers;
    std::atomic<uint32_t> gen{0};     // bumped once per job
    std::atomic<int> sleepers{0};     // workers asleep on gen (a job wakes them only when some are)
    std::atomic<bool> open{false};    // the current job still takes helpers
    std::atomic<int> inflight{0};     // workers inside the current job
    std::atomic<bool> quit{false};
    Fn fn = nullptr;
    void* ctx = nullptr;
    int active = 1;                   // threads a job uses, the caller included

    // A worker joins a job only while it is open, and the caller waits only for the workers inside it: one that
    // the OS has not scheduled yet costs nothing (the work is claimed in chunks by whoever runs: parallel_for).
    void work(int tid, uint32_t seen) {  // seen: the job count when this worker was made (it runs only later jobs)
        for (;;) {
            auto t0 = std::chrono::steady_clock::now();
            uint32_t g;
            for (int spins = 0; (g = gen.load(std::memory_order_acquire)) == seen; spins++) {
                cpu_relax();
                if ((spins & 255) == 255 && std::chrono::steady_clock::now() - t0 > SPIN) {
                    sleepers.fetch_add(1);
                    gen.wait(seen);
                    sleepers.fetch_sub(1);
                    t0 = std::chrono::steady_clock::now();
                }
            }
            seen = g;
            if (quit.load(std::memory_order_acquire)) return;
            inflight.fetch_add(1);  // seq_cst with `open`: the caller either sees this worker inside or it backs out
            if (open.load() && tid < active) fn(ctx, tid);
            inflight.fetch_sub(1);
        }
    }

    void run(Fn f, void* c, int threads) {  // f(c, tid) on this thread (tid 0) and on the workers that come in time
        fn = f, ctx = c, active = threads;
        open.store(true);
        gen.fetch_add(1);
        if (sleepers.load() > 0) gen.notify_all();
        f(c, 0);
        open.store(false);
        while (inflight.load() != 0) cpu_relax();
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
        gen.fetch_add(1);
        gen.notify_all();
        for (auto& t : workers) t.join();
    }
};

thread_local Pool tl_pool;

// f(lo, hi, tid) over [0, units), in chunks claimed by whichever of the calling thread's pool's threads is running
// (on this thread alone when the pool has one thread or there is one unit): a thread the OS deschedules delays only
// the chunk it holds. Every unit is one thread's whole work, so the bits never depend on who ran it.
template <typename F>
static void parallel_for(int64_t units, F&& f) {
    int threads = (int)(tl_pool.active < units ? tl_pool.active : units);
    if (threads <= 1) { f((int64_t)0, units, 0); return; }
    struct Ctx { F* f; int64_t units, chunk; std::atomic<int64_t> next{0}; } ctx;
    ctx.f = &f, ctx.units = units, ctx.chunk = (units + 8 * threads - 1) / (8 * threads);
    tl_pool.run([](void* c, int tid) {
        auto* k = (Ctx*)c;
        for (int64_t lo; (lo = k->next.fetch_add(k->chunk)) < k->units;)
            (*k->f)(lo, lo + k->chunk < k->units ? lo + k->chunk : k->units, tid);
    }, &ctx, threads);
}

// f(r) for every row r < t of `width` values each: on the pool's threads like parallel_for's units where the call
// holds at least ROW_WORK values, else here (a window's rows cost less than waking the workers). Row-wise work: each
// row's result depends on that row alone, so never on who ran it.
constexpr int64_t ROW_WORK = 1 << 16;
template <typename F>
static void each_row(int64_t t, int64_t width, F&& f) {
    if (t * width < ROW_WORK) { for (int64_t r = 0; r < t; r++) f(r); return; }
    parallel_for(t, [&](int64_t lo, int64_t hi, int) { for (int64_t r = lo; r < hi; r++) f(r); });
}

// Every panel once, the panels split between the pool's threads; within a panel, the rows GROUP at a time (the panel
// stays in L1/L2 for the next group). blocks[R − 1] computes R rows; panel_bytes: one panel's packed bytes.
template <typename X, typename W>
static void run_panels(const Block<X, W>* blocks, const X* x, int64_t m, int64_t xs, const W* w, int64_t kk,
                       int64_t panel_bytes, float* y, int64_t ys, int64_t n) {
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
