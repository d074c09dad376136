"""Bench rows: one BenchRow per (prompt, decoder, setting), and what needs several rows (derive, entries).

The harness builds each row from its timed runs; `derive` then fills the fields that need the
same prompt's `ar` / `ar_all` rows. `BenchRow.to_dict` is the row as the JSON report and the CSV
write it ("mirror-sd-bench/6"); the report, the HTML page and scripts/gpu_bench.py read attributes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..latency import LatencyModel, physical_bound
from ..metrics import RunSummary

BASELINES = ("ar", "ar_all")       # the target-only decoders; the faster over the suite is the baseline
# the engine's speculative decoders (bench/config.py: *_model = the context draft off): the physical bound applies
SPECULATIVE = ("sd", "mirror", "sd_model", "mirror_model", "sd_raw", "mirror_raw")
RUN_METRICS = ("tau", "acceptance_rate", "hit_rate", "fallback_frequency", "draft_hidden_fraction",
               "draft_tokens_per_forward", "steps", "by_source", "ttft_s")  # BenchRow fields from the RunSummary


@dataclass(frozen=True)
class ModelMs:
    """The latency model's terms for one mirror run (docs/ALGORITHM.md §4), in ms: means over steps ≥ 1."""

    t_pre: float            # target layers 1..ℓ_e
    t_rv_ee: float          # early-exit readout + sending top-κ
    delta: float            # Δ: target layers ℓ_e+1..N
    t_branch: float         # the draft's branch batch
    t_rv_fv: float          # acceptance + adopting a branch
    t_fresh: float          # a fresh γ-token rollout
    measured_step: float    # the run's measured mean step
    t_mirror: float         # modelled: T_pre + T_rv^ee + max(Δ, T_branch) + T_rv^fv
    expected_step: float    # modelled: E[T_step] = T_Mirror + FF·T_fresh

    @classmethod
    def of(cls, model: LatencyModel) -> ModelMs:
        return cls(*(1e3 * v for v in (model.t_pre, model.t_rv_ee, model.delta, model.t_branch, model.t_rv_fv,
                                       model.t_fresh, model.measured_step, model.t_mirror, model.expected_step)))


@dataclass(frozen=True)
class BenchRow:
    """One (prompt, decoder, setting): medians over its repeats; field order = the JSON keys' order."""

    prompt: str                            # the prompt's question_id
    category: str                          # the prompt's Spec-Bench category
    decoder: str                           # bench decoder name (bench/config.py BENCH_DECODERS)
    setting: str                           # "γ=4 κ=2 ℓe=3 B=6": the settings this decoder uses ("" for ar)
    dtype: str                             # the --dtype the pair was loaded with ("auto": calibrated per lane)
    gamma: int | None                      # γ (None: the decoder drafts nothing)
    kappa: int | None                      # κ (mirror only)
    exit_layer: int | None                 # ℓ_e (mirror only)
    branch_budget: int | None              # branch rows per step (mirror only; 0 = all, -1 = auto)
    new_tokens: int                        # new tokens of the median-wall run
    wall_s: float                          # median wall time over repeats (s)
    wall_s_min: float                      # fastest repeat (s)
    wall_s_max: float                      # slowest repeat (s)
    tokens_per_s: float                    # new_tokens / wall_s
    repeats: int                           # timed runs behind the medians
    timed_by: str                          # "engine spans" or "perf_counter around generate()" (the peers)
    tau: float | None                      # RunSummary.tau of the median-wall run (None for the peers)
    acceptance_rate: float | None          # RunSummary.acceptance_rate
    hit_rate: float | None                 # RunSummary.hit_rate
    fallback_frequency: float | None       # RunSummary.fallback_frequency
    draft_hidden_fraction: float | None    # RunSummary.draft_hidden_fraction
    draft_tokens_per_forward: float | None  # RunSummary.draft_tokens_per_forward
    steps: int | None                      # RunSummary.steps: verification passes after the prefill
    by_source: dict | None                 # RunSummary.by_source: per window source (model, branch, context): steps,
    #                                        proposed, accepted, acceptance, mean accepted run
    ttft_s: float | None                   # RunSummary.ttft_s of the median-wall run: its prefill (the peers: None)
    t_ar_ms: float | None                  # T_AR: median target-only step (ms; ar, ar_all; llama.cpp: between tokens)
    t_verify_ms: float | None              # T_verify: median verification pass (ms; sd and mirror)
    step_ms: float | None                  # median measured step (ms)
    hidden_bound_ms: float | None          # mirror: verification + acceptance + fastest draft reply (ms)
    model_ms: ModelMs | None               # mirror: the latency model's terms (ms)
    fallback: str | None                   # the engine's explicit fallback note, if any
    token_ids: tuple[int, ...]             # new token ids of the median-wall run
    phases_ms: dict | None = None          # the median-wall run's mean step by phase (phases.StepPhases.to_dict: ms,
    #                                        the rest named, adding up to the step; the wait split into the draft's
    #                                        rollouts and messages; None for the peers)
    # -- filled by derive(), from the same prompt's ar / ar_all rows --
    equal_to_ar: bool | None = None        # same new ids as ar (None: this is ar, ar did not run, or llama.cpp)
    agreement_with_ar: float | None = None  # the common prefix with ar's new ids, as a share of ar's (None: as above
    #                                         but llama.cpp, whose tokens may differ: another function)
    speedup_vs_ar: float | None = None     # per-token time of ar / of this row
    speedup_vs_ar_all: float | None = None  # per-token time of ar_all / of this row
    speedup_vs_baseline: float | None = None  # per-token time of the baseline / of this row
    decode_speedup_vs_baseline: float | None = None  # the same after the first token: (wall − TTFT) / (tokens − 1) of
    #                                                  the baseline over this row's (the part speculation speeds up)
    bound: float | None = None             # sd, mirror: τ·T_AR/T_verify (latency.physical_bound)
    predicted_speedup_vs_ar: float | None = None  # mirror: τ·T_AR/E[T_step] (modelled, not measured)

    def to_dict(self) -> dict:
        """The row as JSON and CSV hold it (model_ms a dict, token_ids a list)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["model_ms"] = None if self.model_ms is None else asdict(self.model_ms)
        out["token_ids"] = list(self.token_ids)
        return out


def run_metrics(summary: RunSummary | None) -> dict:
    """The RUN_METRICS of one run, read from its RunSummary (docs/ALGORITHM.md §8); all None for the peers."""
    return {k: None if summary is None else getattr(summary, k) for k in RUN_METRICS}


def derive(rows: list[BenchRow]) -> list[BenchRow]:
    """Fill what needs the same prompt's ar rows (at the same --dtype): equality, speedups, the bound and the
    model's prediction; speedup_vs_baseline is over the fastest baseline at any dtype."""
    by = {(r.prompt, r.dtype, r.decoder): r for r in rows if r.decoder in BASELINES}
    base = _baseline(rows)
    return [_derived(r, by.get((r.prompt, r.dtype, "ar")), by.get((r.prompt, r.dtype, "ar_all")),
                     by.get((r.prompt, *base)) if base else None) for r in rows]


