"""The bench on one CUDA GPU, offline, in a few minutes: `python scripts/gpu_bench.py`.

Writes gpu_bench.json and gpu_bench.md under $OUT (else ./gpu_bench_out, or --out DIR).

1. Randomly initialised Llama-shaped targets (1B and 7B shapes, bf16, built from configs: nothing is
   downloaded) with a small random draft: ar / sd / mirror (+ transformers' generate and assisted
   generation) on one GPU with two CUDA streams, and on GPU + CPU (draft process on the CPU cores).
   Random models accept almost nothing, so their τ and speedups mean little; their stage times
   (T_AR, T_verify, T_pre, Δ, T_branch, T_fresh) are real.
2. Replay: the default pair's measured acceptance (τ and fallback frequency of `mirror` with the AR
   draft, from assets/default_pair/model_card.json or --acceptance BENCH.json) through the latency
   model (docs/ALGORITHM.md §4) with the stage times measured here: labelled modelled, never measured.
3. The default pair itself on the GPU (real acceptance, two streams).

`--device cpu --tiny` runs the same pipeline on tiny models on the CPU in seconds (the test uses it).
"""
from __future__ import annotations

import dataclasses
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PAIR = os.path.join(ROOT, "assets", "default_pair")
if TYPE_CHECKING:  # annotations only; mirror_core is imported where it runs (after the flags are checked)
    from mirror_core.bench.summary import BenchReport

# Llama shapes (TinyLlama-1.1B and Llama-2-7B), a small draft, and tiny ones for the dry run.
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "draft": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=96),
    "tiny_draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=96),
}


@dataclass(frozen=True)
class GpuBenchConfig:
    device: str               # "cuda" (the real run) or "cpu" (dry run, with tiny=True)
    shapes: tuple[str, ...]   # target shapes from SHAPES
    tiny: bool
    max_new_tokens: int
    prompts: int              # random prompts per random pair
    repeats: int
    gamma: int
    kappa: int
    out_dir: str
    acceptance: str | None    # a CPU bench JSON whose mirror τ / hit rate to replay (default: the model card)

    def __post_init__(self) -> None:
        unknown = [s for s in self.shapes if s not in SHAPES or s.endswith("draft")]
        if unknown:
            raise ValueError(f"unknown shape {unknown[0]!r}; choose from 1b, 7b, tiny")
        if self.device == "cpu" and not self.tiny:
            raise ValueError("--device cpu is a dry run on tiny models; add --tiny")


