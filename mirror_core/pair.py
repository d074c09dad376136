"""A loaded pair: PairInfo (what a target/draft pair is and what its load measured) and the phases of
MirrorEngine.load that find it out: the lane plan; both models' configs checked together (no weights yet); the target
and its early-exit readout; its format and call-shape check timed where it runs, and the whole-machine baseline
(target_timing.py); the draft lane's spec; γ, κ chosen for this machine."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Mapping

from . import machine
from .config import MAX_GAMMA, DEFAULT_GAMMA, DEFAULT_KAPPA, LaneConfig, MirrorError, Request, SpecConfig
from .events import RunSettings
from .lanes import DraftLaneSpec, auto_lanes
from .lanes.faults import fault_plan_from_env
from .latency import SpecChoice, StepOverheads, choose_spec, step_costs
from .models.exit_head import choose_exit_head
from .models.feature_draft import check_feature_draft, feature_draft_config, is_feature_draft
from .models.gguf_blocks import read_blocks
from .models.loading import (ModelSpec, context_of, eos_ids, load_config, load_model, load_tokenizer, local_folder,
                              shared_vocab_size)
from .models.prepared import find_gguf
from .models.profile import load_profile
from .models.vocab import load_vocab_map
from .records import UNCHECKED, Calibration, ExitHeadInfo, Roofline, RowCheck, WholeMachine
from .runners import build_runner
from .runners.calibrate import format_name, pair_format
from .target_timing import TargetTiming, roofline_of

@dataclass(frozen=True)
class PairInfo:
    """What a loaded pair is and what its load measured (records.py); the one home of the defaults the pair
    decides (`resolve`: γ, κ and ℓ_e a request left out)."""

    target: str
    draft: str | None
    num_layers: int          # N of the target
    vocab_size: int
    max_context: int | None  # tokens both models can attend over (prompt + new + window)
    lanes: LaneConfig
    target_runner: str = ""  # which runner executes the target (FastLlamaRunner, HFRunner)
    target_rows: RowCheck = UNCHECKED        # the target's call-shape check and row plan (runners/exactness.py)
    target_dtype: Calibration | None = None  # the target lane's dtype and its timings (runners/calibrate.py)
    draft_dtype: Calibration | None = None   # the draft lane's, per shape
    draft_runner: str = ""                   # which runner executes the draft ("" without a draft)
    exit_head: ExitHeadInfo | None = None    # the trained exit head in use (exit_head.py), None: the logit lens
    draft_vocab: int | None = None           # V_d of a reduced-vocabulary draft (models/vocab.py), None: all of V
    draft_features: int | None = None        # ℓ_e whose hidden states a feature-reading draft reads, None: ids only
    spec_choice: SpecChoice | None = None    # γ, κ the latency model chose for this machine (None: no draft profile)
    overheads: StepOverheads | None = None   # a step's costs beyond passes and rollouts, timed at load (None: not)
    whole_machine: WholeMachine | None = None  # the target's step on its lane's cores and on all of them
    roofline: Roofline | None = None         # the target's kernel, bytes per token and forward by rows vs. the roofline
    serial_cpus: tuple[int, ...] = ()        # where ar and sd run the target (every core, LaneConfig.serial_cores);
    #                                          () = on the target lane's own cores
    lend_cpus: tuple[int, ...] = ()          # where mirror runs the target's layers 1..ℓ_e (LaneConfig.lend_cores)
    target_formats: tuple[str, ...] = ()     # the formats the target's runner offers (DTYPE_CHOICES' names)
    pair_format: str = ""                    # the target's format where none is asked for (calibrate.pair_format)

    def default_exit_layer(self) -> int:
        """ℓ_e where a request names none: the layer a feature-reading draft reads (it can read no other), else the
        trained exit head's layer, else N // 2 of the target (the paper's default)."""
        if self.draft_features is not None:
            return self.draft_features
        return self.exit_head.layer if self.exit_head is not None else max(1, self.num_layers // 2)

    def resolve(self, spec: SpecConfig) -> SpecConfig:
        """`spec` with what it left out (None) decided by this pair: γ and κ the latency model chose for this machine
        (DEFAULT_GAMMA, DEFAULT_KAPPA without a draft profile), ℓ_e `default_exit_layer`."""
        c = self.spec_choice
        return replace(spec, gamma=spec.gamma if spec.gamma is not None else c.gamma if c else DEFAULT_GAMMA,
                       kappa=spec.kappa if spec.kappa is not None else c.kappa if c else DEFAULT_KAPPA,
                       exit_layer=spec.exit_layer if spec.exit_layer is not None else self.default_exit_layer())

    def spec_note(self, spec: SpecConfig) -> str:
        """Why γ and κ are what they are, when they are this machine's choice ("" otherwise)."""
        c = self.spec_choice
        if c is None or (spec.gamma, spec.kappa) != (c.gamma, c.kappa):
            return ""
        return f"chosen for this machine by the latency model (modelled): {c.why}"

    def run_settings(self, request: Request) -> RunSettings:
        """What RunStart records for a request resolved on this pair (the fields the two records share copied)."""
        exit_layer, note = request.spec.exit_layer, self.spec_note(request.spec)
        return RunSettings(request=request, exit_layer=exit_layer, exit_readout=self.exit_readout(exit_layer),
                           spec_note=note, spec_modelled=self.spec_choice.speedup if note else None,
                           **{name: getattr(self, name) for name in _SHARED_WITH_RUN_SETTINGS})

    def window_steps(self) -> tuple[float, ...]:
        """The target's forward of 1, 2, .. MAX_GAMMA + 1 rows in one-row steps, timed at load on the target lane
        (Calibration.window_ms; () where it was not): the cost each step's window is chosen by (draft_choice.py)."""
        cal = self.target_dtype
        ms = [] if cal is None else [cal.window_ms(cal.sequence, m) for m in range(1, MAX_GAMMA + 2)]
        return () if not ms or None in ms else tuple(round(v / ms[0], 4) for v in ms)

    def step_s(self) -> float:
        """The target's one-row step timed at load on the target lane (s; 0 where it was not): window_steps' unit."""
        cal = self.target_dtype
        ms = None if cal is None else cal.window_ms(cal.sequence, 1)
        return 0.0 if ms is None else ms / 1e3

    def plain_step_s(self) -> float:
        """A plain target step where ar, sd and Mirror-SD's windows of zero run it (s; 0 where it was not timed): the
        whole machine's step where serial_cpus names every core, else the lane's. The draft lane's chooser prices a
        window of zero by it until the run has timed its own plain steps (step_s's row curve, timed on the lane's
        cores, does not carry over to every core: there one row is bandwidth-bound and a window more compute-bound)."""
        whole = self.whole_machine
        return whole.all_ms / 1e3 if whole is not None and self.serial_cpus else self.step_s()

    def describe(self) -> dict:
        """What ran: the CLI's --json `pair` object (the numbers panel's "Ran:" line says the same from the run
        settings)."""
        lanes = self.lanes
        target = {"source": self.target, "device": lanes.target_device, **(
                  {"devices": list(lanes.target_devices)} if lanes.target_devices else {}), "runner": self.target_runner,
                  "dtype": None if self.target_dtype is None else self.target_dtype.label,
                  "layers": self.num_layers, "vocab_size": self.vocab_size,
                  "roofline": None if self.roofline is None else self.roofline.to_dict()}
        draft = None if self.draft is None else {
            "source": self.draft, "device": lanes.draft_device, "runner": self.draft_runner, "lane": lanes.kind,
            "dtype": None if self.draft_dtype is None else self.draft_dtype.label,
            **({"vocab": self.draft_vocab} if self.draft_vocab else {}),
            **({"reads_features_of_layer": self.draft_features} if self.draft_features else {})}
        settings = None if self.spec_choice is None else {
            "gamma": self.spec_choice.gamma, "kappa": self.spec_choice.kappa, "why": self.spec_choice.why,
            "modelled_speedup": self.spec_choice.speedup, "modelled_sd_speedup": self.spec_choice.sd_speedup,
            "overheads_ms": None if self.overheads is None else asdict(self.overheads)}
        whole = self.whole_machine
        cores = len(self.serial_cpus) or (len(lanes.target_cpus) if lanes.target_device == "cpu" else 0)
        machine = None if whole is None else {
            "lane_step_ms": whole.lane_ms, "every_core_step_ms": whole.all_ms, "spread": whole.spread,
            "busy": whole.busy, "retimed": whole.retimed, "ar_cores": cores}
        return {"target": target, "draft": draft, "chosen_settings": settings,
                "exit_head": None if self.exit_head is None else asdict(self.exit_head),  # None: the logit lens
                "whole_machine": machine}  # the load's timing of ar's step: on the lane's cores and on every core

    def exit_readout(self, layer: int) -> str:
        """How a run at ℓ_e = layer reads its candidates, in words (the run settings and the page say it)."""
        head = self.exit_head
        if head and head.layer == layer:
            return f"trained exit head at layer {layer} over {head.readout_tokens} tokens"
        return "logit lens (final norm + LM head)" + (f"; the trained head reads layer {head.layer}" if head else "")


