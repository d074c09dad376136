"""Per-lane dtype calibration: time this model's real forwards on this device in each dtype it can run, and
choose the fastest for the work the lane does. The result is cached per (machine, model shape, device, threads),
so the next load is instant; `--dtype` overrides it.

What a dtype means here: on the fast runners (runners/fast.py, fast_ss.py) it is the dtype of the layers'
linear-map weights, in which every matmul runs (set_dtypes); the residual stream, norms, attention, KV cache and
LM head keep the loaded dtype (float32 on a CPU), so the logits keep full precision. The generic runner (hf.py)
cannot split a model like that: it runs the whole model in the dtype it was loaded in, or in the forced one.

The target lane does one kind of work in a speculative run, a window of γ + 1 rows, and it must stay one
function (every decoder emits what AR emits), so it gets one dtype: the one whose window is fastest, after
runners/exactness.py (check_rows) has made that dtype's logits independent of the call's shape. The row plan found for
each dtype is cached with its timings and checked again at every load. The draft lane's numerics never change the
output, so it gets a dtype per shape: one for one-sequence forwards (a step), one for branch batches. The records
(Calibration, Timing) are mirror_core/records.py's.

Before anything is timed, a dtype whose matmul is far slower than the loaded one's on this device (bfloat16 on a
CPU without bf16 units: about 40x here) is screened out by one timed product of the model's widest layer, so no
load spends seconds timing and checking a dtype that cannot win.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import replace

import torch

from .. import machine
from ..config import DEFAULT_GAMMA, DEFAULT_KAPPA, MirrorError
from ..kernels.formats import BLOCK_FUNCTIONS, NEEDS, Q8_0
from ..kernels.native import FORMATS, INT8, STAND_INS, format_name, peak_gflops, read_bandwidth
from ..machine import cache_dir, cpu_flags, cpu_model
from ..records import LONG_ROWS, ROOFLINE_ROWS, Calibration, RowCheck, Timing
from .exactness import check_rows, probe_ids

DTYPES = {**FORMATS, **STAND_INS}  # the formats a lane may run, by name (torch.int8 stands for int8: a GGUF's own
#                                    blocks against int8 activations; torch.qint8 for q8_0: kernels/native.py)
PREFIX = 96                                              # tokens in the cache before each timed forward
WINDOW = DEFAULT_GAMMA + 1                               # the target's window at the default γ
BRANCH_ROWS = DEFAULT_KAPPA * (DEFAULT_GAMMA + 1)        # the draft's branch batch at the default κ, γ
MIN_ROUNDS, MAX_ROUNDS, BUDGET_S = 3, 15, 1.5            # timed rounds per dtype: at least 3, then until the budget
MARGIN = 0.05  # a lower precision than the loaded one is chosen only when it is this much faster (else: timing noise)
SCREEN = 2.0   # a dtype whose widest matmul takes this many times the loaded dtype's is not timed further
STALE = 1.2    # a cached one-token step this far from the load's fresh timing, either way, is timed again
CACHE_VERSION = 7


def candidates(runner) -> list[str]:
    """The dtypes worth timing for this runner on its device: the formats it offers (runners/protocol.py:
    WeightFormats; the fast runners keep the loaded weights as the master copy, so only formats of equal or lower
    precision), less the ones this device runs far slower than the loaded one. The exact kernel runs every format
    with float32 arithmetic; without it, CPUs get float16 only with fp16 matmul units (avx512_fp16, amx_fp16), and
    a CUDA device bfloat16 only where it supports it."""
    loaded, *others = [format_name(d) for d in runner.formats.offered]
    kind, slow = runner.device.type, set()
    if runner.kernel.library is None and kind == "cpu" and not {"avx512_fp16", "amx_fp16"} & set(cpu_flags()):
        slow.add("float16")
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        slow.add("bfloat16")
    return [loaded] + [n for n in others if n not in slow]


# Why the target's format is what it is when none is asked for (it is the pair's, the same on every machine, never
# the one that times fastest here: the function decides the text, docs/ALGORITHM.md "One function on every CPU").
PAIR_FORMAT_WHY = {
    True: "the pair's format: a GGUF target runs int8, what llama.cpp computes from the same file, reading the same "
          "bytes as float32 on its blocks with a quarter of the float work",
    False: "the pair's format: the target's own float32 weights (no GGUF blocks for int8)",
}
ASKED_WHY = "asked for by name (--dtype, or the page's Format)"  # why the target's format is one a caller named


def pair_format(runner) -> str:
    """The target's format when none is asked for: int8 where the kernel runs the target's own GGUF blocks (the
    function its GGUF was made for), else the loaded weights' own float format."""
    loaded, *others = runner.formats.offered
    return INT8 if runner.kernel.library is not None and torch.int8 in others else format_name(loaded)


