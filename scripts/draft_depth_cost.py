"""What a deeper or wider feature-reading draft must gain to pay on this machine, by the latency model.

    PYTHONPATH=. python scripts/draft_depth_cost.py [--target smollm2-135m-instruct]
                                                    [--draft assets/smollm2_pair/feature_draft]

A deeper draft costs SD its serial rollout and Mirror-SD its branch batch, so its agreement must rise enough to pay
for that. For the shipped 1-layer draft and two variants of it, 2 layers and a 2x wider MLP (weights copied or tiled
from the shipped one: only their cost matters here), the engine is loaded on this machine's default lanes, and its
load-time calibration times, from an empty calibration cache, the target's step and window (once: the three loads
share them) and each draft's one-token step and branch batch (κ(γ+1) rows, γ deep). The latency model (mirror_core/latency.py: the one
that chooses γ and κ at load) then gives, per draft:

- the modelled Mirror-SD and SD speedups over AR at the γ, κ it would choose with the shipped draft's held-out
  profile (assets/.../draft_profile.json: τ and hit rate by γ, κ replayed from decoding's rollouts, and a_d, the
  agreement at depth d given the earlier depths agreed);
- the uniform lift Δ of every a_d that the variant needs for its modelled Mirror-SD speedup to equal the shipped
  draft's (the break-even; DraftProfile.with_accept moves the measured τ by what the product form says Δ is worth);
- the modelled speedups at the goal profile the wider data aimed for (held-out top-1 0.65 at depth 1 to 0.58 at
  depth 4, the hit rates unchanged; docs/TRAINING.md).

Every speedup printed is modelled from timed step costs, not a measured decode.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GOAL = (0.65, 0.627, 0.603, 0.58)  # the wider data's held-out top-1 goals, depth 1 and 4, linear between


def variant(shipped, folder: str, out: str, **change) -> str:
    """The shipped draft's folder with its weights in a changed shape: layers past the first copy the first; a wider
    MLP tiles its matrices (halving down, so that the output keeps its scale)."""
    import torch

    from mirror_core.models.feature_draft import FeatureDraft

    model = FeatureDraft(replace(shipped.cfg, **change))
    old = shipped.state_dict()
    new = {}
    for key, target in model.state_dict().items():
        source = old.get(key, old.get("layers.0." + key.split(".", 2)[-1]))
        if source.shape != target.shape:  # the wider MLP: gate/up [2I, H] and down [H, 2I]
            dim = 0 if key.endswith((".gate", ".up")) else 1
            source = torch.cat([source, source], dim) * (0.5 if dim == 1 else 1.0)
        new[key] = source.clone()
    model.load_state_dict(new)
    shutil.copytree(folder, out)
    model.save(out)
    return out


def costs_of(target: str, draft: str):
    """The engine's own load-time timings of this pair on the default lanes, as the latency model's StepCosts."""
    from mirror_core import MirrorEngine
    from mirror_core.latency import StepCosts
    from mirror_core.runners.calibrate import BRANCH_ROWS, WINDOW

    engine = MirrorEngine.load(target, draft)
    try:
        info = engine.info
        t, d = info.target_dtype, info.draft_dtype
        return StepCosts(t.ms(t.sequence, "step"), t.ms(t.sequence, "window"), WINDOW,
                         info.default_exit_layer() / info.num_layers, d.ms(d.sequence, "step"), d.ms(d.rows, "rows"),
                         BRANCH_ROWS, WINDOW - 1)
    finally:
        engine.close()


def break_even(costs, profile, goal: float) -> float | None:
    """The smallest uniform lift of every depth's agreement (steps of 0.005) at which the modelled Mirror-SD speedup
    reaches `goal`; None past +0.40."""
    from mirror_core.latency import choose_spec

    for step in range(81):
        lift = step * 0.005
        lifted = profile.with_accept(tuple(min(a + lift, 0.99) for a in profile.accept))
        if choose_spec(costs, lifted).speedup >= goal:
            return lift
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct", help="a folder, hub id or registry name")
    p.add_argument("--draft", default=os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft"))
    args = p.parse_args(argv)

    from mirror_core.latency import choose_spec
    from mirror_core.machine import cpu_model
    from mirror_core.models.feature_draft import load_feature_draft
    from mirror_core.models.prepared import resolve_source
    from mirror_core.models.profile import load_profile

    target = resolve_source(args.target)
    profile = load_profile(args.draft)
    shipped = load_feature_draft(args.draft)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; target {args.target}; the shipped draft's profile: a_d "
          f"{profile.accept}, exit hit rate {profile.hit}")
    with tempfile.TemporaryDirectory() as work:
        os.environ["MIRROR_SD_CACHE"] = os.path.join(work, "cache")  # fresh timings (the target's, timed at the
        # first load, are reused by the next two: the same model shape)
        drafts = {"shipped (1 layer)": args.draft,
                  "2 layers": variant(shipped, args.draft, os.path.join(work, "two"), num_layers=2),
                  "MLP 2x wider": variant(shipped, args.draft, os.path.join(work, "wide"),
                                          intermediate_size=2 * shipped.cfg.intermediate_size)}
        costs = {name: costs_of(target, folder) for name, folder in drafts.items()}
    base = choose_spec(costs["shipped (1 layer)"], profile).speedup
    goal = profile.with_accept(GOAL)
    print("| draft | draft step ms | branch batch ms | target step / window ms | chosen γ, κ | modelled mirror, sd "
          "| break-even lift of every depth | at the goal profile: γ, κ, mirror, sd |")
    print("|---|---|---|---|---|---|---|---|")
    for name, c in costs.items():
        mine, at_goal = choose_spec(c, profile), choose_spec(c, goal)
        lift = break_even(c, profile, base)
        print(f"| {name} | {c.draft_step:.2f} | {c.draft_rows:.2f} | {c.t_ar:.2f} / {c.t_window:.2f} | {mine.gamma}, "
              f"{mine.kappa} | {mine.speedup:.2f}x, {mine.sd_speedup:.2f}x | "
              f"{'—' if lift is None else f'+{lift:.3f}'} | {at_goal.gamma}, {at_goal.kappa}, {at_goal.speedup:.2f}x, "
              f"{at_goal.sd_speedup:.2f}x |")
    return 0


if __name__ == "__main__":  # the draft lane is a spawned process: the main module must be importable
    sys.exit(main())