# RunSettings' fields that are the pair's (lanes, sources, runners, dtypes, row check, ...), copied as they are
_SHARED_WITH_RUN_SETTINGS = tuple(f.name for f in fields(RunSettings) if f.name in {g.name for g in fields(PairInfo)})


# -- the phases of MirrorEngine.load -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairFiles:
    """What the pair's configs say before any weights load: the vocabulary both index alike, the context both
    attend over, and what kind of draft it is."""

    tokenizer: object | None     # the target's (None: prompts as ids)
    vocab: int                   # V: the ids both models share
    max_context: int | None      # tokens both models can attend over
    features: object | None      # a feature-reading draft's FeatureDraftConfig (None: a token-only draft or none)
    vmap: object | None          # a reduced-vocabulary draft's VocabMap


@dataclass(frozen=True)
class LoadedTarget:
    model: object                # the transformers model (its config: the calibration cache's key)
    runner: object               # the runner the target lane drives (build_runner)
    eos_ids: frozenset[int]
    head: ExitHeadInfo | None    # the trained exit head the runner reads ℓ_e with (None: the logit lens)

    @property
    def config(self):
        return self.model.config


def lane_plan(lanes: LaneConfig | None, environ: Mapping[str, str]) -> LaneConfig:
    """The lane plan (automatic when none is given) with the fault hook resolved once from `environ` (the environment
    MirrorEngine.load reads: lanes/faults.py), its devices checked to exist."""
    lanes = lanes or auto_lanes()
    if lanes.fault.at_step is None:
        lanes = replace(lanes, fault=fault_plan_from_env(environ))
    machine.check(lanes.target_device)
    machine.check(lanes.draft_device)
    return lanes