def calibrate_target(runner, vocab_size: int, requested: str, config,
                     keep_loaded: bool = False, retime: bool = False) -> tuple[Calibration, RowCheck]:
    """Set the target's format (the pair's own for auto: pair_format), made one function by its row plan, and return
    its calibration and call-shape check; `keep_loaded`: the runner keeps its loaded weights, so that another format
    can be set later on the loaded pair (LaneConfig.keep_formats); `retime`: time it again though the cache holds its
    table (a stale one: cached_step_is_stale), the cached call-shape checks kept."""
    if requested in BLOCK_FUNCTIONS and DTYPES[requested] not in runner.formats.offered:
        raise MirrorError(f"--dtype {NEEDS[requested]}; this target " + (
            "has none (a prepared registry model keeps its GGUF; python -m mirror_core prepare adds it)"
            if requested == INT8 else f"runs on {runner.kernel.name} ({runner.kernel.reason or 'its maps do not fit'})"))
    if runner.formats.whole_model:
        return calibrate_generic(runner, "target", requested), check_rows(runner, vocab_size)
    chosen = pair_format(runner) if requested == "auto" else requested
    names = [chosen]
    prefix, ids = _probe(runner, WINDOW)
    shapes = {"step": lambda c: runner.forward(c, ids[:1]), "window": lambda c: runner.forward(c, ids)}
    path = _cache_path(runner, "target", names, list(shapes), config)
    cached = _read(path, "target", names, list(shapes))
    known = dict(cached.exact) if cached is not None else {}
    cal = None if retime else cached
    checks: dict[str, RowCheck] = {}

    def prepare(name: str) -> None:
        runner.set_dtypes(DTYPES[name])
        if name not in checks:
            checks[name] = check_rows(runner, vocab_size, known.get(name))
        runner.row_plan = checks[name].plan

    if cal is None:
        cal = _time(runner, "target", requested, names, WINDOW, shapes, prepare, prefix)
    choice = chosen
    prepare(choice)
    cal = replace(cal, requested=requested, sequence=choice, rows=choice, exact=tuple({**known, **checks}.items()),
                  note=ASKED_WHY if requested != "auto" else PAIR_FORMAT_WHY[choice == INT8])
    fresh = not cal.rows_ms(choice)
    if fresh:  # the roofline's figures for the chosen dtype (records.Roofline), once per machine and model shape
        cal = _time_rows(runner, cal, choice)
    if fresh or not cal.cached or checks[choice].source == "measured":  # new timings, or a cached plan that failed
        _write(path, cal)
    runner.drop_unused_dtypes(keep_loaded)
    return cal, checks[choice]


def cached_step_is_stale(cal: Calibration, step_now_ms: float) -> bool:
    """Whether a cached table's one-token step (either of its timings) lies more than STALE from the step timed just
    now on the same cores (the cache was written while another process held a core, or the machine has changed speed
    since): every row count and the chooser's costs are read from that table, so it is timed again."""
    if not (cal.cached and step_now_ms):
        return False
    cached = [ms for shape in ("step", "rows1") if (ms := cal.ms(cal.sequence, shape))]  # two timings of one step
    return any(not 1 / STALE <= ms / step_now_ms <= STALE for ms in cached)


