"""What a bench runs: its decoders and settings (BenchConfig), checked when it is made."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MirrorError, SamplingConfig, SpecConfig

# bench name → engine decoder; sd_model and mirror_model are sd and mirror with the context draft off (the model
# draft alone), so that one bench shows what the context draft adds where it fires and costs where it does not;
# sd_raw and mirror_raw are sd and mirror with zero windows off (a γ-token window every step: raw speculation), so
# that one bench shows what taking a plain step where no window pays changes
ENGINE_DECODERS = {"ar": "ar", "ar_all": "ar", "sd": "sd", "mirror": "mirror", "sd_model": "sd",
                   "mirror_model": "mirror", "sd_raw": "sd", "mirror_raw": "mirror"}
MODEL_ONLY = ("sd_model", "mirror_model")
RAW = ("sd_raw", "mirror_raw")
PEER_DECODERS = ("hf", "hf_assisted", "llama_cpp", "llama_cpp_one")  # llama_cpp*: optional (bench/peers.py)
BENCH_DECODERS = tuple(ENGINE_DECODERS) + PEER_DECODERS
SWEEP_AXES = {"gamma": "gamma", "kappa": "kappa", "exit": "exit_layer",  # --sweep name → SpecConfig field
              "budget": "branch_budget"}
DRAFTING_DECODERS = ("sd", "mirror", "sd_model", "mirror_model", "sd_raw", "mirror_raw",  # the decoders a γ applies to
                     "hf_assisted")


@dataclass(frozen=True)
class BenchConfig:
    """What to run: decoders at `spec`, and `mirror` at every sweep setting instead when a sweep is given."""

    decoders: tuple[str, ...]               # bench decoder names from BENCH_DECODERS, each once
    max_new_tokens: int                     # token budget of every run
    sampling: SamplingConfig                # the same for every decoder (greedy when the peers run)
    spec: SpecConfig                        # γ, κ, ℓ_e, branch budget of every speculative decoder
    sweep: tuple[SpecConfig, ...] = ()      # mirror's settings instead of `spec` (parse_sweep's grid)
    repeats: int = 3                        # timed runs per prompt and cell (the row keeps the median)
    warmup: int = 1                         # untimed runs of every cell first, on the first prompt

    def __post_init__(self) -> None:
        unknown = [d for d in self.decoders if d not in BENCH_DECODERS]
        if unknown:
            raise MirrorError(f"unknown decoder {unknown[0]!r}; choose from {', '.join(BENCH_DECODERS)}")
        if not self.decoders or len(set(self.decoders)) != len(self.decoders):
            raise MirrorError("--decoders must name each decoder once")
        if self.repeats < 1 or self.warmup < 0:
            raise MirrorError("--repeats must be >= 1 and --warmup >= 0")
        if self.sweep and "mirror" not in self.decoders:
            raise MirrorError("--sweep varies mirror's settings; add mirror to --decoders")
        if set(PEER_DECODERS) & set(self.decoders) and not self.sampling.greedy:
            raise MirrorError("the peers are compared greedily; use --temperature 0 or drop "
                              f"{', '.join(d for d in self.decoders if d in PEER_DECODERS)}")

    @property
    def needs_draft(self) -> bool:
        return any(d in DRAFTING_DECODERS for d in self.decoders)