def read_pair(target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool) -> PairFiles:
    """Both models' configs and tokenizers, checked to fit together, before any weights load."""
    target_cfg = load_config(ModelSpec(target, lanes.target_device, trust_remote_code))
    tokenizer = load_tokenizer(target)
    vocab = int(target_cfg.vocab_size)
    contexts = [context_of(target_cfg)]
    features = vmap = None
    if draft is not None and is_feature_draft(local_folder(draft)):
        features = feature_draft_config(local_folder(draft))
        vmap = load_vocab_map(local_folder(draft))
        check_feature_draft(features, target_cfg, vmap)
        contexts.append(features.max_positions)
    elif draft is not None:
        draft_cfg = load_config(ModelSpec(draft, lanes.draft_device, trust_remote_code), draft=True)
        vmap = load_vocab_map(local_folder(draft))
        vocab = shared_vocab_size(target_cfg, draft_cfg, tokenizer, load_tokenizer(draft),
                                  None if vmap is None else vmap.target_vocab_size)
        contexts.append(context_of(draft_cfg))
    known = [c for c in contexts if c]
    return PairFiles(tokenizer, vocab, min(known) if known else None, features, vmap)


def load_target(target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool,
                 vocab: int) -> LoadedTarget:
    """The target's weights on its device(s), its early-exit readout, and the runner the target lane drives."""
    model = load_model(ModelSpec(target, lanes.target_device, trust_remote_code), spread=lanes.target_devices)
    if lanes.target_devices and lanes.runner == "fast":
        raise MirrorError("the fast runner keeps a model on one device; a target spread over "
                          f"{', '.join(lanes.target_devices)} runs on the generic runner (--runner auto or hf)")
    head = choose_exit_head(lanes.exit_head, local_folder(draft), model)
    cpu = lanes.kernel != "torch" and lanes.target_device == "cpu"
    runner = build_runner(model, vocab, "hf" if lanes.target_devices else lanes.runner, exit_head=head,
                          kernel=lanes.kernel, blocks=_gguf_blocks(target, model.config) if cpu else None)
    info = None if head is None else ExitHeadInfo(
        head.layer, int(head.ids.numel()), lanes.exit_head if lanes.exit_head != "auto" else local_folder(draft))
    return LoadedTarget(model, runner, eos_ids(model), info)


