"""The reliability harness shared by tests/test_reliability_*.py and scripts/soak.py.

- `build_models(root)`: every model folder the bad-input catalogue needs (tiny, built from configs).
- `CATALOGUE`: docs/RELIABILITY.md's bad-input table as data; each row says what to send on each surface
  (CLI, Python API, app) and a phrase its one-line error must contain.
- `page_values`, `run_args`, `app_values`: the page's Run controls by name (ui.settings.CONTROLS), and the
  /run endpoint's positional arguments made from them.
- `fault_trial`, `target_fault`, `back_to_back`, `concurrent_clients`: one seeded draft fault checked
  against `ar`, a target-lane failure, N runs through the app handler (RSS, threads, processes), and N
  gradio_client users at once.
"""
from __future__ import annotations

import gc
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import psutil
import torch

from mirror_core import (LaneConfig, MirrorEngine, MirrorError, Request, RunEnd, SamplingConfig, SpanEvent,
                         SpecConfig, StepRecord)
from mirror_core.config import AUTO_BRANCH_BUDGET, MAX_GAMMA, MAX_KAPPA, MAX_NEW_TOKENS_CAP, MAX_PROMPT_CHARS, FaultPlan
from mirror_core.events import LANE_DRAFT, LANE_TARGET
from testing.toy_models import VOCAB, build_pair

INLINE = LaneConfig(kind="inline", target_threads=1, draft_threads=1)


# -- model folders ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Models:
    target: str              # 4-layer llama, no tokenizer (prompts as ids)
    draft: str
    tok_target: str          # the same shapes with a word-level tokenizer (text prompts)
    tok_draft: str
    padded_draft: str        # tok_target's tokenizer, embedding table padded to 128 rows (must work)
    other_tok_draft: str     # same sizes, a different tokenizer
    short_vocab_target: str  # vocab 80 < the 96-token tokenizer next to it
    short_vocab_draft: str
    vocab80_draft: str       # vocab 80, no tokenizer (sizes differ from target's 96)
    bert: str                # a config.json of an architecture no runner supports (not a causal LM here)
    config_only: str         # a llama config.json and no weights
    bin_only: str            # a llama with pickled pytorch_model.bin weights only
    empty: str               # an empty folder
    missing: str             # a path that does not exist


def _save_tokenizer(path: str, words: list[str]) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(WordLevel(vocab, unk_token=words[0]))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0]).save_pretrained(path)