def _derived(r: BenchRow, ar: BenchRow | None, ar_all: BenchRow | None, baseline: BenchRow | None) -> BenchRow:
    t_ar = ar.t_ar_ms if ar else None
    other_function = r.decoder.startswith("llama_cpp")
    return replace(
        r, equal_to_ar=None if ar is None or r.decoder == "ar" or other_function else r.token_ids == ar.token_ids,
        agreement_with_ar=None if ar is None or r.decoder == "ar" else _agreement(r.token_ids, ar.token_ids),
        speedup_vs_ar=_speedup(ar, r), speedup_vs_ar_all=_speedup(ar_all, r), speedup_vs_baseline=_speedup(baseline, r),
        decode_speedup_vs_baseline=_decode_speedup(baseline, r),
        bound=physical_bound(r.tau, t_ar, r.t_verify_ms) if r.decoder in SPECULATIVE else None,
        predicted_speedup_vs_ar=r.tau * t_ar / r.model_ms.expected_step if r.model_ms and t_ar else None)


def _agreement(mine: tuple[int, ...], ar: tuple[int, ...]) -> float:
    """The common prefix of two token sequences as a share of ar's length."""
    same = next((i for i, (a, b) in enumerate(zip(mine, ar)) if a != b), min(len(mine), len(ar)))
    return round(same / max(1, len(ar)), 3)


def baseline_decoder(rows: list[BenchRow]) -> str | None:
    """The faster of ar and ar_all (at the faster --dtype, named when several ran): the lower sum of per-prompt
    median wall times."""
    base = _baseline(rows)
    if base is None:
        return None
    return f"{base[1]} [{base[0]}]" if len({r.dtype for r in rows}) > 1 else base[1]


def _baseline(rows: list[BenchRow]) -> tuple[str, str] | None:
    """(dtype, decoder) of the baseline rows."""
    totals: dict[tuple[str, str], float] = {}
    for r in rows:
        if r.decoder in BASELINES:
            totals[r.dtype, r.decoder] = totals.get((r.dtype, r.decoder), 0.0) + r.wall_s
    return min(totals, key=totals.get) if totals else None


def _speedup(base: BenchRow | None, r: BenchRow) -> float | None:
    """Per-token time ratio: the wall-time ratio whenever the lengths match (equal outputs)."""
    if base is None or not r.new_tokens or not base.new_tokens:
        return None
    return (base.wall_s / base.new_tokens) / (r.wall_s / r.new_tokens)


def _decode_speedup(base: BenchRow | None, r: BenchRow) -> float | None:
    """Per-token time after the first token (the prefill left out), the baseline's over this row's."""
    if base is None or base.ttft_s is None or r.ttft_s is None or min(base.new_tokens, r.new_tokens) < 2:
        return None
    return ((base.wall_s - base.ttft_s) / (base.new_tokens - 1)) / ((r.wall_s - r.ttft_s) / (r.new_tokens - 1))


def entries(rows: list[BenchRow]) -> dict[str, list[BenchRow]]:
    """Rows grouped per summary entry: the decoder's name, plus its setting when it ran at several, plus
    [dtype] when the bench ran several."""
    settings: dict[str, set] = {}
    for r in rows:
        settings.setdefault(r.decoder, set()).add(r.setting)
    dtypes = len({r.dtype for r in rows}) > 1
    groups: dict[str, list[BenchRow]] = {}
    for r in rows:
        name = f"{r.decoder} {r.setting}" if len(settings[r.decoder]) > 1 else r.decoder
        name += f" [{r.dtype}]" if dtypes else ""
        groups.setdefault(name, []).append(r)
    return groups
