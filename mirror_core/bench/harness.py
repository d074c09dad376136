"""`python -m mirror_core bench`: prompts × decoders × settings on one pair → rows for the report.

Every decoder runs on the same prompts, lengths and settings in this process, one after another
with the lanes to themselves, after a warm-up; repeats are interleaved across decoders (so the
machine's drift hits them alike) and each row keeps the median and the min/max wall time. The
engine's decoders are timed by the engine's own spans (prefill start → last commit); the Hugging
Face peers by `time.perf_counter` around `generate()` (peers.py). Every decoder's greedy
output is checked equal to `ar`'s, and the rows say so.

Decoders: `ar` (target only: on every core under the default --serial-cores all, else on the target's lane),
`ar_all` (target only, every core, in an engine with no draft lane), `sd`, `mirror`, `hf` (transformers' greedy
generate), `hf_assisted` (transformers' assisted generation), and the optional `llama_cpp` / `llama_cpp_one`
(llama.cpp on the target's own GGUF, every core / one thread; a different function, so only its agreement is shown).
The baseline is the faster of `ar` and `ar_all` over the suite (docs/ALGORITHM.md §8). Each
(prompt, decoder, setting) becomes one BenchRow (rows.py); its run metrics come from the engine's
RunSummary, the bounds from `mirror_core.latency`.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
from dataclasses import dataclass, replace
from itertools import product
from typing import Callable, Iterator

from ..config import ContextConfig, LaneConfig, MirrorError, Request, SpecConfig
from ..engine import MirrorEngine
from ..events import RunEnd, SpanEvent, StepRecord
from ..latency import LatencyModel, ar_step_time, hidden_draft_bound, latency_model_from_events, step_times, verify_time
from ..machine import usable_cpus
from ..metrics import RunSummary
from ..phases import StepPhases, step_phases
from ..models.loading import assistable, encode_text
from .config import (BENCH_DECODERS, DRAFTING_DECODERS, ENGINE_DECODERS, MODEL_ONLY, PEER_DECODERS, RAW, SWEEP_AXES,
                     BenchConfig)
from .rows import BenchRow, ModelMs, run_metrics


@dataclass(frozen=True)
class BenchPrompt:
    """One line of the prompt file."""

    name: str                       # the line's question_id (else its line number)
    category: str                   # the line's Spec-Bench category ("" when absent)
    prompt_ids: tuple[int, ...]     # the first turn, tokenised (or the line's prompt_ids)


@dataclass(frozen=True)
class Cell:
    """One decoder at one setting (the settings it ignores are None)."""

    decoder: str                    # bench decoder name
    spec: SpecConfig                # the request's settings, ℓ_e resolved
    gamma: int | None               # γ when the decoder drafts (sd, mirror, hf_assisted)
    kappa: int | None               # κ (mirror only)
    exit_layer: int | None          # ℓ_e (mirror only)
    branch_budget: int | None = None  # branch rows per step (mirror only)

    @property
    def label(self) -> str:
        parts = [("γ", self.gamma), ("κ", self.kappa), ("ℓe", self.exit_layer), ("B", self.branch_budget or None)]
        return " ".join(f"{k}={v}" for k, v in parts if v is not None)


@dataclass(frozen=True)
class Measurement:
    """One timed run."""

    tokens: tuple[int, ...]                    # new token ids
    wall_s: float                              # engine: prefill start → last commit; peers: generate() (s)
    summary: RunSummary | None = None          # the engine's run summary (None for the peers)
    t_ar: float | None = None                  # median target-only step (s)
    t_verify: float | None = None              # median verification pass (s)
    step: float | None = None                  # median measured step (s)
    hidden_bound: float | None = None          # mirror: verification + acceptance + fastest draft reply (s)
    model: LatencyModel | None = None          # mirror: §4 terms from this run's spans (t_ar None)
    fallback: str | None = None                # the engine's explicit fallback note, if any
    phases: StepPhases | None = None           # the mean step by phase (phases.py; ar, sd, mirror)


def load_prompts(path: str, tokenizer, limit: int | None = None) -> list[BenchPrompt]:
    """Spec-Bench question.jsonl lines ({"question_id", "category", "turns": [...]}); the first turn is
    the prompt. A "prompt_ids" field (our extension) serves models without a tokenizer."""
    if not os.path.isfile(path):
        raise MirrorError(f"prompt file {path!r} does not exist")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MirrorError(f"{path}: line {n + 1} is not JSON ({exc.msg})") from None
            if "prompt_ids" in row:
                ids = tuple(int(t) for t in row["prompt_ids"])
            elif tokenizer is None:
                raise MirrorError(f"{path}: line {n + 1} has text but the target has no tokenizer; add prompt_ids")
            elif not row.get("turns"):
                raise MirrorError(f"{path}: line {n + 1} has neither turns nor prompt_ids")
            else:
                ids = encode_text(tokenizer, row["turns"][0])  # a chat turn where the target has a template
            out.append(BenchPrompt(str(row.get("question_id", n)), str(row.get("category", "")), ids))
    if not out:
        raise MirrorError(f"{path} holds no prompts")
    return out[:limit] if limit else out


def parse_sweep(items: list[str] | None, base: SpecConfig) -> tuple[SpecConfig, ...]:
    """["gamma=2,4", "kappa=1,2", "exit=3,5"] → the grid of SpecConfigs (unswept axes keep `base`)."""
    if not items:
        return ()
    axes: dict[str, list[int]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or name not in SWEEP_AXES:
            raise MirrorError(f"--sweep takes AXIS=V1,V2,... with AXIS one of {', '.join(SWEEP_AXES)}; got {item!r}")
        if name in axes:
            raise MirrorError(f"--sweep names {name} twice")
        try:
            axes[name] = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise MirrorError(f"--sweep {name} values must be integers, got {values!r}") from None
        if not axes[name]:
            raise MirrorError(f"--sweep {name} has no values")
    names = list(axes)
    return tuple(replace(base, **{SWEEP_AXES[n]: v for n, v in zip(names, combo)})
                 for combo in product(*(axes[n] for n in names)))


def all_core_lanes(lanes: LaneConfig) -> LaneConfig:
    """The target lane on every core with one intra-op thread per core (the `ar_all` baseline)."""
    if lanes.target_device != "cpu":
        raise MirrorError("ar_all (target-only ar on every core) needs the target on the CPU; drop it from --decoders")
    cpus = usable_cpus()
    return replace(lanes, target_cpus=cpus, target_threads=len(cpus))


def default_decoders(lanes: LaneConfig, draft: str | None = None) -> tuple[str, ...]:
    """Every decoder that applies, but those asked for by name: the optional llama.cpp peers, and sd and mirror with
    the context draft off; hf_assisted only with a draft transformers can drive (models/loading.py: assistable)."""
    return tuple(d for d in BENCH_DECODERS if (d != "ar_all" or lanes.target_device == "cpu")
                 and not d.startswith("llama_cpp") and d not in MODEL_ONLY + RAW
                 and (d != "hf_assisted" or draft is None or assistable(draft)))


@dataclass
class BenchPair:
    """Everything loaded for one bench: the engine, the all-core ar engine, the Hugging Face peers."""

    engine: MirrorEngine                    # the pair on its lanes (ar, sd, mirror)
    all_core: MirrorEngine | None           # the target alone on every core (ar_all), when it runs
    peers: object | None                    # peers.HFPeers, when hf or hf_assisted runs
    llama: object | None = None             # peers.LlamaCppPeer, when llama_cpp or llama_cpp_one runs
    dtype: str = "auto"                     # the --dtype both engines were loaded with


@contextlib.contextmanager
def open_pair(target: str, draft: str | None, lanes: LaneConfig, config: BenchConfig) -> Iterator[BenchPair]:
    """Load what `config.decoders` need; close the lanes afterwards."""
    from .peers import LLAMA_CPP_DECODERS, HFPeers, LlamaCppPeer

    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(MirrorEngine.load(target, draft if config.needs_draft else None, lanes))
        all_core = (stack.enter_context(MirrorEngine.load(target, None, all_core_lanes(lanes)))
                    if "ar_all" in config.decoders else None)
        peers = None
        if {"hf", "hf_assisted"} & set(config.decoders):
            peers = HFPeers(target, draft if "hf_assisted" in config.decoders else None, lanes.target_device)
        llama = LlamaCppPeer(target, config.decoders) if set(LLAMA_CPP_DECODERS) & set(config.decoders) else None
        yield BenchPair(engine, all_core, peers, llama=llama, dtype=lanes.dtype)


def plan(engine: MirrorEngine, config: BenchConfig, probe: tuple[int, ...]) -> list[Cell]:
    """Every (decoder, setting) to run, resolved and checked against the pair (MirrorEngine.validate)."""
    cells = []
    for decoder in config.decoders:
        specs = config.sweep if decoder == "mirror" and config.sweep else (config.spec,)
        mirror = ENGINE_DECODERS.get(decoder) == "mirror"
        for spec in specs:
            spec = replace(spec, context=ContextConfig(enabled=False)) if decoder in MODEL_ONLY else spec
            spec = replace(spec, zero_windows=False) if decoder in RAW else spec
            spec = engine.validate(Request(probe, ENGINE_DECODERS.get(decoder, "ar"), config.max_new_tokens,
                                           config.sampling, spec)).spec  # γ, κ, ℓ_e left out: the pair's
            cells.append(Cell(decoder, spec, spec.gamma if decoder in DRAFTING_DECODERS else None,
                              spec.kappa if mirror else None, spec.exit_layer if mirror else None,
                              spec.branch_budget if mirror else None))
    return cells


def measure(pair: BenchPair, cell: Cell, prompt: BenchPrompt, config: BenchConfig) -> Measurement:
    if cell.decoder.startswith("llama_cpp"):
        tokens, wall, step = pair.llama.generate(cell.decoder, prompt.prompt_ids, config.max_new_tokens,
                                                 pair.engine.eos_ids)
        return Measurement(tokens, wall, t_ar=step)
    if cell.decoder in PEER_DECODERS:
        tokens, wall = pair.peers.generate(cell.decoder, prompt.prompt_ids, config.max_new_tokens, cell.spec.gamma)
        return Measurement(tokens, wall)
    engine = pair.all_core if cell.decoder == "ar_all" else pair.engine
    request = Request(prompt.prompt_ids, ENGINE_DECODERS[cell.decoder], config.max_new_tokens, config.sampling,
                      cell.spec)
    events = list(engine.stream(request))
    end: RunEnd = events[-1]
    if end.error:
        raise MirrorError(f"{cell.decoder} failed on prompt {prompt.name}: {end.error}")
    spans = [e for e in events if isinstance(e, SpanEvent)]
    steps = [e for e in events if isinstance(e, StepRecord)]
    times = step_times(spans, steps)
    decoder = ENGINE_DECODERS[cell.decoder]
    mirror = decoder == "mirror"
    return Measurement(end.token_ids, end.summary.wall_s, end.summary, ar_step_time(spans), verify_time(spans),
                       statistics.median(times) if times else None, hidden_draft_bound(spans) if mirror else None,
                       latency_model_from_events(spans, steps, end.summary, None) if mirror else None, end.fallback,
                       step_phases(decoder, spans, steps, end.summary.tau))


def run_bench(pair: BenchPair, prompts: list[BenchPrompt], config: BenchConfig,
              on_run: Callable[[str], None] = lambda _: None) -> list[BenchRow]:
    """Warm up every cell on the first prompt, then per prompt interleave the repeats; one row per cell."""
    cells = plan(pair.engine, config, prompts[0].prompt_ids)
    for cell in cells:
        for _ in range(config.warmup):
            measure(pair, cell, prompts[0], config)
            on_run(f"warm-up {cell.decoder} {cell.label}")
    rows = []
    for p in prompts:
        runs: dict[Cell, list[Measurement]] = {c: [] for c in cells}
        for _ in range(config.repeats):
            for cell in cells:
                runs[cell].append(measure(pair, cell, p, config))
                on_run(f"{p.name} {cell.decoder} {cell.label}")
        rows += [measured_row(p, cell, runs[cell], pair.dtype) for cell in cells]
    return rows


def total_runs(n_prompts: int, n_cells: int, config: BenchConfig) -> int:
    return n_cells * (config.warmup + n_prompts * config.repeats)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def measured_row(p: BenchPrompt, cell: Cell, runs: list[Measurement], dtype: str = "auto") -> BenchRow:
    """Medians over repeats for times; everything else from the run with the median wall time (derived fields
    are left for `derive`)."""
    walls = [m.wall_s for m in runs]
    wall = statistics.median(walls)
    rep = sorted(runs, key=lambda m: m.wall_s)[(len(runs) - 1) // 2]
    return BenchRow(
        prompt=p.name, category=p.category, decoder=cell.decoder, setting=cell.label, dtype=dtype, gamma=cell.gamma,
        kappa=cell.kappa, exit_layer=cell.exit_layer, branch_budget=cell.branch_budget, new_tokens=len(rep.tokens),
        wall_s=wall, wall_s_min=min(walls), wall_s_max=max(walls), tokens_per_s=len(rep.tokens) / wall,
        repeats=len(runs), timed_by=_timed_by(cell.decoder, rep),
        **run_metrics(rep.summary), t_ar_ms=_ms(rep.t_ar), t_verify_ms=_ms(rep.t_verify), step_ms=_ms(rep.step),
        hidden_bound_ms=_ms(rep.hidden_bound), model_ms=None if rep.model is None else ModelMs.of(rep.model),
        fallback=rep.fallback, token_ids=tuple(rep.tokens), phases_ms=None if rep.phases is None else rep.phases.to_dict())


def _timed_by(decoder: str, m: Measurement) -> str:
    if m.summary is not None:
        return "engine spans"
    return "perf_counter per token" if decoder.startswith("llama_cpp") else "perf_counter around generate()"
