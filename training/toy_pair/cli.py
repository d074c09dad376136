"""Command line → TrainConfig, in one place; `python -m training.toy_pair --out assets/default_pair`."""
import argparse
import dataclasses

from training.toy_pair.config import TrainConfig
from training.toy_pair.trainer import train_all

# flag name → TrainConfig field; every default comes from TrainConfig itself
FLAGS = {
    "budget_minutes": "training wall time for all three models (tokenizer and evaluation extra)",
    "budget_split": "shares of --budget-minutes for target,AR draft,SS draft (comma-separated, sum 1; "
                    "the target's may be 0 with --init-target: drafts only)",
    "seed": "seed of the init and data generators",
    "device": "cpu or cuda",
    "threads": "torch intra-op threads (0 = torch default)",
    "precision": "auto (bf16 where measured faster here, or on an accelerator), bf16 (autocast forward passes, fp32 "
                 "weights) or fp32",
    "compile": "torch.compile each phase's loss (~30 s of compilation per phase here, then ~1.3x faster steps)",
    "corpus_dir": "train on .py (code) and .txt/.md/.rst (prose) files under this directory instead of the stdlib",
    "init_target": "continue training the target in this folder (reusing its tokenizer) instead of a fresh one",
    "vocab_size": "BPE vocabulary size",
    "context": "training context length",
    "hidden_size": "hidden size of all three models",
    "intermediate_size": "MLP width",
    "num_heads": "attention heads",
    "num_kv_heads": "key/value heads",
    "target_layers": "target depth N",
    "draft_layers": "AR draft depth (copied from the target's first layers)",
    "ss_layers": "SS draft depth (copied from the target's first layers, or with --ss-init ar_draft the AR draft's)",
    "ss_msa_layers": "top SS layers with multi-stream attention (N_s)",
    "num_streams": "SS lookahead streams (n_str)",
    "ss_init": "SS draft's starting weights: target (its embedding, first layers, final norm) or ar_draft "
               "(the AR draft just trained in this run; needs --ss-layers == --draft-layers)",
    "exit_layer": "early-exit layer ℓ_e (0 = target_layers // 2)",
    "exit_loss_weight": "weight of the target's auxiliary early-exit loss at ℓ_e",
    "stream_loss_weight": "weight α_j of each SS lookahead stream's loss",
    "continuation_share": "share of each draft batch taken from the target's own continuations of training prompts "
                          "(sequence-level distillation data; 0 = corpus only)",
    "continuation_sequences": "how many continuations to generate when --continuation-share > 0 "
                              "(half greedy, half sampled; generation time is extra)",
    "unlikelihood_share": "share of the target's time spent at its end alternating MLE updates and sequence-level "
                          "unlikelihood updates on its own greedy continuations, against greedy loops (0 = none)",
    "unlikelihood_new_tokens": "greedy tokens the target adds to each prompt for an unlikelihood update",
    "batch_size": "sequences per step",
    "lr_target": "peak learning rate of the target",
    "lr_draft": "peak learning rate of both drafts",
    "warmup_steps": "linear warmup steps",
    "max_steps": "cap on steps per model (0 = time budget only)",
    "eval_chunks": "validation chunks per kind (code, prose)",
    "n_prompts": "held-out prompts for greedy samples",
    "sample_tokens": "greedy tokens per prompt",
}


def float_tuple(text: str) -> tuple[float, ...]:
    """'0.5,0.2,0.3' → (0.5, 0.2, 0.3); argparse turns the ValueError into a usage error."""
    return tuple(float(part) for part in text.split(","))


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse flags into a validated, frozen TrainConfig."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    parser = argparse.ArgumentParser(prog="python -m training.toy_pair", description=__doc__)
    parser.add_argument("--out", required=True, help="output folder (target/, draft_ar/, draft_ss/, model card)")
    for name, help_text in FLAGS.items():
        default = fields[name].default
        flag, help_text = "--" + name.replace("_", "-"), f"{help_text} (default: {default})"
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif isinstance(default, tuple):
            parser.add_argument(flag, type=float_tuple, default=default, help=help_text)
        else:
            parser.add_argument(flag, type=str if default is None else type(default), default=default, help=help_text)
    args = vars(parser.parse_args(argv))
    try:
        return TrainConfig(out_dir=args.pop("out"), **args)
    except ValueError as exc:  # an impossible combination of valid flags: one usage line, exit status 2
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> dict:
    return train_all(parse_args(argv))
