"""The Learn tab: the step player and tree, experiments, what-if on other hardware (modelled, ui/whatif.py) with the
speedup curve (ui/learn/curve.py) beside the target against its roofline (ui/learn/roofline.py), and a glossary of every term the
page uses.

It works before any run: the player and the tree show the recorded example (ui/learn/example.py) until the visitor's own
Mirror-SD run, the what-if starts from this machine's figures (ui/learn/starts.py: the last run, else the loaded pair's
load-time timings) and says where every figure comes from, and the roofline is the loaded pair's, timed at its load.
Its handlers touch no engine but the experiments' runs; a step or an experiment that cannot be shown says why in
place (no error badges).
"""
from __future__ import annotations

import html
import threading
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from mirror_core import MirrorError, SpecConfig
from mirror_core.latency import ar_step_time

from .curve import curve_html
from .example import Example, load_example, shown_runs
from .experiments import EXPERIMENTS, NEW_TOKENS, plot_html, refusal, run_experiment, sweep_verdict
from .glossary import GLOSSARY
from .player import player_html
from .retime import accelerator_shaped
from .roofline import roofline_view
from ..session import Session
from .starts import STARTS, THIS_MACHINE, start
from .tree import first_steps, tree_html
from ..whatif import ACCELERATOR_KEPT, ACCELERATOR_MODELLED, KNOBS, WhatIf, whatif_html

# (knob, label, lowest, highest, step, one-line help)
SLIDERS = (
    ("t_ar_ms", "AR's step T_AR (ms)", 0.05, 5000.0, 0.05,
     "One target-only decode step (one token), on the cores AR runs on: every speedup's baseline."),
    ("verify_ratio", "Window γ+1 ÷ T_AR (AR steps)", 0.1, 8.0, 0.01,
     "The target's forward over the γ+1 window (T_pre + Δ; the readout is T_rv below) in AR steps: ≈ 1 on "
     "accelerators, larger on CPUs."),
    ("suffix_share", "Share after the early exit (Δ)", 0.05, 0.95, 0.01,
     "The part of the verification pass after layer ℓ_e: the time the draft's branches can hide in."),
    ("draft_ms", "Draft time per token (ms)", 0.01, 500.0, 0.01, "One draft forward; a fresh rollout is γ of them."),
    ("branch_factor", "Branch batch / fresh rollout", 0.1, 20.0, 0.01,
     "The batched rollout of all branches against one fresh γ-token rollout (rows are cheap on accelerators)."),
    ("overhead_ms", "Readout + messages (ms)", 0.0, 50.0, 0.01, "T_rv: the early-exit readout, the messages, acceptance."),
    ("tau", "τ (tokens per step)", 1.0, 17.0, 0.01, "Tokens committed per verification step, bonus/correction included."),
    ("ff", "Fallback frequency", 0.0, 1.0, 0.01, "Share of steps where no precomputed branch matched (a fresh rollout)."),
    ("gamma", "γ (draft tokens per window)", 1, 16, 1, "Window length."),
)
assert tuple(s[0] for s in SLIDERS) == KNOBS
PHASES = 6  # ui/learn/player.py: window in, layers 1..ℓ_e, early exit sends M_t, suffix ∥ branches, acceptance, hit or miss
SPEEDS = {"0.5 s": 0.5, "1 s": 1.0, "2 s": 2.0, "4 s": 4.0}  # wall time per phase when playing
MEASURED, SHAPED = "as measured", "accelerator-shaped (modelled)"  # the player's timelines (ui/learn/retime.py)


@dataclass(frozen=True)
class StepPlayer:
    """The step player's components, for the Run tab's "slow this step down" link and its end of a comparison."""

    step: gr.Number
    phase: gr.Slider
    player: gr.HTML
    tree: gr.HTML
    followed: gr.State  # the run the player last moved to by itself (follow_key), so that it moves once per run
    timeline: gr.Radio
    views: Callable  # (session, step, phase) → (player HTML, tree HTML)

    def follow_after(self, event, state: gr.State) -> None:
        """After `event` (a comparison's end), the player on the session's newest Mirror-SD run."""
        event.then(follow, [state, self.followed, self.timeline],
                   [self.step, self.phase, self.player, self.tree, self.followed], api_visibility="private",
                   queue=False, show_progress="hidden")


