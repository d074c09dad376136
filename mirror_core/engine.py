"""MirrorEngine: load a target/draft pair onto two lanes once, then stream events per request.

    engine = MirrorEngine.load("path/or/hub-id/target", "path/or/hub-id/draft")
    for event in engine.stream(Request(prompt_ids=(1, 2, 3), decoder="mirror")):
        ...
    engine.close()

The target runs on the engine's target-lane thread (pinned to its cores); the draft on its own
lane (a process by default). No global state: two engines are independent.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, replace
from typing import Iterator

from . import machine
from .config import LaneConfig, MirrorError, Request, SpecConfig, check_prompt_text
from .decode import decode_events
from .decode_state import DecodeState
from .events import Event, RunEnd, RunSettings
from .models.exit_head import ExitHead, find_exit_head
from .lanes import DraftLaneSpec, auto_lanes, make_draft_lane, pinned
from .lanes.faults import fault_plan_from_env
from .models.loading import ModelSpec, encode_text, load_config, load_model, load_tokenizer, local_folder, shared_vocab_size
from .metrics import RunSummary
from .runners import build_runner
from .latency import SpecChoice, StepCosts, choose_spec
from .models.profile import load_profile
from .runners.calibrate import BRANCH_ROWS, WINDOW, Calibration, calibrate_target, step_ms
from .runners.rows import UNCHECKED, RowCheck
from .models.feature_draft import feature_draft_config, is_feature_draft
from .models.vocab import load_vocab_map


@dataclass(frozen=True)
class PairInfo:
    target: str
    draft: str | None
    num_layers: int          # N of the target
    vocab_size: int
    max_context: int | None  # tokens both models can attend over (prompt + new + window)
    lanes: LaneConfig
    target_runner: str = ""  # which runner executes the target (FastLlamaRunner, HFRunner)
    target_rows: RowCheck = UNCHECKED        # the target's call-shape check and row plan (runners/rows.py)
    target_dtype: Calibration | None = None  # the target lane's dtype and its timings (runners/calibrate.py)
    draft_dtype: Calibration | None = None   # the draft lane's, per shape
    draft_runner: str = ""                   # which runner executes the draft ("" without a draft)
    exit_head: dict | None = None            # the trained exit head in use (exit_head.py), None: the logit lens
    draft_vocab: int | None = None           # V_d of a reduced-vocabulary draft (models/vocab.py), None: all of V
    draft_features: int | None = None        # ℓ_e whose hidden states a feature-reading draft reads, None: ids only
    spec_choice: SpecChoice | None = None    # γ, κ the latency model chose for this machine (None: no draft profile)
    whole_machine: tuple[int, float, int, float] | None = None  # the target's step: (lane cores, ms, all cores, ms)

    def spec_note(self, spec: SpecConfig) -> str:
        """Why γ and κ are what they are, when they are this machine's choice ("" otherwise)."""
        c = self.spec_choice
        if c is None or (spec.gamma, spec.kappa) != (c.gamma, c.kappa):
            return ""
        return f"chosen for this machine by the latency model (modelled): {c.why}"

    def default_spec(self) -> SpecConfig:
        """The settings a request gets when it names none: the machine's choice when there is one."""
        c = self.spec_choice
        return SpecConfig() if c is None else SpecConfig(gamma=c.gamma, kappa=c.kappa)

    def describe(self) -> dict:
        """What ran: the CLI's --json `pair` object (the numbers panel's "Ran:" line says the same from the run
        settings)."""
        lanes = self.lanes
        target = {"source": self.target, "device": lanes.target_device, **(
                  {"devices": list(lanes.target_devices)} if lanes.target_devices else {}), "runner": self.target_runner,
                  "dtype": None if self.target_dtype is None else self.target_dtype.label,
                  "layers": self.num_layers, "vocab_size": self.vocab_size}
        draft = None if self.draft is None else {
            "source": self.draft, "device": lanes.draft_device, "runner": self.draft_runner, "lane": lanes.kind,
            "dtype": None if self.draft_dtype is None else self.draft_dtype.label,
            **({"vocab": self.draft_vocab} if self.draft_vocab else {}),
            **({"reads_features_of_layer": self.draft_features} if self.draft_features else {})}
        settings = None if self.spec_choice is None else {
            "gamma": self.spec_choice.gamma, "kappa": self.spec_choice.kappa, "why": self.spec_choice.why,
            "modelled_speedup": self.spec_choice.speedup, "modelled_sd_speedup": self.spec_choice.sd_speedup}
        return {"target": target, "draft": draft, "exit_head": self.exit_head,  # None: the target's own norm + LM head
                "chosen_settings": settings}

    def exit_readout(self, layer: int) -> str:
        """How a run at ℓ_e = layer reads its candidates, in words (the run settings and the page say it)."""
        head = self.exit_head
        if head and head["layer"] == layer:
            return f"trained exit head at layer {layer} over {head['readout_tokens']} tokens"
        return "logit lens (final norm + LM head)" + (f"; the trained head reads layer {head['layer']}" if head else "")