def calibrate_draft(runner, requested: str, config) -> Calibration:
    """Choose the draft's dtype per shape (its fastest step and its fastest branch rollout) and set them."""
    if requested in BLOCK_FUNCTIONS and DTYPES[requested] not in runner.formats.offered:
        requested = "auto"  # --dtype int8 is the target's (blocks only); the draft keeps its own choice
    if runner.formats.whole_model:
        return calibrate_generic(runner, "draft", requested)
    names = candidates(runner) if requested == "auto" else [requested]
    width = 1 + runner.num_streams  # an SS draft feeds its token and its lookahead together
    prefix, ids = _probe(runner, width + WINDOW)

    def rows(c):  # one branch rollout: κ(γ + 1) rows, γ tokens deep
        tokens = torch.full((BRANCH_ROWS, width), ids[-1], dtype=torch.long)               # [R, 1 + n]
        branches = runner.fork(c, [max(1, len(prefix) - r % 4) for r in range(BRANCH_ROWS)])
        for _ in range(WINDOW - 1):
            runner.forward_rows(branches, tokens)

    shapes = {"step": lambda c: runner.forward(c, ids[:width]), "rows": rows}
    path = _cache_path(runner, "draft", names, list(shapes), config)
    cal = _read(path, "draft", names, list(shapes))
    if cal is None:
        cal = _time(runner, "draft", requested, names, BRANCH_ROWS, shapes, lambda n: runner.set_dtypes(DTYPES[n]),
                    prefix)
        _write(path, cal)
    if requested == "auto":
        best = {s: _fastest(cal, cal.timed(names), s) for s in shapes}
        cal = replace(cal, sequence=best["step"], rows=best["rows"], note="fastest step and fastest branch rollout")
    else:
        cal = replace(cal, sequence=requested, rows=requested, note="forced by --dtype")
    runner.set_dtypes(DTYPES[cal.sequence], DTYPES[cal.rows])
    runner.drop_unused_dtypes()
    return replace(cal, requested=requested)


# Why a feature-reading draft runs q8_0 where the kernel runs it (its format is the pair's, the same on every CPU kind)
DRAFT_FORMAT_WHY = ("the pair's draft format: int8 activations on Q8_0 blocks quantised from the draft's stored "
                    "weights, the same on every CPU the kernel runs on")


def draft_format(runner) -> str | None:
    """A feature-reading draft's format when none is asked for: q8_0 where the kernel runs it (the pair's, on every
    CPU kind), else None (the fastest format here, timed)."""
    return Q8_0 if DTYPES[Q8_0] in runner.formats.offered else None


def calibrate_feature_draft(runner, requested: str) -> Calibration:
    """A feature-reading draft (runners/feature.py) runs in one format: the pair's (draft_format) where the kernel
    runs, else the one whose one-token step plus branch rollout (κ(γ + 1) rows, γ deep) is fastest here; either is
    timed after PREFIX cached entries with random features (the latency model reads it). Not cached: the draft is
    small, this takes well under a second."""
    if requested in BLOCK_FUNCTIONS and DTYPES[requested] not in runner.formats.offered:
        requested = "auto"  # int8 is a GGUF target's own blocks, and q8_0 needs the kernel
    own = draft_format(runner) if requested == "auto" else None
    names = [own] if own else candidates(runner) if requested == "auto" else [requested]
    t0 = time.perf_counter()
    shapes, prefix, feats = _feature_shapes(runner)
    samples: dict[tuple[str, str], list[float]] = {(n, s): [] for n in names for s in shapes}
    for name in names:
        runner.set_dtypes(DTYPES[name])
        cache = runner.new_cache()
        runner.forward(cache, prefix, feats)
        for rnd in range(MIN_ROUNDS + 3):  # round 0 warms the kernels up and is not kept
            _time_shapes(runner, shapes, cache, len(prefix), {s: samples[name, s] for s in shapes} if rnd else None)
    cal = Calibration("draft", requested, names[0], names[0], _table(samples),
                      seconds=round(time.perf_counter() - t0, 2))
    total = {n: cal.ms(n, "step") * WINDOW + cal.ms(n, "rows") for n in names}   # a fresh rollout + a branch batch
    best = min(names, key=total.get)
    best = best if total[best] < (1 - MARGIN) * total[names[0]] else names[0]
    runner.set_dtypes(DTYPES[best])
    note = ("forced by --dtype" if requested != "auto" else DRAFT_FORMAT_WHY if own
            else "fastest γ+1 steps plus a branch rollout (one dtype)")
    return replace(cal, sequence=best, rows=best, note=note)


def _feature_shapes(runner) -> tuple[dict, list[int], torch.Tensor]:
    """A feature-reading draft's timed shapes (a one-token step; a branch rollout of κ(γ + 1) rows, γ deep), the
    cached prefix and its random features [PREFIX, H]."""
    g = torch.Generator().manual_seed(0)
    prefix, ids = _probe(runner, WINDOW)
    feats = torch.randn(len(prefix), runner.cfg.hidden_size, generator=g)
    one = feats[:1]

    def rows(c):
        branches = runner.fork(c, [max(1, len(prefix) - r % 4) for r in range(BRANCH_ROWS)])
        tokens, f = torch.full((BRANCH_ROWS,), ids[-1], dtype=torch.long), one.expand(BRANCH_ROWS, -1)
        for _ in range(WINDOW - 1):
            _, f = runner.forward_rows(branches, tokens, f)

    return {"step": lambda c: runner.forward(c, ids[:1], one), "rows": rows}, prefix, feats