def build(state: gr.State, loader, tab: gr.Tab) -> StepPlayer:
    player = _step(state)
    tab.select(follow, [state, player.followed, player.timeline],
               [player.step, player.phase, player.player, player.tree, player.followed], api_name=False, queue=False)
    _experiments(state, loader, tab)
    _whatif(state, loader, tab)
    return player


def source_line(example: Example | None) -> str:
    """Which run the player and the tree show: the visitor's last Mirror-SD run, or the recorded example (where)."""
    text = ("Showing your last Mirror-SD run (the Run tab)." if example is None else
            f"Showing {html.escape(example.where)}. Run Mirror-SD on the Run tab to play your own run here.")
    return f"<p class='mirror-def' id='mirror-learn-source'>{text}</p>"


def step_views(session: Session, s, k, timeline: str = MEASURED) -> tuple[str, str]:
    """(player HTML, tree HTML) of step s at phase k: the visitor's last Mirror-SD run, else the recorded example;
    its timeline as measured, or accelerator-shaped (ui/learn/retime.py: modelled)."""
    runs, example = shown_runs(session)
    run = runs.get("mirror")
    if timeline != SHAPED or run is None:
        return source_line(example) + player_html(run, s, int(k) - 1, runs.get("sd")), tree_html(run, s)
    shaped = accelerator_shaped(run, runs.get("ar"))
    if shaped is None:
        note = "<p class='mirror-def'><i>The accelerator-shaped timeline needs an AR run beside it (for T_AR).</i></p>"
        return source_line(example) + note + player_html(run, s, int(k) - 1, runs.get("sd")), tree_html(run, s)
    t_ar = 1e3 * ar_step_time(runs["ar"].spans)
    note = (f"<p class='mirror-def' id='mirror-player-shaped'><b>Accelerator-shaped, modelled</b>: this run's spans "
            f"laid out as the latency model lays a step, re-timed as the accelerator view models them: "
            f"{html.escape(ACCELERATOR_MODELLED)} (one AR step: {t_ar:.1f} ms); kept as measured: "
            f"{html.escape(ACCELERATOR_KEPT)}. Not a measurement.</p>")
    return source_line(example) + note + player_html(shaped, s, int(k) - 1, None, modelled=True), tree_html(run, s)


def follow_key(session: Session) -> float | None:
    """Which run the player shows on its own: the session's Mirror-SD run (its start time), None for the example."""
    run = shown_runs(session)[0].get("mirror")
    return run.start.t0 if run is not None and run.start is not None and session.runs.get("mirror") is run else None


def follow(session: Session, followed, shape=MEASURED):
    """(step, phase, player, tree, followed): a run the player has not followed yet (a comparison ended, or the tab
    opened after one) shown at its first hit, phase 1, without a Show press; nothing changes for the same run, so a
    step picked since stays."""
    key = follow_key(session)
    if key == followed:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), followed
    run = shown_runs(session)[0].get("mirror")
    s = first_steps(run)[0] or (run.steps[0].step if run is not None and run.steps else None)
    return (s, 1) + step_views(session, s, 1, shape) + (key,)


def _first_step() -> int | None:
    """The step the player opens on before any run: the recorded example's first hit (None without the example)."""
    runs, _ = shown_runs(Session())
    return first_steps(runs.get("mirror"))[0]


def _one_phase_on(session: Session, s, k, shape=MEASURED):
    """Next: the player one phase on (Play's timer is left as it is)."""
    k = min(int(k) + 1, PHASES)
    return (k,) + step_views(session, s, k, shape)


def _tick(session: Session, s, k, shape=MEASURED):
    """Play's timer: one phase on, and the timer stops at the last phase."""
    return _one_phase_on(session, s, k, shape) + (gr.Timer(active=min(int(k) + 1, PHASES) < PHASES),)


