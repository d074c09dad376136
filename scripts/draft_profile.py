"""A saved feature draft's held-out figures, and its acceptance profile measured the way decoding meets it.

    python -m training.draft.chat_data --held-out --more --limit 96 --out HELDOUT     # new-topic answers
    PYTHONPATH=. python scripts/draft_profile.py --draft assets/smollm2_pair/feature_draft --heldout HELDOUT [--write]
        [--format q8_0]                # the draft's products as the exact kernel computes that format

Prints, teacher-forced on the held-out answers (training/draft/replay.py's evaluate: depth d reads d−1 of the
draft's own features): the plain top-1 agreement by depth over every answer position; τ at every γ the latency model
tries, replayed from the rollouts greedy speculative decoding drafts (replay.chains: from the prompt's end, each
next rollout after the last one's accepted tokens and the correction); a_d, the agreement at depth d given 1..d−1
were right over those rollouts at the largest γ; Mirror-SD's hit rate by γ and κ at each rollout's correction or
bonus slot (replay.rollout_hits, with the exit head beside the draft); and beside them what the latency
model reads from the draft's draft_profile.json now. `--write` puts the measured τ(γ), hit rates by γ and κ, and a_d
into the profile (its hit_by_kappa, the training run's figure that also names the run, is kept). `--format` replays
the draft with every product packed for the kernel in that format (runners/feature_kernel.py: PackedMaps; q8_0 is
what the engine runs where the kernel runs, bfloat16 what it ran before), its attention and norms in float32.
Nothing here is a decode: the bench's τ on the same prompts (`--prompts-out FILE` writes them) is the check
(docs/TRAINING.md, "The profile: τ and the hit rate replayed").
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from mirror_core.kernels.formats import FUNCTIONS, INT8
    from mirror_core.latency import GAMMAS
    from training.precision import PRECISIONS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default=os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft"))
    p.add_argument("--heldout", required=True, help="chat_data shards of held-out answers (with recorded features)")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--depths", type=int, default=max(GAMMAS), help="the largest γ replayed")
    p.add_argument("--dtype", default="auto", choices=PRECISIONS)
    p.add_argument("--format", default="", choices=("", *(f for f in FUNCTIONS if f != INT8)),
                   help="the draft's products packed for the exact kernel in this format (float32 elsewhere)")
    p.add_argument("--work", default="", help="the teacher cache's folder (default: a temporary one)")
    p.add_argument("--prompts-out", default="", help="also write the held-out user turns as a bench prompts file "
                   "(the check: `python -m mirror_core bench --prompts FILE --decoders sd --gamma G`)")
    p.add_argument("--write", action="store_true",
                   help="write the measured τ(γ), hit rates by γ and κ, and a_d into the draft's profile")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import torch

    from mirror_core.latency import KAPPAS
    from mirror_core.machine import cpu_model
    from mirror_core.models.profile import load_profile

    a = parse_args(argv)
    print(f"CPU: {cpu_model()}, torch {torch.__version__}", flush=True)
    if a.prompts_out:
        write_prompts(a.heldout, a.prompts_out)
    figures, n = measure(a)
    profile = load_profile(a.draft)
    gammas = range(1, a.depths + 1)
    figures["profile_tau_by_gamma"] = [round(profile.tau(g), 4) for g in gammas] if profile else None
    figures["profile_hit_by_gamma"] = [[round(profile.hit_rate(k, g), 4) for k in KAPPAS] for g in gammas] \
        if profile else None
    print(f"{n} held-out answers, dtype {figures['dtype']}; {figures['chains']} rollouts of {a.depths}\n"
          f"  top-1 agreement by depth:                 {figures['agreement']}\n"
          f"  a_d (given depths 1..d−1 right, γ {a.depths}):   {figures['accept']}\n"
          f"  τ by γ 1..{a.depths}, decoding's rollouts replayed: {figures['tau_by_gamma']}\n"
          f"  τ by γ the latency model reads now:       {figures['profile_tau_by_gamma']}\n"
          f"  hit rate by γ (rows) and κ 1..4, replayed: {figures['hit_by_gamma']}\n"
          f"  hit rate by γ and κ the model reads now:  {figures['profile_hit_by_gamma']}", flush=True)
    if a.write:
        write_profile(a.draft, profile, figures, n)
    return figures


def measure(a: argparse.Namespace) -> tuple[dict, int]:
    """The saved draft's figures on the held-out answers (replay.evaluate, with its exit head's readout) and how
    many answers they cover; figures["dtype"] names the dtype that ran."""
    from mirror_core.models.exit_head import find_exit_head
    from mirror_core.models.feature_draft import load_feature_draft
    from mirror_core.models.prepared import resolve_source
    from mirror_core.models.vocab import load_vocab_map
    from training.draft.answers import AnswerSet, load_sequences
    from training.draft.chat_sources import TOPK
    from training.draft.exit_heads import exit_readout, load_target
    from training.draft.feature_config import FeatureDistillConfig
    from training.draft.replay import evaluate
    from training.draft.teacher import teacher_pass, teacher_path
    from training.precision import resolve

    target_dir = resolve_source(a.target)
    model = load_feature_draft(a.draft).float()
    seqs = load_sequences(a.heldout)
    layer, dtype = model.cfg.feature_layer, "float32" if a.format else resolve(a.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or tmp
        os.makedirs(work, exist_ok=True)
        teacher = teacher_pass([a.heldout], list(range(len(seqs))), seqs, target_dir, layer, TOPK,
                               teacher_path(work, "teacher_f_heldout", seqs, layer, TOPK, target_dir, dtype), dtype)
    cfg = FeatureDistillConfig(answers="", heldout=a.heldout, work="", out="", target=a.target,
                               feature_layer=layer, depths=a.depths, dtype=dtype)
    head = find_exit_head(a.draft)
    if head is None or head.layer != layer:
        raise SystemExit(f"{a.draft}: no exit head at layer {layer} beside the draft (Mirror-SD's hit rates need it)")
    readout = exit_readout((head.adapter, head.bias, head.gain), load_target(target_dir)[1], head.ids)
    figures = evaluate(model, AnswerSet.of(seqs, teacher, load_vocab_map(a.draft)), cfg, readout, kernel_maps(model, a))
    return figures | {"dtype": f"{a.format} on the kernel" if a.format else dtype}, len(seqs)


def kernel_maps(model, a: argparse.Namespace):
    """The draft's products packed for the exact kernel in --format (None: torch's matmul in --dtype)."""
    if not a.format:
        return None
    from mirror_core.kernels import native
    from mirror_core.runners.feature_kernel import PackedMaps

    lib = native.library()
    if lib is None:
        raise SystemExit(f"--format needs the exact kernel: {native.unavailable()}")
    return PackedMaps(model, a.format, lib)


def write_profile(draft: str, profile, figures: dict, n: int) -> None:
    """The measured τ(γ), hit rates by γ and κ and a_d into the draft's profile; its hit_by_kappa (the training
    run's figure, which also names the run) is kept."""
    from mirror_core.models.profile import save_profile

    if profile is None:
        raise SystemExit(f"{draft} has no draft_profile.json to update (its exit hit rates come from training)")
    save_profile(draft, list(figures["accept"]), list(profile.hit),
                 f"held-out answers to {n} new-topic prompts, teacher-forced: greedy decoding's rollouts "
                 "replayed (τ by γ; agreement by depth given the earlier depths agreed, own predicted features; the "
                 "exit's top-κ at each rollout's correction or bonus slot; scripts/draft_profile.py); hit_by_kappa: "
                 "exit top-κ where the draft's first token was wrong", list(figures["tau_by_gamma"]),
                 [list(row) for row in figures["hit_by_gamma"]])
    print(f"wrote {os.path.join(draft, 'draft_profile.json')}", flush=True)


def write_prompts(heldout: str, path: str) -> None:
    """The held-out records' first user turns, in their order, as a Spec-Bench style prompts file."""
    import json

    import torch

    from training.draft.answers import shard_paths

    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(r for p in shard_paths(heldout) for r in torch.load(p, mmap=True)):
            f.write(json.dumps({"question_id": f"held-{i}", "category": "chat", "turns": r["user"][:1]}) + "\n")
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
