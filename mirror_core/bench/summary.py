"""Bench rows → per-decoder summary and the whole report (BenchReport; `to_dict` is the "mirror-sd-bench/6" JSON)."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, fields

from ..metrics import source_entry
from .config import BenchConfig
from .rows import BenchRow, baseline_decoder, derive, entries

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH_FIELDS = ("target", "draft", "prompts_file")  # the settings that may name a folder or file of this machine
FORMAT = "mirror-sd-bench/6"  # /3: rows carry the --dtype they ran at; /4: agreement_with_ar, step_ar_ms (llama.cpp);
#                               /5: by_source (per window source: model, branch, context; zero since windows of
#                               zero), ttft_s, decode speedup; /6: phases_ms (the mean step by phase: phases.py)
NOTES = (
    "Engine decoders (ar, ar_all, sd, mirror) are timed by the engine's own spans: prefill start → last commit, "
    "one monotonic clock for both lanes; loading and tokenisation excluded.",
    "hf and hf_assisted are timed by time.perf_counter around transformers' generate() (torch.cuda.synchronize "
    "first and last on CUDA): prefill and transformers' per-call set-up included, tokenisation excluded; "
    "they run on the target's device, on every core on a CPU.",
    "Each (prompt, decoder, setting) ran `repeats` times, interleaved across decoders, after `warmup` runs of "
    "every cell; wall_s is the median, wall_s_min/max the spread; other per-run values come from the run with "
    "the median wall time.",
    "Speedup = per-token time of the reference / per-token time of the decoder on the same prompt (= the "
    "wall-time ratio when the outputs are equal, hence equally long). Across prompts: the median, with "
    "min/max and the interquartile range.",
    "Baseline = the faster of ar (target only; on every core under the default --serial-cores all, else on the "
    "target's lane) and ar_all (target only, every core, no draft lane) by total median wall time over the suite.",
    "llama_cpp / llama_cpp_one = llama.cpp (llama-cpp-python) on the target's own GGUF, greedy, every core / one "
    "thread: a different function (its own int8 dot products), so agreement_with_ar (the common prefix with ar's "
    "tokens as a share of ar's) replaces equal_to_ar; its wall time includes its prefill, and t_ar_ms is its median "
    "time between tokens (the decode step, comparable with ar's).",
    "equal_to_ar: identical new-token ids, full length (every decoder stops at the same EOS ids and token "
    "budget).",
    "bound = τ·T_AR/T_verify: the speedup over ar with a free draft (T_AR = median target-only step of the same "
    "prompt's ar run, T_verify = median verification pass of this run).",
    "hidden_bound_ms (mirror) = median(verification + acceptance) + the fastest draft-lane reply in the run; "
    "step_ms is the measured median step (target prefix start → next window in hand).",
    "phases_ms: the mean step by phase from the engine's spans (mirror_core/phases.py): the target lane's stages, "
    "'the rest' (the loop's bookkeeping between spans) so that they add up to the measured mean step, and the wait "
    "for the draft split into the draft lane's own rollouts and the rest of the wait (messages, the draft's overhead).",
    "predicted_speedup_vs_ar = τ·T_AR/E[T_step] with E[T_step] = T_pre + T_rv^ee + max(Δ, T_branch) + T_rv^fv "
    "+ FF·T_fresh (docs/ALGORITHM.md §4), every term the mean of this run's spans: modelled, not measured.",
)
BEST_KEYS = ("name", "gamma", "kappa", "exit_layer", "branch_budget", "speedup_vs_baseline",
             "predicted_speedup_vs_ar", "speedup_vs_ar")  # what the JSON's "best" keeps of its summary entry


@dataclass(frozen=True)
class SummaryEntry:
    """One decoder (at one setting) over the prompts: medians of speedups and times, means of the run metrics."""

    name: str                                      # the decoder, plus its setting when it ran at several
    decoder: str                                   # bench decoder name
    setting: str                                   # BenchRow.setting
    gamma: int | None                              # γ (None: the decoder drafts nothing)
    kappa: int | None                              # κ (mirror only)
    exit_layer: int | None                         # ℓ_e (mirror only)
    branch_budget: int | None                      # branch rows per step (mirror only)
    prompts: int                                   # rows behind the entry
    tokens_per_s: float | None                     # median over prompts
    speedup_vs_baseline: float | None              # median over prompts
    speedup_vs_baseline_range: tuple[float, float] | None  # (min, max) over prompts
    speedup_vs_baseline_iqr: tuple[float, float] | None    # (first, third) quartile over prompts
    speedup_vs_ar: float | None                    # median over prompts
    decode_speedup_vs_baseline: float | None       # median over prompts: after the first token (the prefill left out)
    speedup_vs_ar_all: float | None                # median over prompts
    tau: float | None                              # mean over prompts
    acceptance_rate: float | None                  # mean over prompts
    hit_rate: float | None                         # mean over prompts
    draft_hidden_fraction: float | None            # median over prompts
    draft_tokens_per_forward: float | None         # mean over prompts
    bound: float | None                            # median τ·T_AR/T_verify over prompts
    predicted_speedup_vs_ar: float | None          # median over prompts (modelled)
    step_ms: float | None                          # median over prompts
    hidden_bound_ms: float | None                  # median over prompts
    step_over_hidden_bound: float | None           # median of step_ms / hidden_bound_ms over prompts
    all_equal_to_ar: bool | None                   # every row equal to ar (None: no row was compared)
    agreement_with_ar: float | None = None         # mean common-prefix share with ar (llama.cpp: another function)
    step_ar_ms: float | None = None                # median T_AR over prompts (ar, ar_all; llama.cpp: between tokens)
    by_source: dict | None = None                  # RunSummary.by_source of the prompts' runs pooled (counters added)
    phases_ms: dict | None = None                  # each phase's mean over prompts (BenchRow.phases_ms)

    @property
    def zero_share(self) -> float | None:
        """Steps that took a window of zero over every step, pooled over prompts (None: no steps)."""
        steps = sum(c["steps"] for c in self.by_source.values()) if self.by_source else 0
        return self.by_source["zero"]["steps"] / steps if steps and "zero" in self.by_source else None

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("speedup_vs_baseline_range", "speedup_vs_baseline_iqr"):
            out[key] = None if out[key] is None else list(out[key])
        return out


@dataclass(frozen=True)
class BenchReport:
    """One bench: how it ran, one row per (prompt, decoder, setting) and one summary entry per decoder."""

    time: str                                 # local time it was built, "%Y-%m-%d %H:%M:%S"
    settings: dict                            # BenchConfig and the pair's info (target, draft, lanes, ...), JSON-ready
    baseline: str | None                      # "ar" or "ar_all", whichever was faster (None: neither ran)
    notes: tuple[str, ...]                    # how it was measured (NOTES)
    summary: tuple[SummaryEntry, ...]         # one per decoder, per setting when a decoder ran at several
    best: SummaryEntry | None                 # the fastest mirror setting, when mirror ran at several
    rows: tuple[BenchRow, ...]                # one per (prompt, decoder, setting)

    def to_dict(self) -> dict:
        """The JSON report (format "mirror-sd-bench/6")."""
        return {"format": FORMAT, "time": self.time, "settings": self.settings, "baseline": self.baseline,
                "notes": list(self.notes), "summary": [e.to_dict() for e in self.summary],
                "best": None if self.best is None else {k: getattr(self.best, k) for k in BEST_KEYS},
                "rows": [r.to_dict() for r in self.rows]}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _quartiles(values: list) -> tuple[float, float] | None:
    values = sorted(v for v in values if v is not None)
    if len(values) < 2:
        return (values[0], values[0]) if values else None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize(rows: list[BenchRow]) -> list[SummaryEntry]:
    """One entry per decoder (per setting when a decoder ran at several): medians and spread over prompts."""
    out = []
    for name, mine in entries(rows).items():
        col = lambda key: [getattr(r, key) for r in mine]  # noqa: E731
        speedups = [v for v in col("speedup_vs_baseline") if v is not None]
        equal = col("equal_to_ar")
        first = mine[0]
        out.append(SummaryEntry(
            name=name, decoder=first.decoder, setting=first.setting, gamma=first.gamma, kappa=first.kappa,
            exit_layer=first.exit_layer, branch_budget=first.branch_budget, prompts=len(mine),
            tokens_per_s=_median(col("tokens_per_s")), speedup_vs_baseline=_median(speedups),
            speedup_vs_baseline_range=(min(speedups), max(speedups)) if speedups else None,
            speedup_vs_baseline_iqr=_quartiles(speedups),
            speedup_vs_ar=_median(col("speedup_vs_ar")), speedup_vs_ar_all=_median(col("speedup_vs_ar_all")),
            decode_speedup_vs_baseline=_median(col("decode_speedup_vs_baseline")),
            tau=_mean(col("tau")), acceptance_rate=_mean(col("acceptance_rate")), hit_rate=_mean(col("hit_rate")),
            draft_hidden_fraction=_median(col("draft_hidden_fraction")),
            draft_tokens_per_forward=_mean(col("draft_tokens_per_forward")),
            bound=_median(col("bound")), predicted_speedup_vs_ar=_median(col("predicted_speedup_vs_ar")),
            step_ms=_median(col("step_ms")), hidden_bound_ms=_median(col("hidden_bound_ms")),
            step_over_hidden_bound=_median([r.step_ms / r.hidden_bound_ms for r in mine
                                            if r.step_ms and r.hidden_bound_ms]),
            all_equal_to_ar=None if all(e is None for e in equal) else all(e is True for e in equal),
            agreement_with_ar=_mean(col("agreement_with_ar")), step_ar_ms=_median(col("t_ar_ms")),
            by_source=_pooled_sources(col("by_source")), phases_ms=_mean_phases(col("phases_ms"))))
    return out


def _mean_phases(per_row: list[dict | None]) -> dict | None:
    """Each phase's mean over the prompts whose run has phases (the names in the first one's order)."""
    rows = [p for p in per_row if p]
    if not rows:
        return None
    return {k: round(statistics.fmean(p[k] for p in rows if k in p), 4) for k in rows[0]}


def _pooled_sources(per_row: list[dict | None]) -> dict | None:
    """Per-source counters added over rows, their ratios recomputed (metrics.RunSummary.by_source's definitions)."""
    rows = [r for r in per_row if r]
    if not rows:
        return None
    return {source: source_entry(*(sum(r[source][k] for r in rows) for k in ("steps", "proposed", "accepted")))
            for source in rows[0]}


def best_setting(summary: list[SummaryEntry]) -> SummaryEntry | None:
    """The mirror setting with the highest median speedup over the baseline (when mirror ran at several)."""
    mirror = [s for s in summary if s.decoder == "mirror" and s.speedup_vs_baseline is not None]
    if len(mirror) < 2:
        return None
    return max(mirror, key=lambda s: s.speedup_vs_baseline)


def recorded_path(source: str | None, root: str = REPO_ROOT) -> str | None:
    """A model or prompts file as a committed record names it: a registry name or hub id as it is, a path inside the
    repository relative to it, any other path by its last two parts after …/ (never this machine's layout)."""
    if not source or not os.path.isabs(source):
        return source
    rel = os.path.relpath(os.path.normpath(source), root)
    if not rel.startswith(os.pardir):
        return rel
    return "…/" + "/".join(os.path.normpath(source).strip(os.sep).split(os.sep)[-2:])


def build_report(rows: list[BenchRow], config: BenchConfig, info: dict) -> BenchReport:
    """The report of one bench; `info` (the pair, its lanes, the prompt file) joins the settings."""
    rows = derive(rows)
    summary = summarize(rows)
    settings = {"max_new_tokens": config.max_new_tokens, "repeats": config.repeats, "warmup": config.warmup,
                "decoders": list(config.decoders), "spec": asdict(config.spec), "sampling": asdict(config.sampling),
                "sweep": [asdict(s) for s in config.sweep], **info}
    settings |= {k: recorded_path(settings[k]) for k in PATH_FIELDS if k in settings}
    return BenchReport(time.strftime("%Y-%m-%d %H:%M:%S"), settings, baseline_decoder(rows), NOTES, tuple(summary),
                       best_setting(summary), tuple(rows))