def _step(state: gr.State) -> StepPlayer:
    gr.Markdown("## One step, slowed down\nPick a step of your last Mirror-SD run (the Run tab; before your first run, "
                "a recorded example, labelled with where it was recorded; **First hit** and **First miss** find one "
                "of each) and play it phase by phase on its measured time axis: the window enters the target, the "
                "early exit sends its candidates, the draft lane rolls out a branch per candidate while the target "
                "finishes its layers, acceptance decides, and a hit reuses a branch. Below, the same step's branch "
                "tree: each slot's candidates as roots with the branch rolled out for each; the highlighted root is "
                "the correction on a hit, and its branch (cyan) became the next window. **Timeline**: as measured, or "
                "accelerator-shaped (*modelled*: the window scaled to one AR step, as where a window costs one read "
                "of the weights, the readout with it, the draft's branch batch on its own device; the line above the "
                "player lists what is kept as measured).")
    with gr.Row():
        # no minimum: an empty or out-of-range step gets a line in the player (session.pick_step), not an error badge
        step = gr.Number(value=_first_step(), label="Step", precision=0, elem_id="mirror-tree-step", min_width=120)
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
        timeline = gr.Radio([MEASURED, SHAPED], value=MEASURED, label="Timeline", elem_id="mirror-player-timeline",
                            min_width=200)
    timer = gr.Timer(SPEEDS["1 s"], active=False)
    first_player, first_tree = step_views(Session(), _first_step(), 1)  # the recorded example (read once)
    player = gr.HTML(first_player, elem_id="mirror-player")
    tree = gr.HTML(first_tree, elem_id="mirror-tree")

    def pick(which: int):
        def handler(session: Session, shape=MEASURED):
            runs, _ = shown_runs(session)
            found = first_steps(runs.get("mirror"))[which]
            if found is None:  # a hint where the player is, not an error badge
                kind = "hit" if which == 0 else "miss"
                return (gr.skip(), gr.skip(), f"<p class='mirror-def' id='mirror-learn-source'><i>This run has no "
                        f"{kind}: pick a step by number and press Show.</i></p>", gr.skip())
            return (found, 1) + step_views(session, found, 1, shape)
        return handler

    at = [state, step, phase, timeline]
    hit.click(pick(0), [state, timeline], [step, phase, player, tree], api_name="tree_first_hit", queue=False)
    miss.click(pick(1), [state, timeline], [step, phase, player, tree], api_name="tree_first_miss", queue=False)
    show.click(step_views, at, [player, tree], api_name="tree", queue=False)
    phase.release(step_views, at, [player, tree], api_name=False, queue=False)
    timeline.change(step_views, at, [player, tree], api_name=False, queue=False)
    followed = gr.State(None)  # the recorded example: follow_key's None
    back.click(lambda session, s, k, shape: (max(int(k) - 1, 1),) + step_views(session, s, max(int(k) - 1, 1), shape),
               at, [phase, player, tree], api_name=False, queue=False)
    forward.click(_one_phase_on, at, [phase, player, tree], api_name="player_next", queue=False)
    play.click(lambda k, v: (1 if int(k) >= PHASES else k, gr.Timer(SPEEDS[v], active=True)), [phase, speed],
               [phase, timer], api_name=False, queue=False)
    pause.click(lambda: gr.Timer(active=False), None, timer, api_name=False, queue=False)
    speed.change(lambda v: gr.Timer(SPEEDS[v]), speed, timer, api_name=False, queue=False)
    timer.tick(_tick, at, [phase, player, tree, timer], api_name=False, queue=False)
    return StepPlayer(step, phase, player, tree, followed, timeline, step_views)


@dataclass(frozen=True)
class Sweep:
    """What an experiment sweeps over: the pair, the prompt and the settings, and where they come from."""

    target: str
    draft: str
    prompt_ids: tuple[int, ...] | None  # None: the recorded example's prompt, encoded when the pair is at hand
    spec: SpecConfig | None             # None: the pair's own choice (resolved when it is at hand)
    chosen: bool                        # γ, κ were the latency model's choice for this machine at load
    draft_features: int | None          # ℓ_e a feature-reading draft reads (the ℓ_e sweep cannot move it)