def build_models(root: str) -> Models:
    from transformers import BertConfig, LlamaConfig

    target, draft = build_pair(root, "llama")
    tok_target, tok_draft = build_pair(root, "llama", seed=3)
    _, padded_draft = build_pair(root, "llama", seed=3, vocab=128)
    _, other_draft = build_pair(root, "llama", seed=4)
    short_target, short_draft = build_pair(root, "llama", seed=5, vocab=80)
    _, vocab80_draft = build_pair(root, "llama", seed=6, vocab=80)
    words = ["[UNK]"] + [f"w{i}" for i in range(VOCAB - 1)]
    for path in (tok_target, tok_draft, padded_draft, short_target, short_draft):
        _save_tokenizer(path, words)
    _save_tokenizer(other_draft, ["[UNK]"] + [f"v{i}" for i in range(VOCAB - 1)])
    bert = os.path.join(root, "bert_config")
    BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(bert)
    config_only = os.path.join(root, "config_only")
    LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2).save_pretrained(config_only)
    bin_only = os.path.join(root, "bin_only")
    os.makedirs(bin_only, exist_ok=True)
    with open(os.path.join(target, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(bin_only, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    from safetensors.torch import load_file

    torch.save(load_file(os.path.join(target, "model.safetensors")), os.path.join(bin_only, "pytorch_model.bin"))
    empty = os.path.join(root, "empty_folder")
    os.makedirs(empty, exist_ok=True)
    return Models(target, draft, tok_target, tok_draft, padded_draft, other_draft, short_target, short_draft,
                  vocab80_draft, bert, config_only, bin_only, empty, os.path.join(root, "no_such_folder"))


# -- the bad-input catalogue ----------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input on one surface. `cli`: argv after `generate --lane inline`; `api`: a call that must raise
    MirrorError (given Models and a loaded engine on tok_target/tok_draft); `app`: overrides of the /run
    endpoint's arguments by control name (ui.settings.CONTROLS; see APP_DEFAULTS)."""
    row: str
    needle: str
    cli: Callable[[Models], list[str]] | None = None
    api: Callable[[Models, MirrorEngine], object] | None = None
    app: Callable[[Models], dict] | None = None
    cli_needle: str | None = None  # when the CLI's wording differs (argparse's own messages)
    app_raw: bool = False          # gradio_client cannot send it (lone surrogates): post the JSON a browser sends


# The /run arguments the catalogue's app rows start from (with the tokenizer pair); rows override some by name.
APP_DEFAULTS = {"prompt": "w1 w2 w3", "decoders": ("ar", "mirror"), "gamma": 3, "kappa": 2, "exit_layer": 0,
                "temperature": 0.0, "top_k": 0, "top_p": 1.0, "rule": "exact", "max_new_tokens": 8, "seed": 0,
                "branch_budget": 0}


def page_values(**over) -> dict:
    """Every Run control by name (ui.settings.CONTROLS): the page's DEFAULTS but one repeat (a test times one
    comparison unless it asks for more), no pair, no prompt, then `over`."""
    from ui.settings import CONTROLS, DEFAULTS

    unknown = set(over) - set(CONTROLS)
    if unknown:
        raise KeyError(f"not a Run control: {', '.join(sorted(unknown))}")
    return {"prompt": "", "target": "", "draft": "", **DEFAULTS, "decoders": list(DEFAULTS["decoders"]), "repeats": 1,
            **over}


def run_args(values: dict) -> list:
    """The /run endpoint's positional arguments (gradio_client, raw HTTP) for control values by name."""
    from ui.settings import CONTROLS

    return [values[name] for name in CONTROLS]


def app_values(m: Models, **over) -> list:
    """The /run endpoint's arguments for the tokenizer pair: APP_DEFAULTS, then `over` by control name."""
    return run_args(page_values(**{"target": m.tok_target, "draft": m.tok_draft, **APP_DEFAULTS, **over}))


def _app_max_new_tokens() -> int:
    from ui.settings import APP_MAX_NEW_TOKENS

    return APP_MAX_NEW_TOKENS


def _ids(m: Models, *extra: str, prompt_ids: str = "1,2", target: str | None = None,
         draft: str | None = None) -> list[str]:
    return ["--target", target or m.target, "--draft", draft or m.draft, "--prompt-ids", prompt_ids, *extra]


def _text(m: Models, prompt: str, *extra: str) -> list[str]:
    return ["--target", m.tok_target, "--draft", m.tok_draft, "--prompt", prompt, *extra]


def _req(**kw) -> Request:
    return Request(**{"prompt_ids": (1, 2), **kw})


def _load(target: str, draft: str | None, lanes: LaneConfig = INLINE):
    MirrorEngine.load(target, draft, lanes).close()  # must raise before this


TOO_LONG = "w1 " * (MAX_PROMPT_CHARS // 3 + 1)
CATALOGUE: list[Case] = [
    # prompt
    Case("empty or whitespace prompt", "prompt is empty", lambda m: _text(m, "  \n\t "),
         lambda m, e: e.encode("  \n\t "), lambda m: dict(prompt="  \n ")),
    Case("empty prompt ids", "empty", lambda m: _ids(m, prompt_ids=""), lambda m, e: Request(prompt_ids=())),
    Case("prompt text above the size cap", "prompt is too long", lambda m: _text(m, TOO_LONG),
         lambda m, e: e.encode(TOO_LONG), lambda m: dict(prompt=TOO_LONG)),
    Case("prompt longer than the context (refused, not truncated)", "exceeds the models' context",
         lambda m: _ids(m, prompt_ids=",".join(["1"] * 600)),
         lambda m, e: e.validate(Request(prompt_ids=(1,) * 600)), lambda m: dict(prompt="w1 " * 600)),
    Case("prompt id outside the vocabulary", "outside the vocabulary", lambda m: _ids(m, prompt_ids="1,100000"),
         lambda m, e: e.validate(Request(prompt_ids=(1, 100000))),
         lambda m: dict(prompt="1, 100000", target=m.target, draft=m.draft)),
    Case("invalid UTF-8 in the prompt", "not valid UTF-8", lambda m: _text(m, "w1 \udcff w2"),
         lambda m, e: e.encode("w1 \udcff w2"), lambda m: dict(prompt="w1 \udcff w2"), app_raw=True),
    Case("control character in the prompt", "control character U+0000", lambda m: _text(m, "w1\x00w2"),
         lambda m, e: e.encode("w1\x00w2"), lambda m: dict(prompt="w1\x00w2")),
    Case("escape sequence in the prompt", "control character U+001B", lambda m: _text(m, "\x1b[31mw1"),
         lambda m, e: e.encode("\x1b[31mw1"), lambda m: dict(prompt="\x1b[31mw1")),
    # budget and speculation settings
    Case("max new tokens 0", "max new tokens", lambda m: _ids(m, "--max-new-tokens", "0"),
         lambda m, e: _req(max_new_tokens=0), lambda m: dict(max_new_tokens=0)),
    Case("max new tokens above the cap", "max new tokens",
         lambda m: _ids(m, "--max-new-tokens", str(MAX_NEW_TOKENS_CAP + 1)),
         lambda m, e: _req(max_new_tokens=MAX_NEW_TOKENS_CAP + 1),
         lambda m: dict(max_new_tokens=_app_max_new_tokens() + 1)),
    Case("γ = 0", "gamma", lambda m: _ids(m, "--gamma", "0"), lambda m, e: SpecConfig(gamma=0)),
    Case("γ below 0 on the page (0 there = the pair's choice)", "gamma", app=lambda m: dict(gamma=-1)),
    Case("γ above 16", "gamma", lambda m: _ids(m, "--gamma", "17"), lambda m, e: SpecConfig(gamma=17),
         lambda m: dict(gamma=MAX_GAMMA + 1)),
    Case("κ = 0", "kappa", lambda m: _ids(m, "--kappa", "0"), lambda m, e: SpecConfig(kappa=0)),
    Case("κ below 0 on the page (0 there = the pair's choice)", "kappa", app=lambda m: dict(kappa=-1)),
    Case("κ above 64", "kappa", lambda m: _ids(m, "--kappa", "65"), lambda m, e: SpecConfig(kappa=65),
         lambda m: dict(kappa=MAX_KAPPA + 1)),
    Case("branch budget below −1", "branch budget", lambda m: _ids(m, "--branch-budget", "-2"),
         lambda m, e: SpecConfig(branch_budget=-2), lambda m: dict(branch_budget=AUTO_BRANCH_BUDGET - 1)),
    Case("ℓ_e ≥ N", "exit layer must be in 1..3", lambda m: _ids(m, "--exit-layer", "4"),
         lambda m, e: e.validate(_req(spec=SpecConfig(exit_layer=4))), lambda m: dict(exit_layer=4)),
    Case("ℓ_e < 1", "exit layer", lambda m: _ids(m, "--exit-layer", "0"), lambda m, e: SpecConfig(exit_layer=-1),
         lambda m: dict(exit_layer=-1)),
    Case("temperature < 0", "temperature", lambda m: _ids(m, "--temperature", "-1"),
         lambda m, e: SamplingConfig(temperature=-1.0), lambda m: dict(temperature=-1)),
    Case("temperature above 100 or NaN", "temperature", lambda m: _ids(m, "--temperature", "nan"),
         lambda m, e: SamplingConfig(temperature=101.0), lambda m: dict(temperature="nan")),
    Case("top-k < 0", "top-k", lambda m: _ids(m, "--top-k", "-1"), lambda m, e: SamplingConfig(top_k=-1),
         lambda m: dict(top_k=-1)),
    Case("top-p = 0", "top-p", lambda m: _ids(m, "--top-p", "0"), lambda m, e: SamplingConfig(top_p=0.0),
         lambda m: dict(top_p=0)),
    Case("top-p above 1", "top-p", lambda m: _ids(m, "--top-p", "1.5"), lambda m, e: SamplingConfig(top_p=1.5),
         lambda m: dict(top_p=1.5)),
    Case("unknown rule", "rule", lambda m: _ids(m, "--rule", "magic"), lambda m, e: SamplingConfig(rule="magic"),
         lambda m: dict(rule="magic")),
    Case("negative seed", "seed", lambda m: _ids(m, "--seed", "-1"), lambda m, e: SamplingConfig(seed=-1),
         lambda m: dict(seed=-1)),
    Case("unknown decoder / none chosen", "decoder", lambda m: _ids(m, "--decoder", "beam"),
         lambda m, e: _req(decoder="beam"), lambda m: dict(decoders=["beam"])),
    Case("non-numeric field", "must be", lambda m: _ids(m, "--gamma", "two"),
         lambda m, e: SpecConfig(gamma="4"), lambda m: dict(gamma="two"), cli_needle="invalid int value"),
    Case("non-numeric field (temperature)", "must be a number", None, None, lambda m: dict(temperature="hot")),
    Case("non-numeric field (max new tokens)", "must be a whole number", None, None,
         lambda m: dict(max_new_tokens="lots")),
    Case("non-numeric field (top-k, fractional)", "must be a whole number", None, None, lambda m: dict(top_k=2.5)),
    # models
    Case("model id that does not exist (offline)", "not found offline",
         lambda m: _ids(m, target="nobody-xyz/no-such-model"), lambda m, e: _load("nobody-xyz/no-such-model", None),
         lambda m: dict(target="nobody-xyz/no-such-model", draft="")),
    Case("model folder that does not exist", "does not exist", lambda m: _ids(m, target=m.missing),
         lambda m, e: _load(m.missing, None), lambda m: dict(target=m.missing, draft="")),
    Case("folder that is not a model", "cannot load model", lambda m: _ids(m, target=m.empty),
         lambda m, e: _load(m.empty, None), lambda m: dict(target=m.empty, draft="")),
    Case("folder of a non-causal-LM architecture", "unsupported architecture 'bert'", lambda m: _ids(m, target=m.bert),
         lambda m, e: _load(m.bert, None), lambda m: dict(target=m.bert, draft="")),
    Case("config without weights", "no .safetensors weights", lambda m: _ids(m, target=m.config_only),
         lambda m, e: _load(m.config_only, None), lambda m: dict(target=m.config_only, draft="")),
    Case("pickled .bin weights only", "only pickled weights", lambda m: _ids(m, target=m.bin_only),
         lambda m, e: _load(m.bin_only, None), lambda m: dict(target=m.bin_only, draft="")),
    Case("pickled .bin draft", "only pickled weights", lambda m: _ids(m, draft=m.bin_only),
         lambda m, e: _load(m.target, m.bin_only), lambda m: dict(target=m.target, draft=m.bin_only)),
    Case("vocabulary sizes differ, no tokenizer", "vocabulary", lambda m: _ids(m, draft=m.vocab80_draft),
         lambda m, e: _load(m.target, m.vocab80_draft), lambda m: dict(target=m.target, draft=m.vocab80_draft)),
    Case("tokenizers differ", "different vocabularies", lambda m: _text(m, "w1", "--draft", m.other_tok_draft),
         lambda m, e: _load(m.tok_target, m.other_tok_draft), lambda m: dict(draft=m.other_tok_draft)),
    Case("tokenizer longer than the embedding table", "embeddings",
         lambda m: ["--target", m.short_vocab_target, "--draft", m.short_vocab_draft, "--prompt", "w1"],
         lambda m, e: _load(m.short_vocab_target, m.short_vocab_draft),
         lambda m: dict(target=m.short_vocab_target, draft=m.short_vocab_draft)),
    Case("unavailable device cuda:3", "not available", lambda m: _ids(m, "--target-device", "cuda:3"),
         lambda m, e: _load(m.target, m.draft, LaneConfig(target_device="cuda:3", kind="inline"))),
    Case("unknown device", "must be cpu, cuda[:N], mps, xpu[:N] or npu[:N]", lambda m: _ids(m, "--draft-device", "tpu"),
         lambda m, e: LaneConfig(draft_device="tpu")),
    Case("unknown kernel", "kernel must be one of auto, torch, amx, avx512_vnni, avx512, avx2, scalar",
         lambda m: _ids(m, "--kernel", "sse2"), lambda m, e: LaneConfig(kernel="sse2")),
]


# -- draft faults --------------------------------------------------------------------------------
@dataclass
class FaultTrial:
    seed: int
    kind: str
    mode: str
    decoder: str
    step: int
    ok: bool
    detail: str = ""


def process_fault_mode(seed: int) -> str:
    """The fault mode fault_trial draws for `seed` on a process lane (its first two draws)."""
    rng = random.Random(seed)
    rng.choice(("process",))
    return rng.choice(("raise", "exit"))


class FaultEngines:
    """Engines per (lane kind, fault plan), loaded on first use: a fault plan is fixed when an engine loads."""

    def __init__(self, target: str, draft: str, lanes: dict[str, LaneConfig]):
        from transformers import AutoConfig

        self.target, self.draft, self.lanes = target, draft, lanes
        self.engines: dict[tuple[str, FaultPlan], MirrorEngine] = {}
        self.num_layers = AutoConfig.from_pretrained(target).num_hidden_layers

    def __call__(self, kind: str, plan: FaultPlan) -> MirrorEngine:
        if (kind, plan) not in self.engines:
            lanes = replace(self.lanes[kind], fault=plan)
            self.engines[kind, plan] = MirrorEngine.load(self.target, self.draft, lanes)
        return self.engines[kind, plan]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines = {}

    def __enter__(self) -> FaultEngines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fault_trial(engines: FaultEngines, seed: int, kinds: tuple[str, ...]) -> FaultTrial:
    """One seeded draft-lane fault: random step, mode, prompt and settings; the output must equal `ar`'s."""
    rng = random.Random(seed)
    kind = rng.choice(kinds)
    mode = rng.choice(("raise", "exit")) if kind == "process" else "raise"  # "exit" would end this very process
    decoder = rng.choice(("sd", "mirror"))
    prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 10)))
    greedy = rng.random() < 0.5
    sampling = SamplingConfig(0.0 if greedy else round(rng.uniform(0.3, 1.5), 2), rng.choice((0, 0, 5, 20)),
                              rng.choice((1.0, 1.0, 0.9)), rng.randrange(1000), "exact")
    spec = SpecConfig(rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, engines.num_layers - 1))
    max_new = rng.randint(24, 40)   # ≥ 4 verification steps even when every window is accepted
    step = rng.randint(0, 3)
    engine = engines(kind, FaultPlan(step, mode))
    ref = engine.generate(Request(prompt, "ar", max_new, sampling, spec, stop_at_eos=False))  # ar needs no draft lane
    end = engine.generate(Request(prompt, decoder, max_new, sampling, spec, stop_at_eos=False))
    ok = (list(end.token_ids) == list(ref.token_ids) and end.error is None and end.fallback is not None
          and "draft lane failed" in end.fallback)
    detail = "" if ok else f"tokens {list(end.token_ids)} vs ar {list(ref.token_ids)}; fallback {end.fallback!r}"
    return FaultTrial(seed, kind, mode, decoder, step, ok, detail)