def step_ms(runner, rounds: int = 12) -> float:
    """The runner's median one-token step after the cached probe prefix, on the calling thread's cores (ms): the
    calibration's own timing round, not cached (the engine times the target on its lane and on every core with it)."""
    prefix, ids = _probe(runner, 1)
    times = _rounds(runner, prefix, {"step": lambda c: runner.forward(c, ids)}, rounds, warmup=2)["step"]
    return round(1e3 * statistics.median(times), 2)


def _rounds(runner, prefix: list[int], shapes: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of each shape's forward after the cached prefix, over `rounds` rounds after `warmup` untimed ones."""
    cache = runner.new_cache()
    runner.forward(cache, prefix)
    times: dict[str, list[float]] = {s: [] for s in shapes}
    for rnd in range(warmup + rounds):
        _time_shapes(runner, shapes, cache, len(prefix), times if rnd >= warmup else None)
    return times


def _time_rows(runner, cal: Calibration, dtype: str) -> Calibration:
    """cal with the target's forward of 1..ROOFLINE_ROWS new rows timed in `dtype` (already set on the runner) after
    the probe prefix, and one core's read bandwidth (GB/s), both on the calling thread's cores."""
    t0 = time.perf_counter()
    prefix, ids = _probe(runner, max(LONG_ROWS))
    shapes = {f"rows{m}": (lambda c, m=m: runner.forward(c, ids[:m])) for m in (*range(1, ROOFLINE_ROWS + 1), *LONG_ROWS)}
    times = _rounds(runner, prefix, shapes, 2 * MIN_ROUNDS, warmup=1)
    kernel, cpu = runner.kernel.library, runner.device.type == "cpu"
    gbs = lane_read_gbs(runner) if cpu else 0.0
    peak = peak_gflops(kernel, dtype) if cpu else 0.0
    return replace(cal, table=cal.table + _table({(dtype, s): v for s, v in times.items()}), read_gbs=gbs,
                   peak_gflops=peak, seconds=round(cal.seconds + time.perf_counter() - t0, 2))


def lane_read_gbs(runner) -> float:
    """GB/s the calling thread's cores read together: with the kernel, its pool's threads splitting one stream;
    else torch's sum on the calling thread's torch threads."""
    kernel = runner.kernel.library
    return read_bandwidth(kernel, pool=True) if kernel is not None else read_bandwidth(None)


def _probe(runner, new: int) -> tuple[list[int], list[int]]:
    """A cached prefix (PREFIX tokens, fewer where the context is short) and `new` token ids after it, all inside
    the model's vocabulary and context."""
    context = runner.max_positions or PREFIX + 2 * new
    length = max(1, min(PREFIX, context - 2 * new))
    return probe_ids(runner.vocab_size, length, 7, 3), probe_ids(runner.vocab_size, new, 1, 5)


def _screen(runner, names: list[str], rows: int) -> list[str]:
    """The dtypes worth timing: the loaded one, and each other whose product of `rows` rows with the model's widest
    linear map takes less than SCREEN times the loaded dtype's (median of 3, after a warm-up)."""
    if len(names) == 1 or runner.kernel.library is not None:  # the kernel's formats all stream fast
        return names
    w = runner.layers[0].w_gate_up                                                        # [H, 2·I]
    x = torch.randn(rows, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.device)

    def ms(name: str) -> float:
        wd, xd = w.to(DTYPES[name]), x.to(DTYPES[name])
        samples = []
        for r in range(4):
            machine.synchronize(runner.device)
            t0 = time.perf_counter()
            xd @ wd
            machine.synchronize(runner.device)
            if r:
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    base = ms(names[0])
    return [names[0]] + [n for n in names[1:] if ms(n) < SCREEN * base]


def _fastest(cal: Calibration, names: list[str], shape: str) -> str:
    """The fastest dtype for a shape; the first (loaded) one unless another beats it by MARGIN."""
    best = min(names, key=lambda n: cal.ms(n, shape))
    return best if cal.ms(best, shape) < (1 - MARGIN) * cal.ms(names[0], shape) else names[0]


def calibrate_generic(runner, lane: str, requested: str) -> Calibration:
    """The generic runner: the whole model in one dtype (forced ones are applied here, auto keeps the loaded)."""
    if requested != "auto":
        runner.set_dtypes(DTYPES[requested])
    name = format_name(runner.dtype)
    return Calibration(lane, requested, name, name,
                       note="forced by --dtype" if requested != "auto" else "generic runner: the loaded dtype, not timed")


def _time(runner, lane: str, requested: str, candidates: list[str], rows: int, shapes: dict, prepare,
          prefix: list[int]) -> Calibration:
    """Screen the candidates (_screen, with `rows` rows), then time the rest × shapes on this runner: rounds of
    every (dtype, shape), at least MIN_ROUNDS, then until the budget; each forward after the same cached prefix."""
    t0 = time.perf_counter()
    names = _screen(runner, candidates, rows)
    cache = runner.new_cache()
    runner.forward(cache, prefix)
    samples: dict[tuple[str, str], list[float]] = {(n, s): [] for n in names for s in shapes}
    for rnd in range(MAX_ROUNDS + 1):  # round 0 warms every kernel up and is not kept
        for name in names:
            prepare(name)
            _time_shapes(runner, shapes, cache, len(prefix), {s: samples[name, s] for s in shapes} if rnd else None)
        if rnd >= MIN_ROUNDS and time.perf_counter() - t0 > BUDGET_S:
            break
    return Calibration(lane, requested, names[0], names[0], _table(samples), seconds=round(time.perf_counter() - t0, 2),
                       screened=tuple(n for n in candidates if n not in names))


def _time_shapes(runner, shapes: dict, cache, keep: int, into: dict[str, list[float]] | None) -> None:
    """One round: each shape's forward once after the cached prefix (`keep` tokens), its seconds appended to
    into[shape] (None: a warm-up round, not kept)."""
    for shape, run in shapes.items():
        machine.synchronize(runner.device)
        start = time.perf_counter()
        run(cache)
        machine.synchronize(runner.device)
        if into is not None:
            into[shape].append(time.perf_counter() - start)
        runner.truncate(cache, keep)


def _table(samples: dict[tuple[str, str], list[float]]) -> tuple[Timing, ...]:
    return tuple(Timing(n, s, round(1e3 * statistics.median(v), 3)) for (n, s), v in samples.items())


def _cache_path(runner, lane: str, names: list[str], shapes: list[str], config) -> str:
    """Where this machine keeps the timing table (and row plans) for this model shape, lane and dtypes."""
    return os.path.join(cache_dir("calibration"), _cache_key(runner, lane, names, shapes, config) + ".json")


def _cache_key(runner, lane: str, names: list[str], shapes: list[str], config) -> str:
    """What the timings depend on: the machine, torch, the device, the lane's threads, the runner and the
    model's shapes (its config; the weights' values do not change a forward's time)."""
    device = str(runner.device) + ("" if runner.device.type == "cpu" else " " + machine.describe(str(runner.device)))
    kernel = runner.kernel.library
    ident = {"v": CACHE_VERSION, "cpu": cpu_model(), "torch": torch.__version__, "device": device,
             "threads": torch.get_num_threads(), "runner": type(runner).__name__, "lane": lane, "dtypes": names,
             "kernel": os.path.basename(kernel.build.path) if kernel is not None else "torch",
             "kernel_threads": kernel.threads if kernel is not None else 0, "storage": list(runner.formats.blocks),
             "shapes": shapes, "prefix": PREFIX, "window": WINDOW, "branch_rows": BRANCH_ROWS,
             "config": config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def _read(path: str, lane: str, names: list[str], shapes: list[str]) -> Calibration | None:
    """A cached table that covers every (dtype, shape) asked for; anything unreadable counts as no cache."""
    try:
        with open(path, encoding="utf-8") as f:
            cal = Calibration.from_json(f.read())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if cal.lane != lane or any(cal.ms(n, s) is None for n in cal.timed(names) for s in shapes):
        return None
    return replace(cal, cached=True, seconds=0.0)


def _write(path: str, cal: Calibration) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(cal.to_json())
        os.replace(tmp, path)  # atomic: two lanes calibrating at once never leave half a file
    except OSError:
        pass  # a read-only cache only costs the next load its calibration