def _sweep_of(session: Session, loader) -> Sweep | str:
    """The last run's pair, prompt and settings, else the loaded pair on the recorded example's prompt; or why none."""
    last = next((r for r in (session.runs.get(d) for d in ("mirror", "sd", "ar")) if r and r.start), None)
    if last is not None and last.start.settings.draft is not None:
        st = last.start.settings
        return Sweep(st.target, st.draft, last.start.prompt_ids, st.request.spec, bool(st.spec_note),
                     st.draft_features)
    info, example = loader.info(), load_example()
    if info is not None and info.draft is not None and example is not None:
        return Sweep(info.target, info.draft, None, None, info.spec_choice is not None, info.draft_features)
    return ("The experiments sweep the pair and prompt of your last run with a draft: run one on the Run tab "
            "(no pair with a draft is loaded yet to sweep on the recorded example's prompt).")


def _experiments(state: gr.State, loader, tab: gr.Tab) -> None:
    gr.Markdown("## Experiments\nSmall sweeps on the pair and prompt of your last run on the Run tab (before any run: "
                "the loaded pair on the recorded example's prompt), each a few dozen real runs of "
                f"{NEW_TOKENS} tokens: measured points, and dashed the latency model's prediction from the same runs "
                "(modelled). Each asks a question the plot answers. Results are kept for this session; Stop ends a "
                "sweep within one run.")
    first = next(iter(EXPERIMENTS))
    with gr.Row():
        pick = gr.Radio([(e.title, k) for k, e in EXPERIMENTS.items()], value=first, label="Experiment",
                        elem_id="mirror-experiment-pick")
        start_button = gr.Button("Run experiment", variant="primary", elem_id="mirror-experiment-run")
        stop = gr.Button("Stop", elem_id="mirror-experiment-stop")
    plot = gr.HTML(plot_html(EXPERIMENTS[first], []), elem_id="mirror-experiment")

    def offer(session: Session, key):
        """The experiment's empty plot and whether it can run on the pair at hand (disabled, with the reason)."""
        exp = EXPERIMENTS.get(key) if isinstance(key, str) else None
        if exp is None:
            return plot_html(EXPERIMENTS[first], []), gr.Button(interactive=True)
        sweep = _sweep_of(session, loader)
        why = sweep if isinstance(sweep, str) else refusal(exp, sweep.draft_features)
        return plot_html(exp, [], why or ""), gr.Button(interactive=not why)

    start_button.click(_experiment_runner(loader), [state, pick], plot, api_name="experiment", concurrency_id="lanes",
                       concurrency_limit=1, show_progress="hidden")
    stop.click(lambda session: session.experiment_stop.set(), state, None, api_name=False, queue=False)
    pick.change(offer, [state, pick], [plot, start_button], api_name="experiment_offer", queue=False)
    tab.select(offer, [state, pick], [plot, start_button], api_name=False, queue=False)


def _experiment_runner(loader) -> Callable:
    def on_run(session: Session, key):
        exp = EXPERIMENTS.get(key) if isinstance(key, str) else None
        if exp is None:
            raise gr.Error(f"unknown experiment {key!r}", print_exception=False)
        sweep = _sweep_of(session, loader)
        why = sweep if isinstance(sweep, str) else refusal(exp, sweep.draft_features)
        if why:  # said in place of the plot, as the disabled button already does
            yield plot_html(exp, [], why)
            return
        try:
            engine = loader.get(sweep.target, sweep.draft)
        except MirrorError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        example = load_example()
        try:
            ids = sweep.prompt_ids or engine.encode(example.prompt)
        except MirrorError as exc:
            yield plot_html(exp, [], f"The loaded pair cannot read the recorded example's prompt ({exc}): run it once "
                                     "on the Run tab, and the experiments sweep your run's prompt.")
            return
        spec = sweep.spec or engine.info.resolve(SpecConfig())
        cache_key = (key, sweep.target, sweep.draft, ids, spec)
        if cache_key in session.experiments:
            points = session.experiments[cache_key]
            yield plot_html(exp, points, "Kept from earlier in this session. " + sweep_verdict(exp, points, spec,
                                                                                               sweep.chosen))
            return
        session.experiment_stop = stop_flag = threading.Event()
        points, total = [], 0
        try:
            with loader.holding(stop_flag):  # a server shutting down stops the sweep within one run
                for done, total, points in run_experiment(engine, exp, ids, spec, stop_flag, encode=engine.encode):
                    if stop_flag.is_set():
                        yield plot_html(exp, points, f"Stopped after {done} of {total} runs.")
                        return
                    yield plot_html(exp, points, f"Running: {done} of {total} runs…")
        except MirrorError as exc:
            yield plot_html(exp, points, str(exc))
            return
        session.experiments[cache_key] = points
        prompt = "your last run's prompt" if sweep.prompt_ids else f"the recorded example's prompt “{example.prompt}”"
        yield plot_html(exp, points, f"Done: {total} runs of {NEW_TOKENS} new tokens on the pair of "
                                     f"{'your last run' if sweep.prompt_ids else 'this server'} and {prompt}, "
                                     f"γ {spec.gamma}, κ {spec.kappa} unless swept. "
                        + sweep_verdict(exp, points, spec, sweep.chosen))
    return on_run


