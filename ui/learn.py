"""The Learn tab: the step player and tree, experiments, the target against its roofline (ui/roofline.py), what-if on
other hardware (modelled, ui/whatif.py) and a glossary of every term the page uses.

Its handlers touch no engine but the experiments' runs: the roofline is the last run's load-time record, the what-if
is arithmetic on the latency model, and "start from my last run" only reads the visitor's own session (the Run tab's
last AR and Mirror-SD runs).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from mirror_core import MirrorError

from .numbers import latency_model
from .session import Session
from .experiments import EXPERIMENTS, NEW_TOKENS, plot_html, run_experiment
from .glossary import GLOSSARY
from .player import player_html
from .roofline import AFTER_A_RUN_HTML, roofline_view
from .tree import first_steps, tree_html
from .whatif import KNOBS, PRESETS, WhatIf, whatif_html

# (knob, label, lowest, highest, step, one-line help)
SLIDERS = (
    ("t_ar_ms", "Target step T_AR (ms)", 0.5, 200.0, 0.5, "One target-only decode step (one token)."),
    ("verify_ratio", "Verify γ+1 tokens / one step", 1.0, 6.0, 0.01,
     "How much a verification window costs against one token: ≈ 1 on accelerators, larger on CPUs."),
    ("suffix_share", "Share after the early exit (Δ)", 0.05, 0.95, 0.01,
     "The part of the verification pass after layer ℓ_e: the time the draft's branches can hide in."),
    ("draft_ms", "Draft time per token (ms)", 0.05, 50.0, 0.05, "One draft forward; a fresh rollout is γ of them."),
    ("branch_factor", "Branch batch / fresh rollout", 0.5, 20.0, 0.05,
     "The batched rollout of all branches against one fresh γ-token rollout (rows are cheap on accelerators)."),
    ("overhead_ms", "Readout + messages (ms)", 0.0, 20.0, 0.1, "T_rv: the early-exit readout, the messages, acceptance."),
    ("tau", "τ (tokens per step)", 1.0, 17.0, 0.01, "Tokens committed per verification step, bonus/correction included."),
    ("ff", "Fallback frequency", 0.0, 1.0, 0.01, "Share of steps where no precomputed branch matched (a fresh rollout)."),
    ("gamma", "γ (draft tokens per window)", 1, 16, 1, "Window length."),
)
assert tuple(s[0] for s in SLIDERS) == KNOBS
PHASES = 6  # ui/player.py: window in, layers 1..ℓ_e, early exit → M_t, suffix ∥ branches, acceptance, hit or miss
SPEEDS = {"0.5 s": 0.5, "1 s": 1.0, "2 s": 2.0, "4 s": 4.0}  # wall time per phase when playing


@dataclass(frozen=True)
class StepPlayer:
    """The step player's components, for the Run tab's "slow this step down" link."""

    step: gr.Number
    phase: gr.Slider
    player: gr.HTML
    tree: gr.HTML
    views: Callable  # (session, step, phase) → (player HTML, tree HTML)


def build(state: gr.State, loader, tab: gr.Tab) -> StepPlayer:
    player = _step(state)
    _experiments(state, loader)
    _roofline(state, tab)
    _whatif(state)
    return player


def _step(state: gr.State) -> StepPlayer:
    gr.Markdown("## One step, slowed down\nPick a step of your last Mirror-SD run (the Run tab; **First hit** and "
                "**First miss** find one of each) and play it phase by phase on its measured time axis: the window "
                "enters the target, the early exit sends its candidates, the draft lane rolls out a branch per "
                "candidate while the target finishes its layers, acceptance decides, and a hit reuses a branch. "
                "Below, the same step's branch tree: each slot's candidates as roots with the branch rolled out for "
                "each; the highlighted root is the correction on a hit, and its branch (cyan) became the next window.")
    with gr.Row():
        step = gr.Number(value=None, label="Step", precision=0, minimum=1, elem_id="mirror-tree-step", min_width=120)
        hit = gr.Button("First hit", elem_id="mirror-tree-hit")
        miss = gr.Button("First miss", elem_id="mirror-tree-miss")
        show = gr.Button("Show", elem_id="mirror-tree-show")
    with gr.Row():
        phase = gr.Slider(1, PHASES, value=1, step=1, label="Phase", elem_id="mirror-player-phase", min_width=220)
        back = gr.Button("◀ Back", elem_id="mirror-player-back")
        forward = gr.Button("Next ▶", elem_id="mirror-player-next")
        play = gr.Button("Play", elem_id="mirror-player-play")
        pause = gr.Button("Pause", elem_id="mirror-player-pause")
        speed = gr.Radio(list(SPEEDS), value="1 s", label="Per phase", elem_id="mirror-player-speed", min_width=200)
    timer = gr.Timer(SPEEDS["1 s"], active=False)
    player = gr.HTML(player_html(None, None, 0), elem_id="mirror-player")
    tree = gr.HTML(tree_html(None, None), elem_id="mirror-tree")

    def views(session: Session, s, k):
        run = session.runs.get("mirror")
        return player_html(run, s, int(k) - 1, session.runs.get("sd")), tree_html(run, s)

    def pick(which: int):
        def handler(session: Session):
            run = session.runs.get("mirror")
            found = first_steps(run)[which]
            if found is None:
                raise gr.Error("run Mirror-SD on the Run tab first" if run is None else
                               f"your last Mirror-SD run has no {'hit' if which == 0 else 'miss'}",
                               print_exception=False)
            return (found, 1) + views(session, found, 1)
        return handler

    def tick(session: Session, s, k):
        k = min(int(k) + 1, PHASES)
        return (k,) + views(session, s, k) + (gr.Timer(active=k < PHASES),)

    hit.click(pick(0), state, [step, phase, player, tree], api_name="tree_first_hit", queue=False)
    miss.click(pick(1), state, [step, phase, player, tree], api_name="tree_first_miss", queue=False)
    show.click(views, [state, step, phase], [player, tree], api_name="tree", queue=False)
    phase.release(views, [state, step, phase], [player, tree], api_name=False, queue=False)
    back.click(lambda session, s, k: (max(int(k) - 1, 1),) + views(session, s, max(int(k) - 1, 1)),
               [state, step, phase], [phase, player, tree], api_name=False, queue=False)
    forward.click(tick, [state, step, phase], [phase, player, tree, timer], api_name="player_next", queue=False)
    play.click(lambda k, v: (1 if int(k) >= PHASES else k, gr.Timer(SPEEDS[v], active=True)), [phase, speed],
               [phase, timer], api_name=False, queue=False)
    pause.click(lambda: gr.Timer(active=False), None, timer, api_name=False, queue=False)
    speed.change(lambda v: gr.Timer(SPEEDS[v]), speed, timer, api_name=False, queue=False)
    timer.tick(tick, [state, step, phase], [phase, player, tree, timer], api_name=False, queue=False)
    return StepPlayer(step, phase, player, tree, views)


def _experiments(state: gr.State, loader) -> None:
    gr.Markdown("## Experiments\nSmall sweeps on the pair and prompt of your last run on the Run tab, each a few "
                f"dozen real runs of {NEW_TOKENS} tokens: measured points, and dashed the latency model's prediction "
                "from the same runs (modelled). Each asks a question the plot answers. Results are kept for this "
                "session; Stop ends a sweep within one run.")
    first = next(iter(EXPERIMENTS))
    with gr.Row():
        pick = gr.Radio([(e.title, k) for k, e in EXPERIMENTS.items()], value=first, label="Experiment",
                        elem_id="mirror-experiment-pick")
        start = gr.Button("Run experiment", variant="primary", elem_id="mirror-experiment-run")
        stop = gr.Button("Stop", elem_id="mirror-experiment-stop")
    plot = gr.HTML(plot_html(EXPERIMENTS[first], []), elem_id="mirror-experiment")

    def on_run(session: Session, key):
        exp = EXPERIMENTS.get(key) if isinstance(key, str) else None
        last = next((r for r in (session.runs.get(d) for d in ("mirror", "sd", "ar")) if r and r.start), None)
        if exp is None or last is None or last.start.settings.draft is None:
            raise gr.Error("run the Run tab with a draft first: the experiments use its pair and prompt"
                           if exp else f"unknown experiment {key!r}", print_exception=False)
        settings = last.start.settings
        spec = settings.request.spec
        cache_key = (key, settings.target, settings.draft, last.start.prompt_ids, spec)
        if cache_key in session.experiments:
            yield plot_html(exp, session.experiments[cache_key], "Kept from earlier in this session.")
            return
        try:
            engine = loader.get(settings.target, settings.draft)
        except MirrorError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        session.experiment_stop = stop_flag = threading.Event()
        points, total = [], 0
        try:
            for done, total, points in run_experiment(engine, exp, last.start.prompt_ids, spec, stop_flag,
                                                      encode=engine.encode):
                if stop_flag.is_set():
                    yield plot_html(exp, points, f"Stopped after {done} of {total} runs.")
                    return
                yield plot_html(exp, points, f"Running: {done} of {total} runs…")
        except MirrorError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        session.experiments[cache_key] = points
        yield plot_html(exp, points, f"Done: {total} runs of {NEW_TOKENS} new tokens on {settings.target} + "
                                     f"{settings.draft}, γ {spec.gamma}, κ {spec.kappa} unless swept.")

    start.click(on_run, [state, pick], plot, api_name="experiment", concurrency_id="lanes", concurrency_limit=1,
                show_progress="hidden")
    stop.click(lambda session: session.experiment_stop.set(), state, None, api_name=False, queue=False)
    pick.change(lambda key: plot_html(EXPERIMENTS[key], []), pick, plot, api_name=False, queue=False)


def _roofline(state: gr.State, tab: gr.Tab) -> None:
    gr.Markdown("## Why is verifying a window nearly free? The roofline\nThe target's forward time against its "
                "number of new rows (1 = an AR step, γ+1 = a verification window), measured when your last run's pair "
                "loaded, beside the two limits no forward beats: reading every weight once (weights ÷ bandwidth, "
                "flat) and doing the arithmetic (the compute limit, rising). Their larger is the model (dashed, "
                "*modelled*). The what-if's *Verify γ+1 tokens / one step* knob below is this chart's window cost. "
                "It redraws when you open this tab.")
    show = gr.Button("Show my last run's roofline", elem_id="mirror-roofline-show", size="sm")
    plot = gr.Plot(visible=False, show_label=False, elem_id="mirror-roofline-plot")
    note = gr.HTML(AFTER_A_RUN_HTML, elem_id="mirror-roofline")

    def redraw(session: Session):
        figure, text = roofline_view(session)
        return gr.Plot(figure, visible=figure is not None), text

    show.click(redraw, state, [plot, note], api_name="roofline", queue=False)
    tab.select(redraw, state, [plot, note], api_name=False, queue=False)


def _whatif(state: gr.State) -> None:
    gr.Markdown("## What if the hardware were different? *(modelled)*\n"
                "The latency model of the Run tab's numbers, with its terms as knobs. Start from this machine, "
                "from your last run, or from the paper's illustrative accelerator, then move a knob and watch the "
                "three decoders' modelled speed. Nothing here is timed: every figure below is **modelled**.")
    with gr.Row():
        preset = gr.Radio(list(PRESETS), value=next(iter(PRESETS)), label="Start from", elem_id="mirror-whatif-preset")
        mine = gr.Button("Start from my last run", elem_id="mirror-whatif-mine")
    note = gr.Markdown("", elem_id="mirror-whatif-note")
    start = next(iter(PRESETS.values()))
    knobs = []
    with gr.Row():
        for name, label, lo, hi, step, info in SLIDERS:
            knobs.append(gr.Slider(lo, hi, value=getattr(start, name), step=step, label=label, info=info,
                                   elem_id=f"mirror-whatif-{name}", min_width=220))
    result = gr.HTML(whatif_html(start), elem_id="mirror-whatif")
    with gr.Accordion("Glossary: every term on this page, in one line", open=False):
        gr.HTML("<table class='mirror-table' id='mirror-glossary'>" + "".join(
            f"<tr><th>{term}</th><td>{text}</td></tr>" for term, text in GLOSSARY) + "</table>")

    def redraw(*values):
        for (_, label, lo, hi, _, _), v in zip(SLIDERS, values):  # the endpoint takes what any client sends
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise gr.Error(f"{label} must be a number in {lo}..{hi}, got {v!r}", print_exception=False)
        return whatif_html(WhatIf(*values[:-1], gamma=int(values[-1])))

    def from_preset(name: str):
        return PRESETS[name].values() + [""]

    def from_run(session: Session):
        mirror, ar = session.runs.get("mirror"), session.runs.get("ar")
        model = latency_model(mirror, ar)
        if model is None or not model.t_ar:
            raise gr.Error(str(MirrorError("run AR and Mirror-SD on the Run tab first: the knobs start from their "
                                           "measured spans")), print_exception=False)
        w = WhatIf.from_model(model, mirror.start.settings.request.spec.gamma)
        return w.values() + ["Started from your last run's measured spans (the Run tab's latency table)."]

    for knob in knobs:
        knob.change(redraw, knobs, result, api_name=False, queue=False)
    preset.change(from_preset, preset, knobs + [note], api_name=False, queue=False)
    mine.click(from_run, state, knobs + [note], api_name="whatif_from_run", queue=False)
    gr.Button("Redraw", visible=False).click(redraw, knobs, result, api_name="whatif")  # the API/tests' entry point
