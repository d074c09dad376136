"""Frozen configuration for a decoding request and for the two lanes (no torch, no environment)."""
from __future__ import annotations

from dataclasses import dataclass, field

DECODER_NAMES = ("ar", "sd", "mirror")
RULES = ("exact", "rejection")
LANE_KINDS = ("process", "thread", "inline")
RUNNER_KINDS = ("auto", "fast", "hf")  # auto: the fast runner for Llama-family weights, else the generic one
MAX_NEW_TOKENS_CAP = 4096  # documented upper bound for one request
MAX_GAMMA = 16
MAX_KAPPA = 64


class MirrorError(ValueError):
    """A problem the user can fix (bad setting, bad model, bad device); carries one readable line."""


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    rule: str = "exact"  # T > 0 acceptance rule: "exact" (paper's Rule E) or "rejection" (Rule R)

    def __post_init__(self) -> None:
        _require(isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 100.0,
                 f"temperature must be a number in [0, 100], got {self.temperature!r}")
        _require(isinstance(self.top_k, int) and self.top_k >= 0,
                 f"top-k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _require(isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0,
                 f"top-p must be in (0, 1], got {self.top_p!r}")
        _require(isinstance(self.seed, int) and 0 <= self.seed < 2**63, f"seed must be an integer >= 0, got {self.seed!r}")
        _require(self.rule in RULES, f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """Speculation shape: γ draft tokens per window, κ candidates per slot, early-exit layer ℓ_e.

    exit_layer None means N // 2 of the loaded target (the paper's default); it is checked
    against the target's depth when the request reaches the engine.
    """

    gamma: int = 4
    kappa: int = 4
    exit_layer: int | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.gamma, int) and 1 <= self.gamma <= MAX_GAMMA,
                 f"gamma must be an integer in 1..{MAX_GAMMA}, got {self.gamma!r}")
        _require(isinstance(self.kappa, int) and 1 <= self.kappa <= MAX_KAPPA,
                 f"kappa must be an integer in 1..{MAX_KAPPA}, got {self.kappa!r}")
        _require(self.exit_layer is None or (isinstance(self.exit_layer, int) and self.exit_layer >= 1),
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
        _require(all(isinstance(t, int) and t >= 0 for t in self.prompt_ids),
                 "prompt ids must be non-negative integers")
        _require(isinstance(self.max_new_tokens, int) and 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP,
                 f"max new tokens must be an integer in 1..{MAX_NEW_TOKENS_CAP}, got {self.max_new_tokens!r}")


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

    def __post_init__(self) -> None:
        _require(self.kind in LANE_KINDS, f"lane kind must be one of {', '.join(LANE_KINDS)}, got {self.kind!r}")
        _require(self.runner in RUNNER_KINDS, f"runner must be one of {', '.join(RUNNER_KINDS)}, got {self.runner!r}")
        for name in ("target_device", "draft_device"):
            dev = getattr(self, name)
            _require(isinstance(dev, str) and (dev == "cpu" or dev == "cuda" or dev.startswith("cuda:")),
                     f"{name.replace('_', ' ')} must be 'cpu', 'cuda' or 'cuda:N', got {dev!r}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MirrorError(message)