def _roofline(state: gr.State, loader, tab: gr.Tab) -> None:
    gr.Markdown("### Why is verifying a window nearly free? The roofline\nThe target's forward time against its "
                "number of new rows (1 = an AR step, γ+1 = a verification window), measured when the pair loaded "
                "(your last run's pair, else the one loaded now), beside the two limits no forward beats: reading "
                "every weight once (weights ÷ bandwidth, flat) and doing the arithmetic (the compute limit, rising). "
                "Their larger is the model (dashed, *modelled*). The chart's window cost is in the lane's one-row "
                "forwards; the what-if's *Window γ+1 ÷ T_AR* knob is the same forward in AR steps (÷ the baseline's "
                "step). It redraws when you open this tab.")
    show = gr.Button("Show the roofline", elem_id="mirror-roofline-show", size="sm")
    plot = gr.Plot(visible=False, show_label=False, elem_id="mirror-roofline-plot")
    note = gr.HTML(roofline_view(Session())[1], elem_id="mirror-roofline")

    def redraw(session: Session):
        figure, text = roofline_view(session, loader.info())
        return gr.Plot(figure, visible=figure is not None), text

    show.click(redraw, state, [plot, note], api_name="roofline", queue=False)
    tab.select(redraw, state, [plot, note], api_name=False, queue=False)


def _whatif(state: gr.State, loader, tab: gr.Tab) -> None:
    gr.Markdown("## What if the hardware were different? *(modelled)*\n"
                "The latency model of the Run tab's numbers, with its terms as knobs. It starts from this machine "
                "(your last run, else the loaded pair's load-time timings), from the recorded example, or from the "
                "paper's illustrative accelerator; the line under the buttons says where every figure comes from. "
                "Move a knob and watch the three decoders' modelled speed. Nothing here is timed: every figure below "
                "is **modelled**.")
    first = start(THIS_MACHINE, Session(), None)  # before the tab opens: the recorded example, labelled as such
    with gr.Row():
        preset = gr.Radio(list(STARTS), value=THIS_MACHINE, label="Start from", elem_id="mirror-whatif-preset")
        mine = gr.Button("Start from my last run", elem_id="mirror-whatif-mine")
    note = gr.Markdown(first.note, elem_id="mirror-whatif-note")
    seen = gr.State(first.key)  # the figures the knobs last started from: opening the tab again keeps your knobs
    knobs = []
    with gr.Row():
        for name, label, lo, hi, step, info in SLIDERS:
            knobs.append(gr.Slider(lo, hi, value=getattr(first.knobs, name), step=step, label=label, info=info,
                                   elem_id=f"mirror-whatif-{name}", min_width=220))
    result = gr.HTML(whatif_html(first.knobs), elem_id="mirror-whatif")
    with gr.Row():
        with gr.Column(min_width=320):
            gr.Markdown("### The speedup curve *(modelled)*\nSpeedup over AR against τ and against what verifying "
                        "γ+1 tokens costs in AR steps, at the knobs above; ● is where the knobs put you.")
            accelerator = gr.Checkbox(False, label="verify ≈ 1 step (an accelerator)", elem_id="mirror-curve-switch")
            curve = gr.HTML(curve_html(first.knobs), elem_id="mirror-curve")
        with gr.Column(min_width=320):
            _roofline(state, loader, tab)
    with gr.Accordion("Glossary: every term on this page, in one line", open=False):
        gr.HTML("<table class='mirror-table' id='mirror-glossary'>" + "".join(
            f"<tr><th>{term}</th><td>{text}</td></tr>" for term, text in GLOSSARY) + "</table>")
    _wire_whatif(state, loader, tab, WhatIfParts(preset, mine, note, seen, knobs, result, accelerator, curve))


