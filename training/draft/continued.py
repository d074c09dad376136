"""`--init`: a feature draft continued on more data, and grown deeper when `--num-layers` asks for more layers.

The saved draft brings its weights, its vocabulary and its exit head (the start of the run's exit-head training);
everything is checked against this run's target and settings before any teacher pass, and the record of the run
that wrote it is carried into the new record, so the card can show every run behind a draft.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from mirror_core.models.feature_draft import FeatureDraft
from mirror_core.models.vocab import VocabMap
from training.draft.answers import read_json
from training.draft.exit_heads import Head
from training.draft.feature_config import FeatureDistillConfig


@dataclass(frozen=True)
class ContinuedDraft:
    """Where `--init` starts: a saved feature draft's weights, vocabulary and exit head (adapter, bias, gain), and the
    record of the run that wrote it (None when none was found beside it)."""
    model: FeatureDraft
    vmap: VocabMap
    head: Head
    record: dict | None


def continued_draft(cfg: FeatureDistillConfig, target_dir: str) -> ContinuedDraft:
    """The draft in cfg.init, checked against this run's target and settings before any teacher pass (SystemExit
    saying what differs)."""
    from transformers import AutoConfig

    from mirror_core.config import MirrorError
    from mirror_core.models.exit_head import find_exit_head
    from mirror_core.models.feature_draft import check_feature_draft, load_feature_draft
    from mirror_core.models.vocab import load_vocab_map

    try:
        model, vmap, head = load_feature_draft(cfg.init), load_vocab_map(cfg.init), find_exit_head(cfg.init)
        target_cfg = AutoConfig.from_pretrained(target_dir)
        check_feature_draft(model.cfg, target_cfg, vmap)
    except MirrorError as exc:
        raise SystemExit(f"--init {cfg.init} cannot continue here: {exc}") from None
    dc = model.cfg
    if head is None or head.matches(target_cfg) or head.layer != cfg.feature_layer \
            or not torch.equal(head.ids, vmap.target_ids):
        raise SystemExit(f"--init {cfg.init} cannot continue here: it needs its exit head for this target at layer "
                         f"{cfg.feature_layer} over its own vocabulary beside it")
    if dc.feature_layer != cfg.feature_layer or dc.num_layers > cfg.num_layers:
        raise SystemExit(f"--init {cfg.init} cannot continue here: it reads layer {dc.feature_layer} with "
                         f"{dc.num_layers} layer(s), not --feature-layer {cfg.feature_layer} --num-layers {cfg.num_layers} "
                         "(a draft can grow layers, never drop them)")
    record = earlier_record(cfg.init)
    grow = f", grown to {cfg.num_layers}" if cfg.num_layers > dc.num_layers else ""
    print(f"continuing the draft in {cfg.init} ({vmap.size} tokens, {dc.num_layers} layer(s){grow}; "
          f"{'its run record found' if record else 'no record of its run found beside it'})", flush=True)
    return ContinuedDraft(model, vmap, (head.adapter, head.bias, head.gain), record)


def starting_draft(cfg: FeatureDistillConfig, start: ContinuedDraft | None, target, ids: torch.Tensor,
                   head: Head) -> FeatureDraft:
    """The draft to train, in float32 and trainable: the continued one, grown to cfg.num_layers (the new layers start
    as identities: feature_draft.grown), or a new one from the target's layers after ℓ_e and the exit head `head`
    over the target ids `ids` (feature_draft.from_target)."""
    from mirror_core.models.feature_draft import from_target, grown

    model = grown(start.model, target, cfg.num_layers) if start else \
        from_target(target, ids, cfg.num_layers, cfg.feature_layer, head)
    return model.float().train().requires_grad_(True)


def earlier_record(init: str) -> dict | None:
    """The record (feature_distill.json) of the run that wrote the draft in `init`: in the pair folder holding it, or
    in the draft's own folder; only when the draft's profile keeps that run's exit hit rates (`kappa_hits` of its
    candidate pass: scripts/draft_profile.py --write re-measures the rest of a profile, never these)."""
    from mirror_core.models.profile import load_profile

    profile = load_profile(init)
    for folder in (os.path.dirname(os.path.normpath(init)), init):
        record = read_json(os.path.join(folder, "feature_distill.json"))
        coverage = (record or {}).get("candidate_coverage")
        if coverage and profile and [round(h, 4) for h in kappa_hits(coverage)] == [round(h, 4) for h in profile.hit]:
            return record
    return None


def kappa_hits(candidates: dict) -> list[float]:
    """The profile's hit_by_kappa from candidate_pass's coverage: κ = 1, 2, 3 (between the measured 2 and 4), 4."""
    cov = candidates.get("after", candidates["before"])
    return [cov["top1"], cov["top2"], (cov["top2"] + cov["top4"]) / 2, cov["top4"]]
