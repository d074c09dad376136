"""Settings chosen per machine (latency.choose_spec): the latency model over measured step costs and a draft's
profile picks γ and κ; what it picks moves the way the model says it should, and the engine, the CLI and the page use
it only where the user left γ/κ unset."""
from __future__ import annotations

import json
import os

import pytest

from mirror_core.config import MirrorError, SpecConfig
from mirror_core.latency import DraftProfile, StepCosts, choose_spec, modelled_speedups
from mirror_core.models.profile import FILE, load_profile, save_profile
from ui.settings import CONTROLS, DEFAULTS, controls_by_name, settings_from_ui

COSTS = StepCosts(t_ar=20.0, t_window=30.0, window_rows=5, exit_share=2 / 3, draft_step=3.0, draft_rows=25.0,
                  rows=10, depth=4)


def test_tau_and_the_model_follow_the_definitions():
    p = DraftProfile((0.5, 0.4), (0.3, 0.5))
    assert p.tau(1) == pytest.approx(1.5) and p.tau(3) == pytest.approx(1 + 0.5 + 0.2 + 0.08)  # a_d past the end: last
    assert p.hit_rate(1) == 0.3 and p.hit_rate(4) == 0.5
    mirror, sd = modelled_speedups(COSTS, p, 2, 1)
    verify = 20 + 10 * 2 / 4
    branch = 25 * 3 * 2 / 40 + 3
    assert sd == pytest.approx(p.tau(2) * 20 / (verify + 6))
    assert mirror == pytest.approx(p.tau(2) * 20 / (verify * 2 / 3 + max(verify / 3, branch) + 0.7 * 6))
    from dataclasses import replace

    from mirror_core.latency import StepOverheads

    timed = replace(COSTS, overheads=StepOverheads(readout=1.5, sd=0.6, mirror=0.4))  # the load's short runs
    mirror, sd = modelled_speedups(timed, p, 2, 1)
    assert sd == pytest.approx(p.tau(2) * 20 / (verify + 6 + 0.6))  # each decoder's own overhead, the readout serial
    assert mirror == pytest.approx(p.tau(2) * 20 / (verify * 2 / 3 + 1.5 + max(verify / 3, branch) + 0.7 * 6 + 0.4))
    # each window as the load's runs measured it where it runs, at γ 2: SD's 20 ms, Mirror-SD's 30 ms (the lane's 25)
    ran = replace(COSTS, overheads=StepOverheads(1.5, 0.6, 0.4, sd_verify=20.0, gamma=2, mirror_verify=30.0))
    assert ran.sd_window(4) == pytest.approx(COSTS.verify(4) * 20 / 25) and ran.mirror_window(2) == pytest.approx(30)
    mirror, sd = modelled_speedups(ran, p, 2, 1)
    assert sd == pytest.approx(p.tau(2) * 20 / (20 + 6 + 0.6))
    assert mirror == pytest.approx(p.tau(2) * 20 / (30 * 2 / 3 + 1.5 + max(30 / 3, branch) + 0.7 * 6 + 0.4))
    rolled = replace(COSTS, overheads=replace(ran.overheads, rollout=8.0))  # SD's 2-token rollouts ran 8 ms: 4 a token
    assert rolled.draft_token == 4.0 and modelled_speedups(rolled, p, 2, 1)[1] == pytest.approx(
        p.tau(2) * 20 / (20 + 8 + 0.6))


def test_a_better_draft_or_a_cheaper_window_earns_a_longer_window():
    weak, strong = DraftProfile((0.3,), (0.5,)), DraftProfile((0.9,), (0.5,))
    assert choose_spec(COSTS, strong).gamma > choose_spec(COSTS, weak).gamma
    cheap = StepCosts(20.0, 21.0, 5, 2 / 3, 3.0, 25.0, 10, 4)       # a window costs about one step (an accelerator)
    assert choose_spec(cheap, weak).gamma >= choose_spec(COSTS, weak).gamma
    c = choose_spec(COSTS, strong)
    assert c.speedup == max(s for _, _, s in c.table) and c.why.startswith(f"γ {c.gamma}: a ")
    # a better exit buys more candidates only while their branches fit in the suffix
    rich = DraftProfile((0.6,), (0.2, 0.6, 0.7, 0.75))
    assert choose_spec(COSTS, rich).kappa >= 2


