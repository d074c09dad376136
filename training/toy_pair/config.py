"""The training run's configuration, in a module of its own that imports no torch: the CLI, the trainer
and the evaluation (which re-reads a model card's config) all import it from here, so imports go one way."""
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; the CLI maps its flags onto this in one place."""

    out_dir: str
    budget_minutes: float = 120.0  # training wall time for all three models (tokenizer and eval extra)
    budget_split: tuple[float, float, float] = (0.5, 0.2, 0.3)  # target, AR draft, SS draft (SS steps cost ~2x)
    seed: int = 0
    device: str = "cpu"  # "cpu" or "cuda"
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    precision: str = "auto"  # bf16: forward passes under bf16 autocast (fp32 master weights); fp32; auto: bf16 on an
                             # accelerator or where train/precision.py measures it faster on this CPU, else fp32
    compile: bool = False  # torch.compile each phase's loss: a pause, then faster steps (measured: docs/TRAINING.md)
    corpus_dir: str | None = None  # None: CPython stdlib + pydoc topics
    init_target: str | None = None  # continue training this target folder (its tokenizer and shapes) instead of a fresh one
    # default shapes: build.py's docstring says why (measured: BENCHMARKS.md's history)
    vocab_size: int = 4096
    context: int = 256
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_heads: int = 6
    num_kv_heads: int = 2
    target_layers: int = 10
    draft_layers: int = 1
    ss_layers: int = 1
    ss_msa_layers: int = 1  # N_s
    num_streams: int = 2  # n_str
    ss_init: str = "ar_draft"  # SS draft's start: the trained AR draft (pair 7: +0.05 top-1 agreement), or "target"
    exit_layer: int = 0  # ℓ_e; 0 means target_layers // 2
    exit_loss_weight: float = 1.0  # 0.25 left the exit of a better-trained target weak (docs/TRAINING.md)
    stream_loss_weight: float = 0.1  # α_j
    # sequence-level distillation data for the drafts: the target's own continuations of training prompts
    continuation_share: float = 0.5  # share of each draft batch's rows taken from them (0 = corpus only)
    continuation_sequences: int = 1536  # how many to generate (half greedy, half sampled at temperature 1)
    # sequence-level unlikelihood fine-tuning of the target against greedy loops (Welleck et al., 2020)
    unlikelihood_share: float = 0.0  # share of the target's time, at its end, alternating MLE and unlikelihood updates
    unlikelihood_new_tokens: int = 100  # greedy tokens the target adds to each prompt for an unlikelihood update
    batch_size: int = 8
    lr_target: float = 1.5e-3
    lr_draft: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_steps: int = 0  # per model; 0 = limited by the time budget only
    eval_chunks: int = 64  # validation chunks per kind (code, prose)
    n_prompts: int = 16
    prompt_tokens: int = 48
    sample_tokens: int = 64

    def __post_init__(self):
        split = self.budget_split
        if (len(split) != 3 or abs(sum(split) - 1.0) > 1e-6 or min(split[1:]) <= 0
                or not (split[0] > 0 or (split[0] == 0 and self.init_target))):
            raise ValueError(f"budget_split must be 3 positive shares (target, AR, SS) summing to 1 (the target's "
                             f"may be 0 with init_target: drafts only), got {self.budget_split}")
        if not 0 <= self.exit_layer < self.target_layers:
            raise ValueError(f"exit_layer must be in 1..{self.target_layers - 1} (0 = half), got {self.exit_layer}")
        if max(self.draft_layers, self.ss_layers) > self.target_layers or not 1 <= self.ss_msa_layers <= self.ss_layers:
            raise ValueError("drafts copy target layers: need draft_layers, ss_layers ≤ target_layers and "
                             "1 ≤ ss_msa_layers ≤ ss_layers")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device}")
        if not 0.0 <= self.continuation_share <= 1.0 or self.continuation_sequences < 2:
            raise ValueError("continuation_share must be in [0, 1] and continuation_sequences ≥ 2")
        if self.ss_init not in ("target", "ar_draft") or (self.ss_init == "ar_draft"
                                                          and self.ss_layers != self.draft_layers):
            raise ValueError(f"ss_init must be target or ar_draft (which needs ss_layers == draft_layers), "
                             f"got {self.ss_init} with {self.ss_layers} and {self.draft_layers} layers")
        if not 0.0 <= self.unlikelihood_share < 1.0 or self.unlikelihood_new_tokens < 4:
            raise ValueError("unlikelihood_share must be in [0, 1) and unlikelihood_new_tokens ≥ 4")
        if self.unlikelihood_share and self.continuation_prompt_tokens + self.unlikelihood_new_tokens > self.context + 1:
            raise ValueError(f"a prompt of {self.continuation_prompt_tokens} tokens plus unlikelihood_new_tokens "
                             f"must fit the context ({self.context} + 1)")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision}")

    @property
    def continuation_prompt_tokens(self) -> int:
        """Prompt length of the target's continuations: the evaluation prompts' length, at most half the context."""
        return min(self.prompt_tokens, self.context // 2)

    @property
    def resolved_exit_layer(self) -> int:
        return self.exit_layer or self.target_layers // 2

    @classmethod
    def from_record(cls, record: dict) -> "TrainConfig":
        """The config a model card's `config` record (dataclasses.asdict, through JSON) was written from:
        lists back to tuples, and fields this version no longer has ignored, so older cards still load."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items() if k in known})
