"""Frozen configuration for a decoding request and for the two lanes (no torch, no environment)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .kernels.formats import FUNCTIONS
from .kernels.variants import VARIANTS

DECODER_NAMES = ("ar", "sd", "mirror")
RULES = ("exact", "rejection")
LANE_KINDS = ("process", "thread", "inline")
FAULT_MODES = ("raise", "exit")
# the weight formats (kernels/formats.py); auto: the pair's own format for the target (the int8 function where the
# target has GGUF blocks, else float32), the fastest for the draft (runners/calibrate.py)
DTYPE_CHOICES = ("auto", *FUNCTIONS)
# the linear maps' kernel on a CPU: auto = the exact small-row kernel (kernels/native.py) in the best variant this
# machine builds and runs, else torch's matmul under a measured row plan; torch = always that; a variant = only it
KERNEL_CHOICES = ("auto", "torch", *VARIANTS)
SERIAL_CORES = ("all", "lane")  # LaneConfig.serial_cores
SERIAL_DECODERS = ("ar", "sd")
LEND_CORES = ("auto", "off")  # LaneConfig.lend_cores  # the decoders whose draft lane (if any) waits while the target works
RUNNER_KINDS = ("auto", "fast", "hf")  # auto: the fast runners for Llama-family weights and SS drafts, else the generic one
MAX_NEW_TOKENS_CAP = 4096  # documented upper bound for one request
MAX_PROMPT_CHARS = 32_000  # prompt text is refused above this many characters (before tokenizing)
DEVICE_NAME = r"^(cpu|mps|(cuda|xpu|npu)(:\d+)?)$"  # machine.py: CUDA, Apple MPS, Intel XPU, Ascend NPU, the CPU
MAX_GAMMA = 16
MAX_KAPPA = 64
AUTO_BRANCH_BUDGET = -1  # SpecConfig.branch_budget: fit the branch rows to the target's suffix (branching.py)
# γ, κ of a pair without a setting chosen for this machine (no draft profile): the best setting of
# the sweep in docs/BENCHMARKS.md's history on the default pair (pair.PairInfo.resolve applies them)
DEFAULT_GAMMA = 4
DEFAULT_KAPPA = 2
CONTEXT_NGRAM = 8  # the context draft's index keys: the last 1..8 tokens (context_draft.ContextIndex)


class MirrorError(ValueError):
    """A problem the user can fix (bad setting, bad model, bad device); carries one readable line."""


def check_prompt_text(text) -> str:
    """Refuse prompt text that is empty, oversized, not valid UTF-8 or holds control characters.

    Invalid UTF-8 reaches Python as lone surrogates (argv's surrogateescape, JSON "\\udcff" escapes);
    tab, newline and carriage return are the only control characters allowed.
    """
    _require(isinstance(text, str), f"the prompt must be text, got {type(text).__name__}")
    _require(bool(text.strip()), "the prompt is empty; give some text")
    _require(len(text) <= MAX_PROMPT_CHARS,
             f"the prompt is too long ({len(text)} characters; the limit is {MAX_PROMPT_CHARS}); shorten it")
    for i, ch in enumerate(text):
        code = ord(ch)
        _require(not 0xD800 <= code <= 0xDFFF,
                 f"the prompt is not valid UTF-8 (undecodable byte or lone surrogate at character {i}); "
                 "re-encode it as UTF-8")
        _require(ch in "\t\n\r" or not (code < 0x20 or 0x7F <= code < 0xA0),
                 f"the prompt contains control character U+{code:04X} at character {i}; remove it")
    return text


def parse_token_ids(text: str, what: str = "the prompt ids") -> tuple[int, ...]:
    """Token ids written as text, separated by commas, spaces or both ("1,2,3", "1, 2 3"): the CLI's --prompt-ids
    and the prompt of a model without a tokenizer (MirrorEngine.encode). `what` names them in the error line."""
    try:
        ids = tuple(int(x) for x in str(text).replace(",", " ").split())
    except ValueError:
        raise MirrorError(f"{what} must be token ids, comma-separated or space-separated (e.g. 1, 2, 3), "
                          f"got {text!r}") from None
    _require(bool(ids), f"{what} are empty; give at least one token id")
    return ids


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    rule: str = "exact"  # T > 0 acceptance rule: "exact" (paper's Rule E) or "rejection" (Rule R)

    def __post_init__(self) -> None:
        _require(_is_number(self.temperature) and 0.0 <= self.temperature <= 100.0,
                 f"temperature must be a number in [0, 100], got {self.temperature!r}")
        _require(_is_int(self.top_k) and self.top_k >= 0,
                 f"top-k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _require(_is_number(self.top_p) and 0.0 < self.top_p <= 1.0,
                 f"top-p must be in (0, 1], got {self.top_p!r}")
        _require(_is_int(self.seed) and 0 <= self.seed < 2**63, f"seed must be an integer >= 0, got {self.seed!r}")
        _require(self.rule in RULES, f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ContextConfig:
    """The context draft (context_draft.py): windows copied from the prompt and the output so far, beside the model
    draft. It proposes the continuation of the longest suffix match of at least `min_match` tokens, as many tokens as
    the latency model says pay (at most `max_window`), and only at steps where that beats the model draft's
    measured yield; otherwise the model drafts. The output never depends on it."""

    enabled: bool = True
    min_match: int = 2
    max_window: int = MAX_GAMMA   # the channel holds p_draft for MAX_GAMMA tokens (lanes/draft_lanes.py)

    def __post_init__(self) -> None:
        _require(isinstance(self.enabled, bool), f"context draft must be on or off, got {self.enabled!r}")
        _require(_is_int(self.min_match) and 1 <= self.min_match <= CONTEXT_NGRAM,
                 f"context min match must be an integer in 1..{CONTEXT_NGRAM}, got {self.min_match!r}")
        _require(_is_int(self.max_window) and 1 <= self.max_window <= MAX_GAMMA,
                 f"context max window must be an integer in 1..{MAX_GAMMA}, got {self.max_window!r}")


@dataclass(frozen=True)
class SpecConfig:
    """Speculation shape: γ draft tokens per window, κ candidates per slot, early-exit layer ℓ_e,
    and an optional cap on the branch rows the draft lane rolls out per step (engine.ExitReadout).

    None (γ, κ, ℓ_e left out) means the loaded pair's choice, resolved once when the request reaches the engine
    (MirrorEngine.validate → PairInfo.resolve): γ and κ the latency model chose for this machine (DEFAULT_GAMMA,
    DEFAULT_KAPPA for a draft without a profile); ℓ_e the layer a feature-reading draft reads, else the trained exit
    head's, else N // 2 of the target (the paper's default). ℓ_e is checked against the target's depth there too.
    """

    gamma: int | None = None
    kappa: int | None = None
    exit_layer: int | None = None
    # at most this many branch rows per step, the likeliest (slot, candidate); 0 = all κ(γ+1);
    # AUTO_BRANCH_BUDGET = as many as the draft lane finishes while the target runs its suffix
    branch_budget: int = AUTO_BRANCH_BUDGET
    context: ContextConfig = field(default_factory=ContextConfig)  # the context draft beside the model draft
    # True: each step proposes a window only where it is modelled to commit more tokens per millisecond than a plain
    # target step (a window of zero: the target verifies [w0] alone), and γ is the longest of the lengths chosen per
    # step (draft_choice.py); False: every step proposes a γ-token window (raw speculation). The output never changes.
    zero_windows: bool = True

    def __post_init__(self) -> None:
        _require(isinstance(self.context, ContextConfig), f"context must be a ContextConfig, got {self.context!r}")
        _require(isinstance(self.zero_windows, bool), f"zero windows must be on or off, got {self.zero_windows!r}")
        _require(_is_int(self.branch_budget) and AUTO_BRANCH_BUDGET <= self.branch_budget <= (MAX_GAMMA + 1) * MAX_KAPPA,
                 f"branch budget must be an integer in {AUTO_BRANCH_BUDGET}..{(MAX_GAMMA + 1) * MAX_KAPPA} "
                 f"(0 = every candidate, {AUTO_BRANCH_BUDGET} = auto), got {self.branch_budget!r}")
        _require(self.gamma is None or (_is_int(self.gamma) and 1 <= self.gamma <= MAX_GAMMA),
                 f"gamma must be an integer in 1..{MAX_GAMMA}, got {self.gamma!r}")
        _require(self.kappa is None or (_is_int(self.kappa) and 1 <= self.kappa <= MAX_KAPPA),
                 f"kappa must be an integer in 1..{MAX_KAPPA}, got {self.kappa!r}")
        _require(self.exit_layer is None or (_is_int(self.exit_layer) and self.exit_layer >= 1),
                 f"exit layer must be an integer >= 1, got {self.exit_layer!r}")


@dataclass(frozen=True)
class Request:
    """One decoding request: token ids in, events out."""

    prompt_ids: tuple[int, ...]
    decoder: str = "mirror"
    max_new_tokens: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        _require(self.decoder in DECODER_NAMES,
                 f"unknown decoder {self.decoder!r}; choose one of {', '.join(DECODER_NAMES)}")
        _require(len(self.prompt_ids) > 0, "the prompt is empty; give at least one token")
        _require(all(_is_int(t) and t >= 0 for t in self.prompt_ids),
                 "prompt ids must be non-negative integers")
        _require(_is_int(self.max_new_tokens) and 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP,
                 f"max new tokens must be an integer in 1..{MAX_NEW_TOKENS_CAP}, got {self.max_new_tokens!r}")


@dataclass(frozen=True)
class FaultPlan:
    """Test hook for the draft lane: fail when the command of step `at_step` (or a later one) arrives.

    Resolved once where an engine is loaded (MIRROR_FAULT_DRAFT_AT_STEP / MIRROR_FAULT_DRAFT_MODE, see
    lanes/faults.py); at_step None means the lane never fails on purpose.
    """

    at_step: int | None = None
    mode: str = "raise"  # "raise" an exception in the draft worker, or "exit" the draft lane's process

    def __post_init__(self) -> None:
        _require(self.at_step is None or (_is_int(self.at_step) and self.at_step >= 0),
                 f"fault step must be an integer >= 0, got {self.at_step!r}")
        _require(self.mode in FAULT_MODES, f"fault mode must be one of {', '.join(FAULT_MODES)}, got {self.mode!r}")


@dataclass(frozen=True)
class LaneConfig:
    """Where each model runs and how the draft lane executes.

    kind "process": the draft runs in its own process (the default: real overlap on CPUs, no GIL);
    "thread": a thread of this process (one CUDA device with two streams); "inline": serial, on the
    caller's thread (no overlap; timings then show no hidden draft). CPU sets pin each lane to
    its cores; threads is each lane's intra-op thread count (0 = leave torch's default).
    """

    target_device: str = "cpu"
    draft_device: str = "cpu"
    kind: str = "process"
    target_cpus: tuple[int, ...] = ()
    draft_cpus: tuple[int, ...] = ()
    target_threads: int = 0
    draft_threads: int = 0
    reply_timeout_s: float = 120.0
    runner: str = "auto"
    # the devices the target's layers are spread over with an accelerate device map (embedding on the first,
    # final norm and LM head on the last; the generic runner runs it); () = all on target_device
    target_devices: tuple[str, ...] = ()
    dtype: str = "auto"  # DTYPE_CHOICES: auto = the target's own format, the draft's fastest (runners/calibrate.py)
    # True: the target keeps its loaded weights once its format is set, so that MirrorEngine.set_target_format can
    # change the format on the loaded pair (the page's Format control); False: they are freed (the CLI, the bench)
    keep_formats: bool = False
    # the target's early-exit readout (exit_head.py): "auto" = the trained head stored in the draft's folder when it
    # has one that fits the target, "none" = the target's own final norm and LM head, or a folder holding a head
    exit_head: str = "auto"
    kernel: str = "auto"  # KERNEL_CHOICES: the CPU lanes' linear-map kernel (kernels/native.py)
    # where ar and sd run the target, whose draft lane waits while the target works: "all" = every usable core (the
    # whole-machine baseline), "lane" = the target lane's own cores (mirror always runs on the lane's cores)
    serial_cores: str = "all"
    # Mirror-SD's target lane borrows the draft lane's cores for the layers before the early exit, while the draft
    # lane sleeps until M_t (it has nothing to do before it), and gives them back for the suffix: "auto" = where the
    # load timed every core faster than the lane's (as ar and sd run there) and the draft lane is a process or a
    # thread, "off" = the lanes keep their own cores for the whole step (the default: on a 2-core AMD EPYC the
    # borrowed prefix cost more than it saved, 10.7 against 9.7 ms a step: docs/BENCHMARKS.md)
    lend_cores: str = "off"
    fault: FaultPlan = field(default_factory=FaultPlan)  # test hook: make the draft lane fail on purpose

    def __post_init__(self) -> None:
        _require(self.kind in LANE_KINDS, f"lane kind must be one of {', '.join(LANE_KINDS)}, got {self.kind!r}")
        _require(self.runner in RUNNER_KINDS, f"runner must be one of {', '.join(RUNNER_KINDS)}, got {self.runner!r}")
        _require(self.dtype in DTYPE_CHOICES, f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        _require(isinstance(self.keep_formats, bool), f"keep formats must be true or false, got {self.keep_formats!r}")
        _require(self.kernel in KERNEL_CHOICES, f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {self.kernel!r}")
        _require(self.serial_cores in SERIAL_CORES, f"serial cores must be one of {', '.join(SERIAL_CORES)}, got "
                 f"{self.serial_cores!r}")
        _require(self.lend_cores in LEND_CORES, f"lend cores must be one of {', '.join(LEND_CORES)}, got "
                 f"{self.lend_cores!r}")
        _require(isinstance(self.exit_head, str) and self.exit_head != "",
                 f"exit head must be auto, none or a folder, got {self.exit_head!r}")
        _require(isinstance(self.target_devices, tuple) and (not self.target_devices or (
                 len(self.target_devices) >= 2 and self.target_devices[0] == self.target_device)),
                 "target devices must list two or more devices, the first being the target device, got "
                 f"{self.target_devices!r}")
        for name, dev in [("target_device", self.target_device), ("draft_device", self.draft_device)] + [
                ("target devices' entry", d) for d in self.target_devices]:
            _require(isinstance(dev, str) and re.match(DEVICE_NAME, dev) is not None,
                     f"{name.replace('_', ' ')} must be cpu, cuda[:N], mps, xpu[:N] or npu[:N], got {dev!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MirrorError(message)