def build_random_llama(folder: str, shape: dict, device: str, dtype_name: str, seed: int) -> str:
    """A randomly initialised LlamaForCausalLM saved as safetensors (no EOS, so every run is full length)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, max_position_embeddings=2048, eos_token_id=None, bos_token_id=None,
                      pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(getattr(torch, dtype_name)).eval()
    model.save_pretrained(folder)
    del model
    return folder


def lane_mappings(cfg: GpuBenchConfig) -> list[tuple[str, object]]:
    from mirror_core.lanes.placement import auto_lanes

    if cfg.device == "cpu":
        return [("cpu, inline (dry run)", auto_lanes("cpu", "cpu", "inline"))]
    return [("one GPU, two CUDA streams", auto_lanes("cuda:0", "cuda:0", "thread")),
            ("GPU + CPU (draft process on the CPU)", auto_lanes("cuda:0", "cpu", "process"))]


def bench_pair(target: str, draft: str, lanes, prompts, decoders: tuple[str, ...], cfg: GpuBenchConfig) -> BenchReport:
    """One pair on one lane mapping → its report."""
    from mirror_core.bench.harness import BenchConfig, open_pair, run_bench
    from mirror_core.bench.summary import build_report
    from mirror_core.config import SamplingConfig, SpecConfig

    config = BenchConfig(decoders, cfg.max_new_tokens, SamplingConfig(), SpecConfig(cfg.gamma, cfg.kappa),
                         repeats=cfg.repeats, warmup=1)
    with open_pair(target, draft, lanes, config) as pair:
        if prompts is None:  # text prompts need the pair's tokenizer
            from mirror_core.bench.harness import load_prompts
            prompts = load_prompts(os.path.join(ROOT, "assets", "bench_prompts.jsonl"), pair.engine.tokenizer,
                                   cfg.prompts)
        rows = run_bench(pair, prompts, config)
        info = pair.engine.info
    return build_report(rows, config, {"target": target, "draft": draft, "lanes": dataclasses.asdict(info.lanes),
                                       "target_runner": info.target_runner})


def random_prompts(n: int, vocab: int, seed: int = 0):
    import torch

    from mirror_core.bench.harness import BenchPrompt

    g = torch.Generator().manual_seed(seed)
    return [BenchPrompt(f"random-{i}", "random", tuple(torch.randint(0, vocab, (32,), generator=g).tolist()))
            for i in range(n)]


def replayed_acceptance(path: str | None) -> dict:
    """τ and FF of mirror with the AR draft: from a CPU bench JSON (its mirror entry) or the model card."""
    if path:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        entry = next(e for e in report["summary"] if e["decoder"] == "mirror")
        return {"tau": entry["tau"], "ff": 1.0 - entry["hit_rate"], "source": path,
                "gamma": entry["gamma"], "kappa": entry["kappa"]}
    with open(os.path.join(PAIR, "model_card.json"), encoding="utf-8") as f:
        spec = json.load(f)["speculation"]
    m = spec["draft_ar/mirror"]
    return {"tau": m["tau"], "ff": 1.0 - m["hit_rate"], "source": "assets/default_pair/model_card.json",
            "gamma": spec["settings"]["gamma"], "kappa": spec["settings"]["kappa"]}


def replay(report: BenchReport, acceptance: dict) -> dict | None:
    """The latency model with this report's measured stage times and the replayed τ, FF (modelled)."""
    from mirror_core.latency import LatencyModel

    mirror = [r for r in report.rows if r.decoder == "mirror" and r.model_ms]
    ar = [r for r in report.rows if r.decoder == "ar" and r.t_ar_ms]
    if not mirror or not ar:
        return None
    med = lambda xs: sorted(xs)[(len(xs) - 1) // 2]  # noqa: E731
    terms = {k: med([getattr(r.model_ms, k) for r in mirror]) / 1e3
             for k in ("t_pre", "t_rv_ee", "delta", "t_branch", "t_rv_fv", "t_fresh", "measured_step")}
    model = LatencyModel(**terms, ff=acceptance["ff"], tau=acceptance["tau"],
                         t_ar=med([r.t_ar_ms for r in ar]) / 1e3)
    return {"terms_ms": {k: v * 1e3 for k, v in terms.items()}, "t_ar_ms": model.t_ar * 1e3,
            "tau": model.tau, "ff": model.ff, "draft_hidden": model.t_branch <= model.delta,
            "mirror_speedup_vs_ar": model.speedup, "sd_speedup_vs_ar": model.sd_speedup,
            "source": acceptance["source"], "label": "modelled"}


def markdown(results: list[dict]) -> str:
    lines = ["| pair | lanes | decoder | tokens/s | × ar | τ | T_AR ms | T_verify ms | Δ ms | T_branch ms | "
             "T_fresh ms | = ar |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=2: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    med = lambda xs: sorted(xs)[(len(xs) - 1) // 2] if xs else None  # noqa: E731
    for res in results:
        rows = res["report"].rows
        t_ar = [r.t_ar_ms for r in rows if r.decoder == "ar" and r.t_ar_ms]
        for e in res["report"].summary:
            mine = [r for r in rows if r.decoder == e.decoder]
            models = [dataclasses.asdict(r.model_ms) for r in mine if r.model_ms]
            model = {k: med([m[k] for m in models]) for k in models[0]} if models else {}
            t_verify = [r.t_verify_ms for r in mine if r.t_verify_ms]
            lines.append(f"| {res['pair']} | {res['lanes']} | {e.name} | {f(e.tokens_per_s, 1)} | "
                         f"{f(e.speedup_vs_ar)} | {f(e.tau)} | {f(med(t_ar))} | "
                         f"{f(med(t_verify))} | {f(model.get('delta'))} | "
                         f"{f(model.get('t_branch'))} | {f(model.get('t_fresh'))} | {e.all_equal_to_ar} |")
    lines += ["", "Replayed acceptance through the latency model (modelled, not measured):", "",
              "| pair | lanes | τ | FF | draft hidden | mirror × ar | sd × ar | source |",
              "|---|---|---|---|---|---|---|---|"]
    for res in results:
        r = res.get("replay")
        if r:
            lines.append(f"| {res['pair']} | {res['lanes']} | {f(r['tau'])} | {f(r['ff'])} | {r['draft_hidden']} | "
                         f"{f(r['mirror_speedup_vs_ar'])} | {f(r['sd_speedup_vs_ar'])} | {r['source']} |")
    return "\n".join(lines) + "\n"


def run(cfg: GpuBenchConfig) -> dict:
    from mirror_core.bench.report import format_table

    os.makedirs(cfg.out_dir, exist_ok=True)
    acceptance = replayed_acceptance(cfg.acceptance)
    dtype = "float32" if cfg.device == "cpu" else "bfloat16"
    work = tempfile.mkdtemp(prefix="gpu_bench_")
    results = []
    try:
        draft = build_random_llama(os.path.join(work, "draft"), SHAPES["tiny_draft" if cfg.tiny else "draft"],
                                   cfg.device, dtype, seed=1)
        for shape in cfg.shapes:
            t0 = time.perf_counter()
            target = build_random_llama(os.path.join(work, shape), SHAPES[shape], cfg.device, dtype, seed=0)
            prompts = random_prompts(cfg.prompts, SHAPES[shape]["vocab_size"])
            for i, (name, lanes) in enumerate(lane_mappings(cfg)):
                peers = ("hf", "hf_assisted") if i == 0 else ()  # the peers do not depend on the lanes
                report = bench_pair(target, draft, lanes, prompts, ("ar", "sd", "mirror") + peers, cfg)
                results.append({"pair": f"random {shape}", "lanes": name, "report": report,
                                "replay": replay(report, acceptance), "seconds": time.perf_counter() - t0})
                print(f"== random {shape}, {name}\n{format_table(report)}", flush=True)
            shutil.rmtree(target, ignore_errors=True)
        name, lanes = lane_mappings(cfg)[0]
        report = bench_pair(os.path.join(PAIR, "target"), os.path.join(PAIR, "draft_ar"), lanes, None,
                            ("ar", "sd", "mirror"), cfg)
        results.append({"pair": "default pair (AR draft)", "lanes": name, "report": report, "replay": None})
        print(f"== default pair, {name}\n{format_table(report)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"format": "mirror-sd-gpu-bench/1", "config": cfg.__dict__, "acceptance_replayed": acceptance,
           "device_name": _device_name(cfg.device),
           "results": [{**res, "report": res["report"].to_dict()} for res in results]}
    with open(os.path.join(cfg.out_dir, "gpu_bench.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(cfg.out_dir, "gpu_bench.md"), "w", encoding="utf-8") as f:
        f.write(f"# GPU bench on {out['device_name']}\n\n" + markdown(results))
    return out


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run)"


def parse_args(argv: list[str] | None = None) -> GpuBenchConfig:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny random models (the dry run)")
    p.add_argument("--shapes", default=None, help="comma-separated target shapes (default 1b,7b; tiny with --tiny)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gamma", type=int, default=None, help="default: the replayed acceptance's γ")
    p.add_argument("--kappa", type=int, default=None, help="default: the replayed acceptance's κ")
    p.add_argument("--acceptance", default=None, help="a CPU bench JSON whose mirror τ/hit rate to replay")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.getcwd(), "gpu_bench_out"))
    a = p.parse_args(argv)
    acceptance = replayed_acceptance(a.acceptance)
    shapes = tuple(a.shapes.split(",")) if a.shapes else (("tiny",) if a.tiny else ("1b", "7b"))
    return GpuBenchConfig(a.device, shapes, a.tiny, a.max_new_tokens, a.prompts, a.repeats,
                          a.gamma or acceptance["gamma"], a.kappa or acceptance["kappa"], a.out, a.acceptance)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device here; this script needs one (`--device cpu --tiny` is the dry run)",
                  file=sys.stderr)
            return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run(cfg)
    print(f"wrote {cfg.out_dir}/gpu_bench.json and gpu_bench.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