def _every_core_faster(whole: WholeMachine | None) -> tuple[int, ...]:
    """Every usable core, where a CPU target lane holds fewer than all of them and the step was timed faster there
    than on the lane in every alternated pair and within its bounds (WholeMachine: settled, bounded); else ()."""
    if whole is None or not whole.settled or not whole.bounded or whole.all_ms >= whole.lane_ms:
        return ()
    return machine.usable_cpus()


def _serial_cpus(lanes: LaneConfig, whole: WholeMachine | None) -> tuple[int, ...]:
    """Where ar and sd run the target: every core (LaneConfig.serial_cores "all") where it is faster; else () (the
    lane's own cores)."""
    return _every_core_faster(whole) if lanes.serial_cores == "all" else ()


def _lend_cpus(lanes: LaneConfig, whole: WholeMachine | None) -> tuple[int, ...]:
    """Where mirror runs the target's layers before the early exit: every core (LaneConfig.lend_cores "auto") where
    it is faster and the draft lane can sleep on its own while it has nothing to do (a process or a thread lane; an
    inline lane runs on the target's thread); else () (the lane's own cores)."""
    return _every_core_faster(whole) if lanes.lend_cores == "auto" and lanes.kind != "inline" else ()


def _gguf_blocks(target: str, config) -> dict | None:
    """The target's own GGUF blocks where its folder keeps the GGUF it was prepared from (models/gguf_blocks.py)."""
    path = find_gguf(local_folder(target))
    return None if path is None else read_blocks(path, config)


def draft_lane_spec(draft: str, lanes: LaneConfig, pair: PairFiles, trust_remote_code: bool) -> DraftLaneSpec:
    """What the draft's lane loads and where; a feature-reading draft's channel is sized for the longest prompt."""
    feature_floats = 0 if pair.features is None else (pair.max_context + 2) * pair.features.hidden_size
    return DraftLaneSpec(draft, lanes.draft_device, pair.vocab, lanes.draft_threads, lanes.draft_cpus,
                         trust_remote_code=trust_remote_code, runner=lanes.runner, dtype=lanes.dtype,
                         kernel=lanes.kernel, fault=lanes.fault,
                         feature_floats=feature_floats)


def pair_info(target: str, draft: str | None, lanes: LaneConfig, pair: PairFiles, loaded: LoadedTarget,
              timed: TargetTiming, lane) -> PairInfo:
    """What the loaded pair is and what its load measured (with_target_timing)."""
    runner = loaded.runner
    info = PairInfo(target=target, draft=draft, num_layers=runner.num_layers, vocab_size=pair.vocab,
                    max_context=pair.max_context, lanes=lanes, target_runner=type(runner).__name__,
                    draft_dtype=None if lane is None else lane.calibration,
                    draft_runner="" if lane is None else lane.runner_name, exit_head=loaded.head,
                    draft_vocab=None if pair.vmap is None else pair.vmap.size,
                    draft_features=None if pair.features is None else pair.features.feature_layer,
                    target_formats=tuple(format_name(d) for d in runner.formats.offered),
                    pair_format=pair_format(runner))
    return with_target_timing(info, runner, timed, lane)


def with_target_timing(info: PairInfo, runner, timed: TargetTiming, lane) -> PairInfo:
    """`info` with what timing the target in its format measured (its dtype, row check, whole-machine step and
    roofline, where ar and sd run) and, with a draft lane, γ, κ for this machine (the latency model at the pair's own
    ℓ_e): at load, and again when MirrorEngine.set_target_format changes the format."""
    info = replace(info, target_rows=timed.rows, target_dtype=timed.dtype, whole_machine=timed.whole,
                   roofline=roofline_of(runner, timed.dtype, timed.whole),
                   serial_cpus=_serial_cpus(info.lanes, timed.whole), lend_cpus=_lend_cpus(info.lanes, timed.whole))
    return info if lane is None else replace(info, spec_choice=_spec_choice(info))


def with_overheads(info: PairInfo, overheads: StepOverheads) -> PairInfo:
    """`info` with the overheads a short run of each speculative decoder timed (MirrorEngine.load), and γ, κ chosen
    again by the latency model that now holds them."""
    info = replace(info, overheads=overheads)
    return replace(info, spec_choice=_spec_choice(info))


def _spec_choice(info: PairInfo) -> SpecChoice | None:
    """γ and κ for this machine: the latency model over the pair's step costs (step_costs) and the draft's profile;
    None when the draft has no profile or a lane's dtype was forced without timing."""
    profile, costs = load_profile(local_folder(info.draft)), step_costs(info)
    return None if profile is None or costs is None else choose_spec(costs, profile)
