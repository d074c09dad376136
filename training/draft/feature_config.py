"""The feature draft's distillation settings (feature_distill.py maps its flags onto them), in a module of their
own: every stage of the run reads them from here, so imports go one way."""
from __future__ import annotations

from dataclasses import dataclass

from training.draft.chat_sources import FEATURE_LAYER, TOPK


@dataclass(frozen=True)
class FeatureDistillConfig:
    answers: str                                  # chat_data shard folders (training), comma-separated
    heldout: str                                  # chat_data shards of held-out topics (evaluation only)
    work: str                                     # teacher-pass cache
    out: str                                      # the pair folder: the draft goes to out/feature_draft/
    target: str = "smollm2-135m-instruct"
    feature_layer: int = FEATURE_LAYER            # ℓ_e: the exit layer whose output the draft reads
    num_layers: int = 1
    draft_vocab: int = 8192
    topk: int = TOPK
    depths: int = 4                               # training-time test: tokens unrolled on own features (γ)
    depth_decay: float = 0.8
    minutes: float = 60.0
    exit_epochs: float = 2.0
    batch_sequences: int = 16
    lr: float = 5e-4
    exit_lr: float = 1e-3
    hard_weight: float = 0.5
    wrong_weight: float = 4.0                     # exit head, second pass: weight of rows where the draft was wrong
    candidate_epochs: float = 1.0                 # exit head, second pass (0: keep the first head)
    feature_weight: float = 0.2
    seed: int = 0
    threads: int = 0
    compare: str = ""                             # a token-only draft to compare against ("" = none)
    eval_every: int = 500                         # steps between held-out evaluations (the agreement curve)
    train_tokens: int = 0                         # train on a seeded random subset of about this many answer tokens
                                                  # (0: all): the data-volume probe
    init: str = ""                                # a feature_draft folder to continue from: its vocabulary, exit
                                                  # head and weights ("": a new draft from the target's layers)
    dtype: str = "auto"                           # the teacher pass and the training's autocast: precision.PRECISIONS
    rollout_weight: float = 0.0                   # λ: rows greedy decoding evaluates weigh 1 + λ (rollout_weights)
