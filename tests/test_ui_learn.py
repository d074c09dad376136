"""The Learn tab: before any run it shows the recorded example (player, tree, what-if) with no error; the what-if says
where its figures come from; experiments the pair cannot run are disabled with the reason; the speedup curve and its
accelerator switch; after a run, everything follows the visitor's own run."""
from __future__ import annotations

import html
import json
import os
import re
from dataclasses import replace as with_
from types import SimpleNamespace

import pytest

from mirror_core import LaneConfig
from mirror_core.records import WholeMachine
from testing.net import free_port
from testing.reliability import close_demo, page_values, run_args
from testing.toy_models import build_pair
from ui import LAUNCH, EngineLoader, build_demo, default_presets
from ui.session import Session
from ui.views import by_name

LANES = LaneConfig(kind="inline", target_threads=1, draft_threads=1)


def _launch(loader, tmp_path_factory, target=None, draft=None):
    demo = build_demo(loader, default_presets(str(tmp_path_factory.mktemp("no_pair")), target, draft), ["1, 2, 3"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    return demo, url


class FeaturePairLoader(EngineLoader):
    """A loader whose loaded pair has a feature-reading draft (reads layer 2) and timed nothing at load."""

    def info(self):
        return SimpleNamespace(target="toy-target", draft="toy-feature-draft", draft_features=2, spec_choice=None,
                               target_dtype=None, draft_dtype=None, roofline=None, target_runner="ToyRunner")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A page before any run, its loaded pair a feature-reading one (no engine behind it: nothing may run)."""
    from gradio_client import Client

    loader = FeaturePairLoader(LANES)
    demo, url = _launch(loader, tmp_path_factory)
    try:
        yield lambda: Client(url, verbose=False), demo
    finally:
        close_demo(demo)


@pytest.fixture(scope="module")
def app(pair_root, tmp_path_factory):
    from gradio_client import Client

    target, draft = build_pair(pair_root, "llama")
    loader = EngineLoader(LANES)
    demo, url = _launch(loader, tmp_path_factory, target, draft)
    try:
        yield target, draft, lambda: Client(url, verbose=False), loader
    finally:
        close_demo(demo)
        loader.close()


def _data(page: str, name: str) -> dict:
    return json.loads(html.unescape(re.search(rf"id='mirror-{name}-data' data-\w+='([^']*)'", page).group(1)))


def test_before_any_run_the_learn_tab_shows_the_recorded_step_in_the_player_tree_and_what_if(fresh):
    from ui.learn.example import EXAMPLE, load_example

    example = load_example()
    assert example is not None and example.runs["mirror"].steps, "assets/learn_example/example.json is shipped"
    c = fresh[0]()
    step, phase, player, tree = c.predict(api_name="/tree_first_hit")  # no error: the example's first hit
    assert step >= 1 and phase == 1 and "phase 1 of 6" in player and "mirror-node-hit" in tree
    assert f"Showing the recorded example ({EXAMPLE}" in player and "recorded " in player
    assert "Error" not in player + tree and "<svg viewBox=" in player and "width='100%'" in player  # scales to width
    assert "target prefix 1..ℓ_e" in player and "target_prefix" not in player  # the lane timeline's human labels
    miss = c.predict(api_name="/tree_first_miss")
    assert "Miss: no branch starts with c" not in miss[2] and "phase 1 of 6" in miss[2]
    assert c.predict(miss[0], 6, api_name="/tree")[0].count("Miss: no branch starts with c = ") == 1
    knobs = c.predict(api_name="/whatif_from_run")  # this machine has no run and no timed load: the example, said so
    assert "not this machine's figures" in knobs[-1] and EXAMPLE in knobs[-1] and knobs[0] > 0
    plot, note = c.predict(api_name="/roofline")
    assert "recorded no roofline" in note and "ToyRunner" in note and not plot["visible"]


def test_the_player_follows_a_new_mirror_sd_run_once_without_a_show_press():
    """A comparison's end (and opening the tab) moves the player to the new run's first hit; the same run again
    leaves a step picked since where it is; a comparison without Mirror-SD goes back to the recorded example."""
    import gradio as gr

    from ui.learn.example import load_example
    from ui.learn.tab import follow
    from ui.learn.tree import first_steps

    skip = (gr.skip(),) * 4
    assert follow(Session(), None) == skip + (None,)  # before any run: the example stays as it is
    runs = load_example().runs
    session = Session()
    session.runs, session.history = dict(runs), list(runs.values())
    step, phase, player, tree, key = follow(session, None)
    assert (step, phase) == (first_steps(runs["mirror"])[0], 1) and key == runs["mirror"].start.t0
    assert "Showing your last Mirror-SD run" in player and f"<b>Step {step}</b>" in tree
    assert follow(session, key) == skip + (key,)
    session.runs = {"ar": runs["ar"]}
    *_, player, _, key = follow(session, key)
    assert key is None and "Showing the recorded example" in player


def test_an_experiment_the_loaded_pair_cannot_run_is_disabled_with_its_reason(fresh):
    client, demo = fresh
    offer = next(f.fn for f in demo.fns.values() if f.api_name == "experiment_offer")  # its button is not in the API
    plot, button = offer(Session(), "exit")
    assert "Not for this pair: its draft reads the target's hidden states after layer 2" in html.unescape(plot)
    assert button.interactive is False
    plot, button = offer(Session(), "kappa")
    assert "Not for this pair" not in plot and button.interactive is True
    shown = client().predict("exit", api_name="/experiment_offer")
    assert "after layer 2" in shown and "after layer 2" in client().predict("exit", api_name="/experiment")  # nothing ran


def test_the_what_if_says_where_each_starting_point_comes_from(monkeypatch):
    from ui.learn import starts
    from ui.learn.example import EXAMPLE, load_example

    example = load_example()
    paper = starts.start(starts.PAPER, Session(), None)
    assert "illustrative" in paper.note and paper.knobs.verify_ratio == pytest.approx(40 / 30)
    recorded = starts.start(starts.EXAMPLE, Session(), None)
    assert EXAMPLE in recorded.note and example.cpu in recorded.note and "measured there" in recorded.note
    monkeypatch.setattr(starts.machine, "cpu_model", lambda: "Some Other CPU")
    monkeypatch.setattr("ui.learn.example.machine.cpu_model", lambda: "Some Other CPU")
    elsewhere = starts.start(starts.EXAMPLE, Session(), None)
    assert "another machine, not this one" in elsewhere.note and "measured" in elsewhere.note
    assert "this machine's CPU model" not in elsewhere.note


def test_the_what_if_starts_from_this_machines_load_time_timings():
    from mirror_core.latency import SpecChoice
    from mirror_core.records import Calibration, Roofline, Timing
    from ui.learn import starts
    from ui.learn.example import ROOT
    from ui.whatif import WhatIf

    target = Calibration("target", "auto", "float32", "float32", (Timing("float32", "step", 10.0),
                                                                     Timing("float32", "window", 16.0)))
    draft = Calibration("draft", "auto", "float32", "float32", (Timing("float32", "step", 2.0),
                                                                Timing("float32", "rows", 40.0)))
    roof = Roofline("torch", "", "float32", 1, 1.0, (10.0, 11.0, 12.0))
    info = SimpleNamespace(target="t", draft=os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft"),
                           target_dtype=target, draft_dtype=draft, roofline=roof, num_layers=30,
                           whole_machine=None, serial_cpus=(), overheads=None,
                           spec_choice=SpecChoice(1, 4, 1.32, 1.1, "why", ()),
                           resolve=lambda spec: with_(spec, gamma=1, kappa=4, exit_layer=20))
    knobs = WhatIf.from_load(info)
    assert knobs.t_ar_ms == 10.0 and knobs.draft_ms == 2.0 and knobs.gamma == 1
    from mirror_core.config import DEFAULT_GAMMA

    window = 10.0 + (16.0 - 10.0) * 1 / DEFAULT_GAMMA  # the choice's: linear between the step and the timed window
    assert knobs.verify_ratio == pytest.approx(window / 10.0, abs=1e-3)
    assert knobs.suffix_share == pytest.approx(1 - 20 / 30, abs=1e-3) and knobs.overhead_ms == 0.0
    here = starts.start(starts.THIS_MACHINE, Session(), info)
    assert "this machine's load-time timings" in here.note and "no run has measured it yet" in here.note
    assert "profile" in here.note and "modelled 1.32×" in here.note and "not timed at load" in here.note
    from mirror_core.latency import StepOverheads

    timed = SimpleNamespace(**{**vars(info), "overheads": StepOverheads(1.5, 0.6, 0.4)})  # the load's short runs
    assert WhatIf.from_load(timed).overhead_ms == pytest.approx(1.9)  # the readout and Mirror-SD's own overhead
    assert "(1.90 ms a step) as a short run of each decoder timed them" in starts.start(starts.THIS_MACHINE, Session(),
                                                                                       timed).note


def test_a_measured_figure_outside_a_sliders_range_is_shown_at_its_end_and_said():
    """A run's window timed cheaper than its step (noise on a toy pair: CI once measured 0.457) or a slow model's step
    must not be refused by the sliders: the knob sits at the range's end and the note names the figure."""
    from dataclasses import replace

    from ui.learn.tab import SLIDERS, _in_range
    from ui.whatif import ACCELERATOR

    inside, note = _in_range(ACCELERATOR)
    assert inside == ACCELERATOR.values() and note == ""
    low = {name: lo for name, _, lo, _, _, _ in SLIDERS}
    values, note = _in_range(replace(ACCELERATOR, verify_ratio=low["verify_ratio"] / 2, t_ar_ms=1e6))
    assert values[0] == SLIDERS[0][3] and values[1] == low["verify_ratio"]
    assert "AR's step T_AR (ms) measured 1e+06" in note and f"measured {low['verify_ratio'] / 2:g}" in note


def test_the_speedup_curve_and_its_accelerator_switch():
    from ui.learn.curve import break_even, curve_html, speedups
    from ui.learn.example import load_example
    from ui.numbers import latency_model
    from ui.whatif import WhatIf

    example = load_example()
    cpu = WhatIf.from_model(latency_model(example.runs["mirror"], example.runs["ar"]), example.gamma)
    plain, fast = curve_html(cpu), curve_html(cpu, accelerator=True)
    a, b = _data(plain, "curve"), _data(fast, "curve")
    assert a["by_tau"] != b["by_tau"] and b["here"]["verify"] == 1.0 and a["here"]["verify"] == cpu.verify_ratio
    assert b["here"]["mirror"] > a["here"]["mirror"]  # a cheaper verification: a faster Mirror-SD (modelled)
    assert a["by_verify"]["mirror"] == sorted(a["by_verify"]["mirror"], reverse=True)  # dearer verify, slower
    assert "1× AR" in plain and "you are here" in plain and "Modelled" in plain and "modelled" in plain
    even = break_even(cpu)
    if even is not None:  # where the curve crosses 1×, the model says 1×
        assert speedups(with_(cpu, verify_ratio=even))[0] == pytest.approx(1.0, abs=1e-3)


def test_the_accelerator_view_moves_the_draft_and_the_readout_and_gives_the_papers_ordering_or_names_the_term():
    """Verify ≈ 1 step (the paper's accelerator) also shrinks the readout with the window and puts the branch batch
    on the draft's own device (≤ one fresh rollout); with a draft whose cost matters and the branches hidden behind
    the suffix, Mirror-SD is ahead of vanilla SD, as in the paper's Table 1; where a term prevents it, it is named."""
    from ui.learn.curve import curve_html
    from ui.learn.example import load_example
    from ui.whatif import WhatIf, on_accelerator, ordering, prediction
    from ui.numbers import latency_model

    example = load_example()
    cpu = WhatIf.from_model(latency_model(example.runs["mirror"], example.runs["ar"]), example.gamma)
    fast = on_accelerator(cpu)
    assert fast.verify_ratio == 1.0 and fast.overhead_ms == pytest.approx(cpu.overhead_ms / cpu.verify_ratio)
    assert fast.branch_factor == 1.0 and (fast.draft_ms, fast.tau, fast.ff) == (cpu.draft_ms, cpu.tau, cpu.ff)
    m = fast.model()
    assert m.t_branch <= m.delta and m.t_fresh >= 0.1 * m.t_ar  # the paper's conditions: hidden, and it matters
    p = prediction(fast)
    text = html.unescape(curve_html(cpu, accelerator=True))
    assert "On an accelerator (modelled: the window's forward = one AR step" in text and "kept as the knobs" in text
    if p["mirror_x"] >= p["sd_x"]:
        assert "the paper's ordering" in ordering(fast)
        assert f"Mirror-SD {p['mirror_x']:.2f}× ≥ vanilla SD {p['sd_x']:.2f}×" in text
    else:  # this recording's readout and messages outweigh the rollout SD waits for: the term is named
        assert "the largest term that prevents it" in ordering(fast) and f"Mirror-SD {p['mirror_x']:.2f}×" in text
    cheap = with_(fast, overhead_ms=0.1 * fast.overhead_ms)  # a readout as cheap as the paper's: its ordering
    q = prediction(cheap)
    assert q["mirror_x"] >= q["sd_x"] and "the paper's ordering" in ordering(cheap)
    every_miss = with_(cheap, ff=1.0)  # every step falls back: Mirror-SD pays SD's rollout and its own readout
    assert "the largest term that prevents it: the fallback rollouts FF·T_fresh" in ordering(every_miss)


def test_the_speedup_curve_endpoint_follows_the_switch(fresh):
    c = fresh[0]()
    from ui.learn.starts import PAPER, start

    knobs = start(PAPER, Session(), None).knobs.values()
    plain, fast = c.predict(*knobs, False, api_name="/speedup_curve"), c.predict(*knobs, True, api_name="/speedup_curve")
    assert _data(plain, "curve")["by_tau"] != _data(fast, "curve")["by_tau"] and "accelerator case" in fast


def test_a_sweep_says_when_it_measured_a_better_setting_than_the_chosen_one():
    from mirror_core import SpecConfig
    from ui.learn.experiments import EXPERIMENTS, Point, sweep_verdict

    kappa = EXPERIMENTS["kappa"]
    points = [Point("κ = 2", {"speedup mirror": 0.931}), Point("κ = 4", {"speedup mirror": 0.848})]
    text = sweep_verdict(kappa, points, SpecConfig(gamma=1, kappa=4), chosen=True)
    assert "measured a better setting: κ = 2 at 0.931× AR" in text and "chosen for this machine" in text
    tie = sweep_verdict(kappa, [Point("κ = 2", {"speedup mirror": 0.85})] + points[1:], SpecConfig(1, 4), False)
    assert "within 5 % of the best" in tie and "the run's κ = 4" in tie.lower()
    assert sweep_verdict(EXPERIMENTS["prompts"], points, SpecConfig(1, 4), True) == ""


def test_the_whole_machine_factor_is_shown_only_when_its_timings_agree():
    from ui.numbers import machine_line

    def line(ratios, all_ms=12.0, serial_cpus=()):
        whole = WholeMachine(1, 10.0, 2, all_ms, ratios)
        settings = SimpleNamespace(whole_machine=whole, draft="d", serial_cpus=serial_cpus)
        return html.unescape(machine_line(SimpleNamespace(start=SimpleNamespace(settings=settings))))

    assert WholeMachine(1, 10.0, 2, 12.0, (1.05, 1.45, 1.23)).settled  # all on one side: a fact, however spread
    noisy = line((0.95, 1.45, 1.23, 1.1))
    assert "within timing noise" in noisy and "0.95–1.45×" in noisy and "1.20×" not in noisy
    assert "within timing noise" in line(()) and "timed once" in line(())
    settled = line((1.18, 1.22, 1.2, 1.21))
    assert "about 1.20×" in settled and "4 alternated timings" in settled
    assert "AR here ran on the target lane's 1 core while" in settled
    # AR ran on every core (faster there at load): the footnote says so, as the verdict does, not the lane's core
    everywhere = line((0.8, 0.79, 0.81), all_ms=8.0, serial_cpus=(0, 1))
    assert "AR here ran on all 2 cores, the whole machine" in everywhere and "8.0 ms against 10.0 ms" in everywhere
    assert "target lane's 1 core while" not in everywhere and "of what it says" not in everywhere
    # another process held a core: 270.8 ms on every core against 3.2 ms on the lane is no correction to print
    held = html.unescape(machine_line(SimpleNamespace(start=SimpleNamespace(settings=SimpleNamespace(
        whole_machine=WholeMachine(1, 3.2, 2, 270.8, (84.0, 83.1, 83.5, 83.3), retimed=2), draft="d",
        serial_cpus=())))))
    assert "of what it says" not in held and "83.3" not in held and "more than 3× apart" in held
    assert "timed 3 times before this comparison" in held and "270.8 ms against 3.2 ms" in held


def test_the_learn_tab_follows_the_visitors_own_run(app):
    """After a run: the player, the tree, the roofline, the what-if and the experiments use it."""
    target, draft, client, _ = app
    c = client()
    values = run_args(page_values(prompt="1, 2, 3", target=target, draft=draft, decoders=["ar", "sd", "mirror"],
                                  gamma=3, kappa=2, max_new_tokens=24))
    final = [by_name(o) for o in c.submit(*values, api_name="/run")][-1]
    assert "Done" in final["status"]
    plot, note = c.predict(api_name="/roofline")
    assert plot["visible"] and "window of γ+1 = 4 rows" in note and "Timed on this machine" not in note
    knobs = c.predict(api_name="/whatif_from_run")
    assert "your last run" in knobs[-1] and knobs[0] > 0 and knobs[6] >= 1  # T_AR, τ
    step, phase, player, tree = c.predict(api_name="/tree_first_hit")
    assert "Showing your last Mirror-SD run" in player and f"<b>Step {int(step)}</b>" in tree
    assert "Vanilla SD on the same step</b> (the SD run's median spans)" in player
    texts = []
    for k in range(1, 6):  # every phase, each with its own sentence and measured milliseconds
        phase, player, again = c.predict(step, k, api_name="/player_next")  # one phase; no timer started
        assert phase == k + 1 and f"phase {k + 1} of 6" in player and again == tree
        texts.append(re.search(r"<p id='mirror-player-text'>(.*)</p>", player).group(1))
    assert " ms" in texts[0] and texts[-1].startswith("Hit: c = ") and len(set(texts)) == 5
    assert c.predict("mirror", 0, api_name="/inspect_next_hit") == step  # the Run tab's inspector finds it too
    s, k, linked, _ = c.predict("mirror", step, api_name="/inspect_learn")  # "Slow it down": the Learn tab (and it opens)
    assert (s, k) == (step, 1) and "phase 1 of 6" in linked
    with pytest.raises(Exception, match="the step player plays Mirror-SD steps"):
        c.predict("sd", 1, api_name="/inspect_learn")
    with pytest.raises(Exception, match="no hit after step 100000"):
        c.predict("mirror", 100000, api_name="/inspect_next_hit")
    base = c.predict(*knobs[:-1], api_name="/whatif")
    assert "tokens/s (modelled)" in base and base != c.predict(knobs[0], 1.0, *knobs[2:-1], api_name="/whatif")
    with pytest.raises(Exception, match="less than minimum value 0.05"):  # Gradio checks the slider bounds first
        c.predict(0, *knobs[1:-1], api_name="/whatif")
    plot = c.predict("kappa", api_name="/experiment")  # a sweep over κ on the last run's pair and prompt
    data = _data(plot, "experiment")
    assert [p["x"] for p in data] == ["κ = 1", "κ = 2", "κ = 4", "κ = 8"] and "Done: 5 runs" in plot
    assert "κ = 2" in plot.split("Done:")[1]  # the sweep says how the run's κ compares with the best
    assert "Kept from earlier" in c.predict("kappa", api_name="/experiment")
    plot = c.predict("exit", api_name="/experiment")  # hit rate against the early-exit layer: N/4 .. 3N/4
    from ui.learn.experiments import EXPERIMENTS, exit_layer
    layers = list(dict.fromkeys(exit_layer(f, 4) for f in EXPERIMENTS["exit"].values))  # the toy target: 4 layers
    assert [p["x"] for p in _data(plot, "experiment")] == [f"ℓ_e = {n}" for n in layers]
    assert exit_layer((1, 4), 30) == 8 and exit_layer((2, 3), 30) == 20 and exit_layer((3, 4), 2) == 1


def test_the_what_if_reproduces_the_latency_model_and_moves_with_its_knobs():
    from mirror_core.latency import LatencyModel
    from ui.whatif import ACCELERATOR, WhatIf, prediction, whatif_html, why

    paper = prediction(ACCELERATOR)
    assert paper["mirror_x"] == pytest.approx(5 * 30 / 43.5, rel=1e-6) and paper["sd_x"] == pytest.approx(3.0)
    cpu = WhatIf(12.2, 1.38, 0.49, 1.40, 1.76, 1.0, 3.18, 0.34, 4)  # a CPU-like set of knobs (test input)
    assert "not hidden" in why(cpu) and "so the draft is hidden" in why(with_(cpu, branch_factor=1.0))
    cheaper = with_(cpu, verify_ratio=1.0)  # verification as cheap as one step, as on an accelerator
    assert prediction(cheaper)["mirror"] > prediction(cpu)["mirror"] and prediction(cheaper)["ar"] == prediction(cpu)["ar"]
    m = LatencyModel(0.008, 0.0007, 0.008, 0.010, 0.0003, 0.0056, ff=0.34, tau=3.2, t_ar=0.012, measured_step=0.02)
    back = WhatIf.from_model(m, gamma=4).model()
    assert back.expected_step == pytest.approx(m.expected_step, rel=1e-3) and back.t_sd == pytest.approx(m.t_sd, rel=1e-3)
    page = whatif_html(cpu)
    assert "modelled" in page and "Table 1 means" in page and page.count("mirror-bar") == 3


def test_the_player_replays_a_step_accelerator_shaped_and_says_it_is_modelled():
    from mirror_core.latency import ar_step_time
    from ui.learn.example import load_example
    from ui.learn.tab import MEASURED, SHAPED, step_views
    from ui.learn.retime import accelerator_shaped

    example = load_example()
    mirror, ar = example.runs["mirror"], example.runs["ar"]
    shaped, t_ar = accelerator_shaped(mirror, ar), ar_step_time(ar.spans)
    measured_spans = {(s.step, s.stage): s.t1 - s.t0 for s in mirror.spans}
    following = {rec.step - 1: rec.source for rec in mirror.steps}  # step → where the window after it came from
    for rec in mirror.steps:
        spans = {s.stage: s for s in shaped.spans if s.step == rec.step}
        length = lambda st: spans[st].t1 - spans[st].t0  # noqa: E731
        if not rec.drafted:  # a window of zero: a plain step, no window to re-time
            continue
        window = length("target_prefix") + length("target_suffix")
        was = measured_spans[rec.step, "target_prefix"] + measured_spans[rec.step, "target_suffix"]
        assert window == pytest.approx(min(t_ar, was))  # one AR step, as on an accelerator
        scale = window / was  # the readout shrinks with the window
        assert length("exit_readout") == pytest.approx(scale * measured_spans[rec.step, "exit_readout"])
        if "draft_branches" in spans:  # branches were rolled out (the run's last step may end first): from M_t on
            assert spans["draft_branches"].t0 == pytest.approx(spans["exit_readout"].t1)
        if rec.step in following:  # a fresh rollout after the step iff the next window is the draft model's
            assert (following[rec.step] == "model") == ("draft_rollout" in spans), rec.step
    assert accelerator_shaped(mirror, None) is None  # no AR run, no T_AR to scale to
    measured, tree = step_views(Session(), 2, 6, MEASURED)
    modelled, same_tree = step_views(Session(), 2, 6, SHAPED)
    assert "Accelerator-shaped, modelled" in modelled and "Not a measurement" in modelled and tree == same_tree
    assert "re-timed (modelled)" in modelled and "as measured" in measured and "modelled" not in measured.split("Step 2")[1]


def test_the_learn_tabs_new_terms_have_a_line_in_the_glossary():
    from ui.learn.glossary import GLOSSARY

    assert {"verify cost", "break-even verify cost", "you are here", "recorded example", "accelerator-shaped timeline",
            "load-time timings"} <= {term for term, _ in GLOSSARY}


def test_the_what_if_explains_a_negative_saving_beside_a_hidden_draft():
    """"Draft hidden" and "−2.0 ms saved" can both be true: the sentence says which of Mirror-SD's own stages cost it."""
    from mirror_core.latency import LatencyModel
    from ui.whatif import why_model

    costly = LatencyModel(t_pre=0.01, t_rv_ee=0.002, delta=0.005, t_branch=0.004, t_rv_fv=0.001, t_fresh=0.002,
                          ff=0.5, tau=1.5, t_ar=0.012, measured_step=0.02)
    text = why_model(costly)
    assert "so the draft is hidden" in text and "-2.0 ms saved: a loss" in text and "add 4.0 ms a step" in text
    cheap = LatencyModel(t_pre=0.01, t_rv_ee=0.0005, delta=0.005, t_branch=0.004, t_rv_fv=0.0005, t_fresh=0.008,
                         ff=0.3, tau=1.5, t_ar=0.012, measured_step=0.02)
    assert "+4.6 ms saved)" in why_model(cheap) and "a loss" not in why_model(cheap)


def test_the_roofline_shows_the_whole_machines_line_and_step():
    """The baseline runs on every core: the view draws their memory limit and the measured step, and says both."""
    from mirror_core.events import Roofline
    from ui.learn.roofline import roofline_figure, roofline_sentence

    roof = Roofline("avx512_vnni", "", "int8 on q4_1+q8_0", 96_000_000, 16.0, (6.0, 6.5, 7.0), 134_000_000, 900.0,
                    machine_cores=2, machine_read_gbs=32.0, machine_step_ms=3.2)
    names = [t.name for t in roofline_figure(roof).data]
    assert "memory limit on all 2 cores" in names and "AR step on all 2 cores (the baseline)" in names
    text = roofline_sentence(roof, 2)
    assert "On all 2 cores, as the baseline (AR) runs, the step took 3.2 ms against 3.0 ms" in text and "94%" in text


def test_the_players_header_counts_the_phases_it_names_and_next_moves_one():
    """'phase k of 6' over a trail of six names (no name with an arrow of its own), and Next moves one phase."""
    from ui.learn.example import load_example
    from ui.learn.player import player_html
    from ui.learn.tab import PHASES, _one_phase_on

    run = load_example().runs["mirror"]
    head = re.search(r"phase (\d) of (\d): (.*?)</p>", player_html(run, run.steps[0].step, 0)).groups()
    assert head[:2] == ("1", str(PHASES)) and len(re.sub("<[^>]+>", "", head[2]).split("→")) == PHASES
    assert _one_phase_on(Session(), run.steps[0].step, 2)[0] == 3 and _one_phase_on(Session(), 1, PHASES)[0] == PHASES