@dataclass(frozen=True)
class WhatIfParts:
    preset: gr.Radio
    mine: gr.Button
    note: gr.Markdown
    seen: gr.State
    knobs: list
    result: gr.HTML
    accelerator: gr.Checkbox
    curve: gr.HTML


def _knobs(values) -> WhatIf:
    """The knobs' values as a WhatIf, each checked against its slider's range (the endpoints take any client's)."""
    for (_, label, lo, hi, _, _), v in zip(SLIDERS, values):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
            raise gr.Error(f"{label} must be a number in {lo}..{hi}, got {v!r}", print_exception=False)
    return WhatIf(*values[:-1], gamma=int(values[-1]))


def _in_range(knobs: WhatIf) -> tuple[list, str]:
    """A start's figures as slider values: a measured figure outside its slider's range (a window timed cheaper than
    a step under noise, a slow model's step) is shown at the range's end, and the note says which and by how much."""
    values, outside = [], []
    for (_, label, lo, hi, _, _), v in zip(SLIDERS, knobs.values()):
        shown = min(max(v, lo), hi)
        values.append(shown)
        if shown != v:
            outside.append(f"{label} measured {v:g}, shown as {shown:g}")
    note = f" Outside the sliders' range, so the what-if uses the range's end: {'; '.join(outside)}." if outside else ""
    return values, note


def _wire_whatif(state: gr.State, loader, tab: gr.Tab, p: WhatIfParts) -> None:
    def redraw(*values):
        return whatif_html(_knobs(values))

    def redraw_curve(*values):
        return curve_html(_knobs(values[:-1]), bool(values[-1]))

    def shown(st) -> list:
        """A start as the outputs: the knobs (in their sliders' ranges), the note, the start's key."""
        values, outside = _in_range(st.knobs)
        return values + [st.note + outside, st.key]

    def from_start(session: Session, which):
        return shown(start(which if which in STARTS else THIS_MACHINE, session, loader.info()))

    def reopen(session: Session, which, key):
        """Opening the tab: this machine's newest figures, unless the knobs already started from them."""
        if which != THIS_MACHINE:
            return [gr.skip()] * (len(p.knobs) + 2)
        st = start(THIS_MACHINE, session, loader.info())
        return [gr.skip()] * (len(p.knobs) + 2) if st.key == key else shown(st)

    outputs = p.knobs + [p.note, p.seen]
    for knob in p.knobs:
        knob.change(redraw, p.knobs, p.result, api_name=False, queue=False)
        knob.change(redraw_curve, p.knobs + [p.accelerator], p.curve, api_name=False, queue=False)
    p.accelerator.change(redraw_curve, p.knobs + [p.accelerator], p.curve, api_name=False, queue=False)
    p.preset.change(from_start, [state, p.preset], outputs, api_name="whatif_start", queue=False)
    p.mine.click(lambda session: from_start(session, THIS_MACHINE), state, outputs, api_name="whatif_from_run",
                 queue=False)
    tab.select(reopen, [state, p.preset, p.seen], outputs, api_name=False, queue=False)
    gr.Button("Redraw", visible=False).click(redraw, p.knobs, p.result, api_name="whatif")  # the API/tests' entry
    gr.Button("Curve", visible=False).click(redraw_curve, p.knobs + [p.accelerator], p.curve,
                                            api_name="speedup_curve")