class TargetFault:
    """Make the target runner's n-th pass from now raise (a target-lane failure); undo on exit. A pass starts with
    `forward` or, split at the early exit, with `forward_to_exit`: both are counted."""

    STARTS = ("forward", "forward_to_exit")

    def __init__(self, engine: MirrorEngine, at_call: int):
        self.engine, self.at_call, self.calls = engine, at_call, 0

    def __enter__(self):
        for name in self.STARTS:
            setattr(self.engine.target, name, self._failing(getattr(self.engine.target, name)))
        return self

    def _failing(self, real):
        def failing(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at_call:
                raise RuntimeError(f"injected target-lane fault at forward {self.calls}")
            return real(*args, **kwargs)
        return failing

    def __exit__(self, *exc):
        for name in self.STARTS:
            delattr(self.engine.target, name)  # the class's methods again


@dataclass
class Hold:
    """A run held at a known step: its target pass of `step` waits for the run's stop flag (at most `timeout_s`),
    so that a cancel sent while it waits arrives at that step, however fast the CPU."""
    decoder: str
    step: int
    timeout_s: float
    stop: threading.Event | None = None   # the held run's stop flag (None until its stream starts)
    passes: int = 0                       # target passes the held run has begun (the first is its prefill)
    held: threading.Event = field(default_factory=threading.Event)  # set when the pass of `step` waits
    released_at: float | None = None      # time.monotonic() when it went on
    released_by_stop: bool = False        # it went on because its stop flag was set (not at the timeout)
    events: list = field(default_factory=list)  # the held run's events, in order

    def steps_from_hold(self) -> dict[str, int]:
        """The steps each lane worked on from the held one on (the step the cancel arrived in counts as one): the
        target's verification passes (StepRecords) and the draft lane's windows (its spans' steps)."""
        target = {e.step for e in self.events if isinstance(e, StepRecord) and e.step >= self.step}
        draft = {e.step for e in self.events
                 if isinstance(e, SpanEvent) and e.lane == LANE_DRAFT and e.step >= self.step}
        return {LANE_TARGET: len(target), LANE_DRAFT: len(draft)}


class WatchedLoad:
    """An EngineLoader `load` that logs (time, event type) of every stream as its consumer takes the events, "stream"
    when one is asked for, and "closing"/"closed" when one is closed: closed is stamped once the engine has stopped
    and both lanes are idle. `hold` stops the next run of a decoder at a known step until its stop flag is set."""

    def __init__(self) -> None:
        self.log: list[tuple[float, str]] = []
        self.last_hold: Hold | None = None  # the latest `hold` (a run is held at most once)

    def hold(self, decoder: str, step: int, timeout_s: float = 30.0) -> Hold:
        """Hold the next run of `decoder` of more than one token (not the page's one-token warm prefill) in its
        target pass of `step`."""
        self.last_hold = Hold(decoder, step, timeout_s)
        return self.last_hold

    def __call__(self, target: str, draft: str | None, lanes: LaneConfig) -> MirrorEngine:
        engine = MirrorEngine.load(target, draft, lanes)
        stream, log = engine.stream, self.log
        for name in TargetFault.STARTS:  # where each target pass begins
            setattr(engine.target, name, self._holding(getattr(engine.target, name)))

        def watched(request, stop=None):
            stop = stop or threading.Event()
            inner = stream(request, stop)
            log.append((time.monotonic(), "stream"))  # a stream asked for (its events are logged as they are taken)
            hold = self.last_hold
            if hold and hold.stop is None and hold.decoder == request.decoder and request.max_new_tokens > 1:
                hold.stop = stop  # this run is the held one
            else:
                hold = None

            def logged(event):
                stopped = ":stopped" if getattr(event, "stopped", False) else ""
                log.append((time.monotonic(), type(event).__name__ + stopped))
                if hold is not None:
                    hold.events.append(event)
                return event

            def gen():
                ended = False
                try:
                    for event in inner:
                        yield logged(event)
                    ended = True
                finally:
                    log.append((time.monotonic(), "closing"))
                    if not ended:  # closed early: what inner.close() does (set the flag, take what the engine still
                        stop.set()  # sends until both lanes are idle), the events it sends logged too
                        for event in inner:
                            logged(event)
                    log.append((time.monotonic(), "closed"))
            return gen()

        engine.stream = watched
        return engine

    def _holding(self, real):
        """The target pass `real`, held at the armed run's step until that run's stop flag is set."""
        def pass_(*args, **kwargs):
            hold = self.last_hold
            if hold is not None and hold.stop is not None and hold.released_at is None:
                hold.passes += 1
                if hold.passes == hold.step + 1:  # pass 1 is the prefill; pass k + 1 verifies step k
                    hold.held.set()
                    hold.released_by_stop = hold.stop.wait(hold.timeout_s)
                    hold.released_at = time.monotonic()
            return real(*args, **kwargs)
        return pass_

    def count(self, kind: str, after: float = 0.0) -> int:
        return sum(1 for t, k in self.log if k == kind and t > after)

    def first(self, kind: str, after: float = 0.0) -> float | None:
        return next((t for t, k in self.log if k == kind and t > after), None)

    def last(self, kind: str, before: float) -> float:
        """When the latest `kind` before `before` was logged (e.g. the start of the run in flight: the page runs
        each request once untimed, for one token, just before it)."""
        return max(t for t, k in self.log if k == kind and t < before)

    def wait(self, kind: str, n: int = 1, after: float = 0.0, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.count(kind, after) < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True


DISCONNECT_CLIENT = """
import json, sys, threading, time
import httpx
base, values = sys.argv[1].rstrip("/"), json.loads(sys.argv[2])
session = "tab" + str(time.time_ns())
http = httpx.Client(timeout=None)
def heartbeat():  # what an open browser tab keeps open; dropping it is how Gradio learns the tab is gone
    with http.stream("GET", base + "/gradio_api/heartbeat/" + session) as r:
        for _ in r.iter_lines():
            pass
threading.Thread(target=heartbeat, daemon=True).start()
config = http.get(base + "/config").json()
fn = next(i for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "run")
http.post(base + "/gradio_api/queue/join", json={"data": [None, *values], "fn_index": fn, "session_hash": session,
                                                 "event_data": None, "trigger_id": None}).raise_for_status()
with http.stream("GET", base + "/gradio_api/queue/data", params={"session_hash": session}) as r:
    for _ in r.iter_lines():
        pass
"""


@dataclass(frozen=True)
class Cut:
    """What a cancel sent while a run was held (WatchedLoad.hold) did to it: cut_at_hold."""
    ok: bool                        # the run was cut within one step and the lanes are free
    detail: str                     # the figures, or what went wrong
    flag_ms: float | None = None    # the cancel sent → the run's stop flag set
    freed_ms: float | None = None   # the cancel sent → both lanes idle (the held step run to its end first)
    steps: dict[str, int] = field(default_factory=dict)  # lane → steps it worked on after the cancel


def cancel_trial(url: str, watch: WatchedLoad, values: list, decoder: str = "sd", step: int = 5) -> Cut:
    """gradio_client starts a long run and cancels it (POST /cancel, as Stop's `cancels=` does) while its `decoder`
    run is held at `step` (WatchedLoad.hold): the cancel sets the run's stop flag at once, each lane ends the step it
    is in and starts no other, the comparison starts no other decoder, and Gradio answers once the lanes are free."""
    from gradio_client import Client

    hold = watch.hold(decoder, step)
    client = Client(url, verbose=False)
    try:
        job = client.submit(*values, api_name="/run")
        if not hold.held.wait(120):
            return Cut(False, f"the {decoder} run never reached step {step}")
        t_cancel = time.monotonic()
        cancel = threading.Thread(target=job.cancel)  # POST /cancel, answered once the handler has closed
        cancel.start()
        if not watch.wait("closed", after=t_cancel, timeout=hold.timeout_s + 30):
            return Cut(False, f"the lanes were not freed within {hold.timeout_s + 30:.0f} s of the cancel")
        cancel.join(timeout=30)
        if cancel.is_alive():
            return Cut(False, "Gradio's cancel did not answer within 30 s of the lanes being freed")
        if watch.count("stream", after=t_cancel):
            return Cut(False, "the comparison went on to its next decoder after the cancel")
        return cut_at_hold(hold, t_cancel, watch.first("closed", after=t_cancel), "cancel")
    finally:
        client.close()


def disconnect_trial(url: str, watch: WatchedLoad, values: list, decoder: str = "mirror", step: int = 5) -> Cut:
    """A browser-like client process (heartbeat + queue streams) starts a long run; while its `decoder` run is held
    at `step` (WatchedLoad.hold) the process is killed (a closed tab): Gradio's heartbeat drops, the page's unload
    handler sets the run's stop flag, and each lane ends the step it is in and starts no other."""
    import subprocess
    import sys

    hold = watch.hold(decoder, step)
    proc = subprocess.Popen([sys.executable, "-c", DISCONNECT_CLIENT, url, json.dumps(values)],
                            stdout=subprocess.PIPE, text=True)
    try:
        if not hold.held.wait(120):
            return Cut(False, f"the {decoder} run never reached step {step}")
        t_kill = time.monotonic()
        proc.kill()
        if not watch.wait("closed", 1, after=t_kill, timeout=hold.timeout_s + 30):
            return Cut(False, f"the lanes were not freed within {hold.timeout_s + 30:.0f} s of the disconnect")
        return cut_at_hold(hold, t_kill, watch.first("closed", after=t_kill), "disconnect")
    finally:
        proc.kill()
        proc.wait()


def cut_at_hold(hold: Hold, t_sent: float, t_freed: float, what: str) -> Cut:
    """Whether a cancel sent at `t_sent` while `hold` waited cut its run within one step: the cancel set the run's
    stop flag while the step was held, the engine ended the run at that flag (its last event a stopped RunEnd), and
    each lane worked on at most the step in flight after it."""
    if not hold.released_by_stop:
        return Cut(False, f"the {what} did not set the run's stop flag in {hold.timeout_s:.0f} s (held at step "
                          f"{hold.step})")
    end = hold.events[-1] if hold.events else None
    if not (isinstance(end, RunEnd) and end.stopped):
        what_ended = "it ran to its end" if isinstance(end, RunEnd) else f"its last event: {type(end).__name__}"
        return Cut(False, f"the engine did not end the run at its stop flag ({what_ended})")
    flag_ms, freed_ms, steps = (hold.released_at - t_sent) * 1e3, (t_freed - t_sent) * 1e3, hold.steps_from_hold()
    detail = (f"stop flag set {flag_ms:.0f} ms and lanes free {freed_ms:.0f} ms after the {what}; steps each lane "
              f"worked on after it: {steps}")
    return Cut(max(steps.values()) <= 1, detail, flag_ms, freed_ms, steps)


# -- load ------------------------------------------------------------------------------------------
@dataclass
class SoakResult:
    runs: int
    rss_growth: float           # (RSS after all runs − RSS after warm-up) / RSS after warm-up
    threads_left: int           # threads alive after − before (after warm-up)
    children_left: int          # child processes alive after − before
    errors: list[str] = field(default_factory=list)


def app_run(url: str, values: list, raw: bool = False, timeout: float = 120) -> list:
    """The /run endpoint's last output (in ui.views.OUTPUT_NAMES order: read it with ui.views.by_name).
    raw: post the JSON a browser would (JSON.stringify escapes a lone surrogate as \\udcff, which httpx
    refuses to encode) and read the queue's event stream."""
    if not raw:
        from gradio_client import Client

        return list(Client(url, verbose=False).submit(*values, api_name="/run"))[-1]
    import httpx

    base = url.rstrip("/")
    with httpx.Client(timeout=timeout) as http:
        config = http.get(f"{base}/config").json()
        fn_index = next(i for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "run")
        session = f"raw{random.randrange(1 << 30)}"
        body = {"data": [None, *values], "fn_index": fn_index, "session_hash": session, "event_data": None,
                "trigger_id": None}
        http.post(f"{base}/gradio_api/queue/join", content=json.dumps(body),
                  headers={"content-type": "application/json"}).raise_for_status()
        last = None
        with http.stream("GET", f"{base}/gradio_api/queue/data", params={"session_hash": session}) as events:
            for line in events.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("msg") in ("process_generating", "process_completed") and msg.get("output", {}).get("data"):
                    last = msg["output"]["data"]
                if msg.get("msg") == "process_completed":
                    return last
    raise RuntimeError("the run did not complete")


def close_demo(demo) -> None:
    """demo.close(), with the app's asyncio stop event set on the server's own event loop first (ui.layout.end_streams:
    Gradio 6's close() sets it from the calling thread, and close() then raised "deque mutated during iteration" once
    in CI, before it closed the server)."""
    from ui.layout import end_streams

    end_streams(demo).wait(timeout=10)
    demo.close()


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def back_to_back(loader, target: str, draft: str, runs: int, warmup: int, seed: int = 0) -> SoakResult:
    """`runs` comparisons through the app's handler (run_comparison) in this process, one Session each."""
    from ui.session import Session
    from ui.settings import settings_from_ui

    rng = random.Random(seed)
    errors: list[str] = []
    base_rss = base_threads = base_children = 0
    me = psutil.Process()
    for i in range(warmup + runs):
        if i == warmup:
            base_rss, base_threads, base_children = rss(), threading.active_count(), len(me.children(recursive=True))
        prompt = ", ".join(str(rng.randrange(VOCAB)) for _ in range(rng.randint(1, 8)))
        settings = settings_from_ui(page_values(prompt=prompt, target=target, draft=draft, decoders=["ar", "mirror"],
                                                gamma=rng.randint(1, 4), kappa=rng.randint(1, 4),
                                                max_new_tokens=rng.randint(8, 24)))
        session = Session()
        for _ in run_comparison_ticks(loader, session, settings):
            pass
        ar, mirror = session.runs.get("ar"), session.runs.get("mirror")
        if session.error or ar is None or mirror is None or ar.end.token_ids != mirror.end.token_ids:
            errors.append(f"run {i}: {session.error or 'ar and mirror differ'}")
        session.close()
    return SoakResult(runs, (rss() - base_rss) / base_rss, threading.active_count() - base_threads,
                      len(me.children(recursive=True)) - base_children, errors)


def run_comparison_ticks(loader, session, settings):
    from ui.streaming import run_comparison

    return run_comparison(loader, session, settings, settle_s=0.0)


@dataclass
class ClientsResult:
    tried: int
    ok: int
    max_rank: int               # the highest queue position any client was told (0 = at the front)
    errors: list[str] = field(default_factory=list)


TEXT_OUTPUTS = {"ar": "ar_text", "mirror": "mirror_text"}  # the copyable text of each column in the /run outputs


def concurrent_clients(url: str, target: str, draft: str, n: int, max_new: int = 16, seed: int = 0) -> ClientsResult:
    """n gradio_client users, each with its own prompt: first alone (the solo runs), then all at once."""
    from gradio_client import Client

    from ui.views import by_name

    rng = random.Random(seed)
    prompts = [", ".join(str(rng.randrange(VOCAB)) for _ in range(rng.randint(2, 8))) for _ in range(n)]

    def values(prompt):
        return run_args(page_values(prompt=prompt, target=target, draft=draft, decoders=["ar", "mirror"], gamma=3,
                                    kappa=2, max_new_tokens=max_new))

    alone = Client(url, verbose=False)
    solo = [by_name(list(alone.submit(*values(p), api_name="/run"))[-1]) for p in prompts]
    clients = [Client(url, verbose=False) for _ in range(n)]
    jobs = [c.submit(*values(p), api_name="/run") for c, p in zip(clients, prompts)]
    max_rank = 0
    deadline = time.monotonic() + 300
    while not all(j.done() for j in jobs) and time.monotonic() < deadline:
        for j in jobs:
            rank = j.status().rank
            max_rank = max(max_rank, rank or 0)
        time.sleep(0.02)
    errors, failed = [], set()
    for i, (job, alone) in enumerate(zip(jobs, solo)):
        final = by_name(job.outputs()[-1]) if job.outputs() else None
        if final is None or "Done" not in final["status"]:
            errors.append(f"client {i}: {final['status'] if final else 'no output'}")
            failed.add(i)
            continue
        for decoder, k in TEXT_OUTPUTS.items():
            if final[k] != alone[k] or not final[k]:
                errors.append(f"client {i} {decoder}: {final[k]!r} != solo {alone[k]!r}")
                failed.add(i)
    return ClientsResult(n, n - len(failed), max_rank, errors)


def cli_case(case: Case, m: Models, trace: str) -> str | None:
    """Run one catalogue row through `python -m mirror_core generate` (in-process); None when handled:
    exit status 2, one stderr line `error: ...` with the row's phrase, and no trace file written."""
    import contextlib
    import io

    from mirror_core.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["generate", "--lane", "inline", "--trace", trace, *case.cli(m)])
        except SystemExit as exc:  # argparse errors
            rc = exc.code
    lines = err.getvalue().strip().splitlines()
    needle = case.cli_needle or case.needle
    if rc != 2 or len(lines) != 1 or not lines[0].startswith("error:") or needle not in lines[0]:
        return f"rc={rc} stderr={lines!r} (wanted {needle!r})"
    if os.path.exists(trace) or os.path.exists(trace + ".part"):
        return "a trace file was written"
    return None


def expect_mirror_error(call: Callable[[], object], needle: str) -> str | None:
    """None when `call` raises a MirrorError containing `needle` in one line; else what went wrong."""
    try:
        call()
    except MirrorError as exc:
        text = str(exc)
        return None if needle in text and "\n" not in text else f"message {text!r} lacks {needle!r}"
    except Exception as exc:  # noqa: BLE001 - any other exception is the failure being reported
        return f"{type(exc).__name__}: {exc}"
    return "no error raised"