def test_profile_round_trip_and_bad_files(tmp_path):
    save_profile(str(tmp_path), [0.6, 0.5], [0.3, 0.4], "test")
    assert load_profile(str(tmp_path)) == DraftProfile((0.6, 0.5), (0.3, 0.4))
    assert load_profile(None) is None and load_profile(str(tmp_path / "none")) is None
    with open(os.path.join(tmp_path, FILE), "w") as f:
        json.dump({"accept_by_depth": [1.5], "hit_by_kappa": [0.1]}, f)
    with pytest.raises(MirrorError, match="shares in 0..1"):
        load_profile(str(tmp_path))


def test_a_measured_tau_by_gamma_is_read_as_measured_and_continued_past_its_end(tmp_path):
    """τ replayed from decoding's own rollouts (train/feature_distill.py, chains) is what the model reads where the
    profile has it; past its last γ the product of a_d continues it."""
    p = DraftProfile((0.5, 0.4), (0.3,), (1.45, 1.62))
    assert p.tau(1) == 1.45 and p.tau(2) == 1.62
    assert p.tau(3) == pytest.approx(1.62 + 0.5 * 0.4 * 0.4)  # the product form's increment from γ 2 to 3
    moved = p.with_accept((0.6, 0.4))  # a modelled better draft: measured τ moves by the product form's change
    assert moved.tau(1) == pytest.approx(1.55) and moved.tau(2) == pytest.approx(1.62 + 0.1 + 0.6 * 0.4 - 0.2)
    save_profile(str(tmp_path), [0.5, 0.4], [0.3], "test", [1.45, 1.62])
    assert load_profile(str(tmp_path)) == p
    save_profile(str(tmp_path), [0.5], [0.3], "test", [1.45, 3.5])  # 3.5 tokens a pass at γ 2 cannot be
    with pytest.raises(MirrorError, match="tau_by_gamma"):
        load_profile(str(tmp_path))


def test_a_replayed_hit_rate_is_read_by_gamma_and_kappa(tmp_path):
    p = DraftProfile((0.5,), (0.3, 0.4), (), ((0.45, 0.56), (0.40, 0.51)))
    assert p.hit_rate(2, 1) == 0.56 and p.hit_rate(1, 2) == 0.40 and p.hit_rate(4, 2) == 0.51  # κ past the row: last
    assert p.hit_rate(2, 3) == 0.51 and p.hit_rate(2) == 0.4  # past the measured γ: the last; none: the per-κ list
    mirror, _ = modelled_speedups(COSTS, p, 1, 2)
    verify = 20 + 10 * 1 / 4
    assert mirror == pytest.approx(p.tau(1) * 20 / (verify * 2 / 3 + max(verify / 3, 25 * 4 * 1 / 40 + 3) + 0.44 * 3))
    save_profile(str(tmp_path), [0.5], [0.3, 0.4], "test", None, [[0.45, 0.56], [0.40, 0.51]])
    assert load_profile(str(tmp_path)) == p
    save_profile(str(tmp_path), [0.5], [0.3], "test", None, [[0.45, 1.2]])
    with pytest.raises(MirrorError, match="hit_by_gamma_kappa"):
        load_profile(str(tmp_path))


def test_the_page_leaves_to_the_pair_only_what_is_left_at_zero():
    """γ, κ, ℓ_e at 0 on the page are None in the request: the loaded pair decides them in MirrorEngine.validate
    (tests/test_defaults.py checks what it decides)."""
    values = {**DEFAULTS, "prompt": "hi", "target": "t", "draft": "d"}
    s = settings_from_ui(controls_by_name([values[k] for k in CONTROLS]))
    (req, *_) = s.requests((1, 2))
    assert (req.spec.gamma, req.spec.kappa, req.spec.exit_layer) == (None, None, None)
    s = settings_from_ui({**values, "gamma": 6, "kappa": 0, "exit_layer": 3})
    (req, *_) = s.requests((1, 2))
    assert (req.spec.gamma, req.spec.kappa, req.spec.exit_layer) == (6, None, 3)