class MirrorEngine:
    """A loaded target/draft pair on two lanes; `stream(request)` yields the run's typed events.

    The target runs on this engine's own thread (the target lane, pinned to its cores); the draft
    runs on its lane (lanes/: a process, a thread or inline). Requests are served one at a time, in
    order; `close()` ends both lanes. The engine sees token ids only: `encode` is a convenience for
    front-ends that have text.
    """

    def __init__(self, target_runner, draft_lane, info: PairInfo, tokenizer, eos_ids: frozenset[int]):
        self.target, self.lane, self.info = target_runner, draft_lane, info
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._target_lane, name="mirror-target-lane", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, target: str, draft: str | None, lanes: LaneConfig | None = None,
             trust_remote_code: bool = False) -> "MirrorEngine":
        lanes = lanes or auto_lanes()
        if lanes.fault.at_step is None:  # the test hook, resolved once here (lanes/faults.py)
            lanes = replace(lanes, fault=fault_plan_from_env(os.environ))
        machine.check(lanes.target_device)
        machine.check(lanes.draft_device)
        target_cfg = load_config(ModelSpec(target, lanes.target_device, trust_remote_code))
        tokenizer = load_tokenizer(target)
        vocab = int(target_cfg.vocab_size)
        contexts = [_context_of(target_cfg)]
        features = None  # a feature-reading draft's FeatureDraftConfig
        if draft is not None and is_feature_draft(local_folder(draft)):
            features = feature_draft_config(local_folder(draft))
            vmap = load_vocab_map(local_folder(draft))
            _check_feature_draft(features, target_cfg, vmap)
            contexts.append(features.max_positions)
        elif draft is not None:
            draft_cfg = load_config(ModelSpec(draft, lanes.draft_device, trust_remote_code), draft=True)
            vmap = load_vocab_map(local_folder(draft))
            vocab = shared_vocab_size(target_cfg, draft_cfg, tokenizer, load_tokenizer(draft),
                                      None if vmap is None else vmap.target_vocab_size)
            contexts.append(_context_of(draft_cfg))
        target_model = load_model(ModelSpec(target, lanes.target_device, trust_remote_code), spread=lanes.target_devices)
        eos_ids = _eos_ids(target_model)
        if lanes.target_devices and lanes.runner == "fast":
            raise MirrorError("the fast runner keeps a model on one device; a target spread over "
                              f"{', '.join(lanes.target_devices)} runs on the generic runner (--runner auto or hf)")
        head = _exit_head(lanes.exit_head, draft, target_model)
        runner = build_runner(target_model, vocab, "hf" if lanes.target_devices else lanes.runner, exit_head=head)
        with pinned(lanes.target_cpus if lanes.target_device == "cpu" else (), lanes.target_threads):
            # with the target lane's threads: the kernels it will run; the dtype first, then its call-shape check
            dtype, rows = calibrate_target(runner, vocab, lanes.dtype, target_model.config)
        whole = None
        every = machine.usable_cpus()
        if lanes.target_device == "cpu" and lanes.target_cpus and len(every) > len(lanes.target_cpus):
            # the target lane was given some of the cores: its step there and on all of them, timed alike
            with pinned(lanes.target_cpus, lanes.target_threads):
                lane_ms = step_ms(runner)
            with pinned(every, len(every)):  # the whole-machine baseline's step (AR on every core)
                whole = (len(lanes.target_cpus), lane_ms, len(every), step_ms(runner))
        lane = None
        known = [c for c in contexts if c]
        if draft is not None:
            feature_floats = 0 if features is None else (min(known) + 2) * features.hidden_size  # the prompt's, at most
            lane = make_draft_lane(lanes, DraftLaneSpec(draft, lanes.draft_device, vocab, lanes.draft_threads,
                                                        lanes.draft_cpus, trust_remote_code, lanes.runner, lanes.dtype,
                                                        lanes.fault, feature_floats))
        exit_layer = features.feature_layer if features else head.layer if head else max(1, runner.num_layers // 2)
        choice = None if lane is None else _choose_spec(dtype, lane.calibration, load_profile(local_folder(draft)),
                                                        exit_layer / runner.num_layers)
        info = PairInfo(target=target, draft=draft, num_layers=runner.num_layers, vocab_size=vocab,
                        max_context=min(known) if known else None, lanes=lanes, target_runner=type(runner).__name__,
                        target_rows=rows, target_dtype=dtype,
                        draft_dtype=None if lane is None else lane.calibration,
                        draft_runner="" if lane is None else lane.runner_name,
                        exit_head=None if head is None else {
                            "layer": head.layer, "readout_tokens": int(head.ids.numel()),
                            "source": lanes.exit_head if lanes.exit_head != "auto" else local_folder(draft)},
                        draft_vocab=None if draft is None or vmap is None else vmap.size,
                        draft_features=None if features is None else features.feature_layer, spec_choice=choice,
                        whole_machine=whole)
        return cls(runner, lane, info, tokenizer, eos_ids)

    # -- requests --------------------------------------------------------------------------
    def validate(self, request: Request) -> int:
        """Check a request against the loaded pair; returns the early-exit layer ℓ_e it will use."""
        n = self.info.num_layers
        head = self.info.exit_head
        default = head["layer"] if head else max(1, n // 2)  # a trained exit head reads its own layer
        exit_layer = request.spec.exit_layer if request.spec.exit_layer is not None else default
        if not 1 <= exit_layer <= n - 1:
            raise MirrorError(f"exit layer must be in 1..{n - 1} for this {n}-layer target, got {exit_layer}")
        reads = self.info.draft_features
        if reads is not None and request.decoder != "ar" and exit_layer != reads:
            raise MirrorError(f"this draft reads the target's hidden states after layer {reads}, so the exit layer is "
                              f"{reads} (got {exit_layer}); load a token-only draft to vary it")
        if request.decoder != "ar" and self.lane is None:
            raise MirrorError(f"decoder {request.decoder!r} needs a draft model; load one or use 'ar'")
        bad = [t for t in request.prompt_ids if t >= self.info.vocab_size]
        if bad:
            raise MirrorError(f"prompt id {bad[0]} is outside the vocabulary (0..{self.info.vocab_size - 1})")
        need = len(request.prompt_ids) + request.max_new_tokens + request.spec.gamma + 2
        if self.info.max_context and need > self.info.max_context:
            raise MirrorError(f"prompt ({len(request.prompt_ids)} tokens) + max new tokens ({request.max_new_tokens}) "
                              f"+ window ({request.spec.gamma + 2}) exceeds the models' context of "
                              f"{self.info.max_context} tokens; refused (prompts are never truncated): "
                              "shorten the prompt or lower max new tokens"
                              + (f" (at most {room} with this prompt and γ)" if (room := self.info.max_context
                                 - len(request.prompt_ids) - request.spec.gamma - 2) > 0 else ""))
        return exit_layer

    def encode(self, text: str, chat: bool = True) -> tuple[int, ...]:
        """Prompt text → token ids with the target's tokenizer, after the text checks (MirrorError); with chat,
        in the target's chat template when it has one (loading.encode_text)."""
        check_prompt_text(text)
        if self.tokenizer is None:
            raise MirrorError(f"{self.info.target!r} has no tokenizer; give prompt token ids instead of text")
        ids = encode_text(self.tokenizer, text, chat)
        if not ids:
            raise MirrorError("the prompt encodes to no tokens")
        return ids

    def stream(self, request: Request, stop: threading.Event | None = None) -> Iterator[Event]:
        """Validate now (raising MirrorError), then return an iterator of events ending in RunEnd."""
        exit_layer = self.validate(request)
        return self._stream(request, exit_layer, stop or threading.Event())

    def generate(self, request: Request, stop: threading.Event | None = None) -> RunEnd:
        """The non-streaming call: the last event of stream()."""
        return list(self.stream(request, stop))[-1]

    def _stream(self, request: Request, exit_layer: int, stop: threading.Event) -> Iterator[Event]:
        out: queue.Queue = queue.Queue()
        with self._lock:
            self._jobs.put((request, exit_layer, stop, out))
            finished = False
            try:
                while (batch := out.get()) is not None:
                    yield from batch
                finished = True
            finally:  # closed early: stop the run within one step and wait until no lane is busy
                if not finished:
                    stop.set()
                    while out.get() is not None:
                        pass

    def _target_lane(self) -> None:
        """The target lane's thread: pinned once, then runs one request after another."""
        lanes = self.info.lanes
        with pinned(lanes.target_cpus if lanes.target_device == "cpu" else (), lanes.target_threads):
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                request, exit_layer, stop, out = job
                info = self.info
                settings = RunSettings(request=request, lanes=lanes, exit_layer=exit_layer, target=info.target,
                                       draft=info.draft, target_runner=info.target_runner,
                                       target_rows=info.target_rows, target_dtype=info.target_dtype,
                                       draft_dtype=info.draft_dtype, exit_readout=info.exit_readout(exit_layer),
                                       draft_vocab=info.draft_vocab, draft_features=info.draft_features,
                                       spec_note=info.spec_note(request.spec), whole_machine=info.whole_machine)
                try:
                    run = DecodeState(request, self.target, exit_layer, self.eos_ids, stop, settings,
                                      features=info.draft_features is not None and request.decoder != "ar")
                    for batch in decode_events(run, self.lane):
                        out.put(batch)
                except Exception as exc:  # never leave a consumer without a RunEnd
                    out.put([RunEnd((), RunSummary(request.spec.gamma), None, error=f"{type(exc).__name__}: {exc}")])
                finally:
                    if self.lane is not None:
                        self.lane.drain()
                    out.put(None)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)
        if self.lane is not None:
            self.lane.close()

    def __enter__(self) -> "MirrorEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exit_head(choice: str, draft: str | None, target_model) -> ExitHead | None:
    """The target's early-exit head (exit_head.py) for LaneConfig.exit_head: "none"; a folder (it must fit the
    target); "auto", the draft folder's head when there is one and it fits (else the logit lens)."""
    if choice == "none":
        return None
    folder = local_folder(draft) if choice == "auto" else choice
    if choice != "auto" and not os.path.isdir(choice):
        raise MirrorError(f"exit head folder {choice!r} does not exist")
    weights = find_exit_head(folder)
    if weights is None:
        if choice != "auto":
            raise MirrorError(f"{choice!r} holds no exit head (exit_head.json and exit_head.safetensors)")
        return None
    why = weights.matches(target_model.config)
    if why:
        if choice != "auto":
            raise MirrorError(f"the exit head in {choice!r} does not fit this target: {why}")
        return None
    lm_head = target_model.get_output_embeddings().weight                                # [V, H]
    return ExitHead(weights, lm_head, float(target_model.config.rms_norm_eps))


def _choose_spec(target: Calibration | None, draft: Calibration | None, profile, exit_share: float) -> SpecChoice | None:
    """γ and κ for this machine: the latency model over the lanes' timed step costs and the draft's profile; None
    when the draft has no profile or a lane's dtype was forced without timing."""
    if profile is None or target is None or draft is None:
        return None
    shapes = (target.ms(target.sequence, "step"), target.ms(target.sequence, "window"),
              draft.ms(draft.sequence, "step"), draft.ms(draft.rows, "rows"))
    if any(v is None for v in shapes):
        return None
    t_ar, t_window, d_step, d_rows = shapes
    return choose_spec(StepCosts(t_ar, t_window, WINDOW, exit_share, d_step, d_rows, BRANCH_ROWS, WINDOW - 1), profile)


def _check_feature_draft(cfg, target_cfg, vmap) -> None:
    """A feature-reading draft fits a target of its hidden size, depth and vocabulary (it reads its features)."""
    mine = (cfg.hidden_size, cfg.target_layers, cfg.target_vocab_size)
    theirs = (int(target_cfg.hidden_size), int(target_cfg.num_hidden_layers), int(target_cfg.vocab_size))
    if mine != theirs:
        raise MirrorError(f"the feature-reading draft was trained for a target with hidden size, layers, vocabulary "
                          f"{mine}, not {theirs}")
    if vmap is None or vmap.target_vocab_size != theirs[2]:
        raise MirrorError("a feature-reading draft needs its draft_vocab.json for this target's vocabulary")


def _context_of(config) -> int | None:
    limits = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions", "sliding_window")]
    limits = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(limits) if limits else None


def _eos_ids(model) -> frozenset[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
