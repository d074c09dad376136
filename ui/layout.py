"""build_demo(loader, presets, examples) → gr.Blocks: components, per-user gr.State and wiring only."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
from gradio.components.plot import PlotData

from mirror_core import MirrorError
from mirror_core.config import MAX_PROMPT_CHARS

from . import inspector, numbers, plots, render
from .loader import EngineLoader, PairPreset
from .session import Session
from .settings import APP_MAX_NEW_TOKENS, DECODER_TITLES, DEFAULTS, INFO, RULE_CHOICES, settings_from_ui
from .streaming import DONE, PLOTS, RESET, STATUS, Tick, final_status, replay, run_comparison

COLUMNS = ("ar", "mirror", "sd")  # left to right on the page
QUEUE_MAX_SIZE = 32                # waiting requests beyond this are turned away ("queue is full")
CUSTOM = "Custom (type below)"
HONESTY = ("Decoders run **one after another**, each with both lanes to itself, so the columns fill in turn. "
           "Every time shown comes from the engine's spans and commit stamps (never from the page). "
           "*Replay side by side* re-animates the finished runs together at their measured commit times. "
           "Speedups below 1× are shown as measured.")
CSS = """
.mirror-table {border-collapse: collapse; font-size: 0.9em; margin: 0.4em 0;}
.mirror-table th, .mirror-table td {border: 1px solid #e5e7eb; padding: 3px 8px; text-align: left; vertical-align: top;}
.mirror-def {color: #6b7280; font-size: 0.9em;}
.mirror-chip {display: inline-block; border-radius: 4px; padding: 0 4px; margin: 1px; background: #f1f5f9;}
.mirror-chip-hit {background: #bbf7d0; outline: 1px solid #16a34a;}
.mirror-reused td {background: #cffafe;}
.mirror-fast {color: #15803d; font-weight: 600;}
.mirror-slow {color: #b91c1c; font-weight: 600;}
.mirror-rejected {color: #b91c1c; opacity: 0.75;}
.mirror-tokens {white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 1.6; max-height: 18em; overflow-y: auto;}
.mirror-rejected-count, .mirror-notes {color: #6b7280; font-size: 0.85em;}
.mirror-legend .mirror-chip, .mirror-legend del {margin-right: 6px;}
"""


@dataclass
class Controls:
    prompt: gr.Textbox
    target: gr.Textbox
    draft: gr.Textbox
    decoders: gr.CheckboxGroup
    preset: gr.Dropdown
    run: gr.Button
    stop: gr.Button
    replay: gr.Button
    knobs: dict  # name → component, for settings_from_ui

    def inputs(self) -> list:
        """In settings_from_ui's argument order."""
        k = self.knobs
        return [self.prompt, self.target, self.draft, self.decoders, k["gamma"], k["kappa"], k["exit_layer"],
                k["temperature"], k["top_k"], k["top_p"], k["rule"], k["max_new_tokens"], k["seed"], k["branch_budget"]]


@dataclass
class Views:
    status: gr.Markdown
    tokens: list          # per column: HighlightedText, rejected-drafts HTML, copyable Textbox
    columns: dict         # decoder → gr.Column
    figures: list         # race, tokens per step, lane timeline, acceptance
    numbers: gr.HTML
    latency: gr.HTML
    inspect_run: gr.Radio
    inspect_step: gr.Slider
    inspector: gr.HTML
    trace: gr.File

    def outputs(self, state: gr.State) -> list:
        return [self.status, *self.tokens, *self.figures, self.numbers, self.latency, self.inspect_run,
                self.inspect_step, self.inspector, self.trace, state]


def build_demo(loader: EngineLoader, presets: list[PairPreset], examples: list[str] | None = None) -> gr.Blocks:
    """The playground page; loads nothing until the first Run (the loader does that, once per pair)."""
    with gr.Blocks(title="Mirror-SD Playground", delete_cache=(3600, 3600)) as demo:  # hourly: old trace copies
        state = gr.State(Session(), delete_callback=Session.close)  # tab closed: stop its run, drop its trace
        gr.Markdown("# Mirror-SD Playground\nMirror speculative decoding (arXiv 2510.13161): the draft rolls out "
                    "branches for the target's early-exit candidates *while* the target finishes its layers.")
        gr.Markdown(_banner(presets, loader))
        controls = _controls(presets, examples or [])
        views = _views()
        _wire(demo, loader, presets, state, controls, views)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=1)  # one run on the lanes at a time
    return demo


def _banner(presets: list[PairPreset], loader: EngineLoader) -> str:
    lanes = loader.lanes
    cores = (f" (target cores {list(lanes.target_cpus)}, draft cores {list(lanes.draft_cpus)})"
             if lanes.target_cpus else "")
    text = (f"Lanes: target on `{lanes.target_device}`, draft on `{lanes.draft_device}` as a "
            f"**{lanes.kind}** lane{cores}.")
    policy = loader.policy
    if policy.trust_remote_code:
        text = ("⚠️ **trust_remote_code is ON** (`--trust-remote-code`): model folders and hub repos may run their "
                "own Python code on this server when loaded. Load only models you trust.\n\n" + text)
    if policy.in_space or policy.allowlist is not None:
        allowed = ", ".join(f"`{m}`" for m in sorted(policy.allowlist or ())) or "none"
        text += (f"\n\nModels you can type in: the pairs in the selector and {allowed}"
                 + (" (local paths are refused on a Space)." if policy.in_space else "."))
    if not any(p.available for p in presets):
        text = ("⚠️ **No model pair available yet**: the embedded pair is not in `assets/default_pair/`. "
                "Start with `python app.py --target T --draft D`, or type Hugging Face ids / local folders into "
                "*Target* and *Draft* below.\n\n" + text)
    return text


def _controls(presets: list[PairPreset], examples: list[str]) -> Controls:
    first = next((p for p in presets if p.available), presets[0] if presets else None)
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=4, info=INFO["prompt"], value=examples[0] if examples else "",
                                max_length=MAX_PROMPT_CHARS, elem_id="mirror-prompt")
            if examples:
                gr.Examples(examples=[[e] for e in examples], inputs=[prompt], label="Example prompts")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="mirror-run")
                stop = gr.Button("Stop", variant="stop", elem_id="mirror-stop")
                replay_btn = gr.Button("Replay side by side", elem_id="mirror-replay")
        with gr.Column(scale=2):
            preset = gr.Dropdown([p.label for p in presets] + [CUSTOM], label="Model pair", info=INFO["preset"],
                                 value=first.label if first else CUSTOM)
            target = gr.Textbox(label="Target", info=INFO["target"], value=first.target if first else "")
            draft = gr.Textbox(label="Draft", info=INFO["draft"], value=(first.draft or "") if first else "")
            decoders = gr.CheckboxGroup([(DECODER_TITLES[d], d) for d in COLUMNS], value=DEFAULTS["decoders"],
                                        label="Decoders to compare", info=INFO["decoders"])
    with gr.Accordion("Speculation and sampling", open=True):
        with gr.Row():
            knobs = {"gamma": gr.Slider(1, 16, DEFAULTS["gamma"], step=1, label="γ (window)", info=INFO["gamma"]),
                     "kappa": gr.Slider(1, 64, DEFAULTS["kappa"], step=1, label="κ (candidates per slot)",
                                        info=INFO["kappa"]),
                     "exit_layer": gr.Number(DEFAULTS["exit_layer"], precision=0, minimum=0,
                                             label="ℓ_e (early-exit layer)", info=INFO["exit_layer"]),
                     "branch_budget": gr.Number(DEFAULTS["branch_budget"], precision=0, minimum=-1,
                                                label="Branch budget", info=INFO["branch_budget"]),
                     "max_new_tokens": gr.Slider(1, APP_MAX_NEW_TOKENS, DEFAULTS["max_new_tokens"], step=1, label="Max new tokens",
                                                 info=INFO["max_new_tokens"])}
        with gr.Row():
            knobs |= {"temperature": gr.Slider(0.0, 2.0, DEFAULTS["temperature"], step=0.05, label="Temperature",
                                               info=INFO["temperature"]),
                      "top_k": gr.Number(DEFAULTS["top_k"], precision=0, minimum=0, label="Top-k", info=INFO["top_k"]),
                      "top_p": gr.Slider(0.01, 1.0, DEFAULTS["top_p"], step=0.01, label="Top-p", info=INFO["top_p"]),
                      "rule": gr.Radio(list(RULE_CHOICES), value=DEFAULTS["rule"], label="Rule", info=INFO["rule"]),
                      "seed": gr.Number(DEFAULTS["seed"], precision=0, minimum=0, label="Seed", info=INFO["seed"])}
    return Controls(prompt, target, draft, decoders, preset, run, stop, replay_btn, knobs)


def _views() -> Views:
    status = gr.Markdown("Pick a pair and press **Run**.", elem_id="mirror-status")
    gr.Markdown(HONESTY)
    gr.HTML(render.legend_html())
    tokens, columns = [], {}
    with gr.Row(equal_height=False):
        for d in COLUMNS:
            with gr.Column(visible=d in DEFAULTS["decoders"], elem_id=f"mirror-col-{d}") as columns[d]:
                gr.Markdown(f"### {DECODER_TITLES[d]}")
                tokens.append(gr.HighlightedText(label="Committed tokens, coloured by origin", elem_id=f"mirror-tokens-{d}",
                                                 color_map=render.COLOR_MAP, show_legend=False,
                                                 show_inline_category=False, combine_adjacent=False))
                with gr.Accordion("With rejected drafts (struck through)", open=d != "ar"):
                    tokens.append(gr.HTML(elem_id=f"mirror-rejected-{d}"))
                tokens.append(gr.Textbox(label="Committed text (copy)", lines=3, interactive=False, buttons=["copy"],
                                         elem_id=f"mirror-text-{d}"))
    with gr.Row():
        race = gr.Plot(label="Race", elem_id="mirror-race")
        steps = gr.Plot(label="Tokens per step", elem_id="mirror-steps")
    figures = [race, steps, gr.Plot(label="Lane timeline", elem_id="mirror-gantt"),
               gr.Plot(label="Acceptance", elem_id="mirror-accept")]
    with gr.Row():
        with gr.Column():
            gr.Markdown("### Numbers (measured by the engine)")
            numbers_view = gr.HTML(numbers.numbers_html({}), elem_id="mirror-numbers")
        with gr.Column():
            gr.Markdown("### Latency model (mirror_sd.md §4), modelled from the measured spans")
            latency_view = gr.HTML(numbers.latency_html(None, None), elem_id="mirror-latency")
    gr.Markdown("### Step inspector")
    with gr.Row():
        inspect_run = gr.Radio([(DECODER_TITLES["mirror"], "mirror"), (DECODER_TITLES["sd"], "sd")], value="mirror",
                               label="Run", info="Which speculative run to inspect.")
        inspect_step = gr.Slider(1, 2, 1, step=1, label="Step", info="Verification step t (1 = first after prefill).")
    inspector_view = gr.HTML(inspector.inspector_html(None, 1), elem_id="mirror-inspector")
    trace = gr.File(label="Run trace (JSON): every event of every decoder", interactive=False, elem_id="mirror-trace")
    return Views(status, tokens, columns, figures, numbers_view, latency_view, inspect_run, inspect_step,
                 inspector_view, trace)


def _wire(demo: gr.Blocks, loader: EngineLoader, presets: list[PairPreset], state: gr.State, c: Controls,
          v: Views) -> None:
    outputs = v.outputs(state)

    in_flight: dict[str, Session] = {}  # session hash → its Session while a run is going (this page's visitors)

    def on_run(request: gr.Request, session: Session, *values):
        try:
            settings = settings_from_ui(*values)
        except MirrorError as exc:
            session.status = f"**Error:** {exc}"
            yield _view(session, Tick(STATUS, session.status))
            return
        in_flight[request.session_hash] = session
        try:
            for tick in run_comparison(loader, session, settings):
                yield _view(session, tick)
        finally:
            in_flight.pop(request.session_hash, None)

    def on_unload(request: gr.Request):
        """The tab was closed or reloaded (Gradio's heartbeat dropped): stop its run within one step."""
        session = in_flight.pop(request.session_hash, None)
        if session is not None:
            session.stop.set()

    def on_stop(session: Session):
        running = not session.idle.is_set()
        session.stop.set()
        session.replay_stop.set()
        session.idle.wait(timeout=60)  # the run's generator ends within one step (or is closed by `cancels`)
        return _view(session, Tick(DONE, final_status(session) if running else "Nothing was running."))

    def on_replay(session: Session):
        for tick in replay(session):
            yield _view(session, tick)

    def on_inspect(session: Session, decoder: str, step):
        return inspector.inspector_html(session.runs.get(decoder), step)

    # Progress only on the status line: it shows the queue position ("queue: 2/3") while waiting,
    # and no spinner covers the live plots. No preprocessing: out-of-range or non-numeric values reach
    # settings_from_ui, which answers each with one readable line on the status (Gradio's own checks would not).
    run_evt = c.run.click(on_run, [state, *c.inputs()], outputs, api_name="run", concurrency_id="lanes",
                          concurrency_limit=1, show_progress="minimal", show_progress_on=[v.status],
                          preprocess=False)  # raw values: settings_from_ui checks every field with one message
    replay_evt = c.replay.click(on_replay, [state], outputs, api_name="replay", concurrency_limit=8,
                                show_progress="hidden")
    c.stop.click(on_stop, [state], outputs, api_name="stop", cancels=[run_evt, replay_evt], concurrency_limit=None,
                 show_progress="hidden")
    demo.unload(on_unload)
    gr.on([v.inspect_run.change, v.inspect_step.change], on_inspect, [state, v.inspect_run, v.inspect_step],
          v.inspector, api_name="inspect", show_progress="hidden")
    c.preset.change(lambda label: _pair_of(presets, label), [c.preset], [c.target, c.draft],
                    api_visibility="private", show_progress="hidden")
    c.decoders.change(lambda ds: [gr.Column(visible=d in (ds or ())) for d in COLUMNS], [c.decoders],
                      [v.columns[d] for d in COLUMNS], api_visibility="private", show_progress="hidden")


def _pair_of(presets: list[PairPreset], label: str):
    for p in presets:
        if p.label == label:
            return p.target, p.draft or ""
    return gr.skip(), gr.skip()


def as_plot(fig: dict) -> PlotData:
    """A plotly figure dict as gr.Plot's payload, skipping plotly's per-property validation."""
    return PlotData(type="plotly", plot=plots.to_json(fig))


def _view(session: Session, tick: Tick) -> list:
    """The outputs for one tick (Views.outputs order): what it refreshes, gr.skip() for the rest."""
    skip = gr.skip()
    tokens: list = []
    for d in COLUMNS:
        run = session.runs.get(d)
        upto = None if tick.replay_at is None or run is None else run.count_until(tick.replay_at)
        unchanged = tick.kind == STATUS or (tick.active is not None and tick.active != d)
        tokens += ([skip] * 3 if unchanged else
                   [render.highlighted(run, upto), render.rejected_html(run, upto), render.plain_text(run, upto)])
    runs = [session.runs[d] for d in ("ar", "sd", "mirror") if d in session.runs]
    figures = [skip] * 4
    if tick.kind in (PLOTS, DONE, RESET):
        figures = [as_plot(f) for f in (plots.race_figure(runs, numbers.speedups(session.runs)),
                                         plots.tokens_per_step_figure(runs), plots.lane_timeline_figure(runs),
                                         plots.acceptance_figure(runs))]
    rest = [skip] * 7
    if tick.kind in (DONE, RESET):
        model = numbers.latency_model(session.runs.get("mirror"), session.runs.get("ar"))
        measured = numbers.speedup(session.runs.get("ar"), session.runs.get("mirror"))[0]
        pick = "mirror" if "mirror" in session.runs else "sd"
        run = session.runs.get(pick)
        last = run.steps[-1].step if run is not None and run.steps else 1
        rest = [numbers.numbers_html(session.runs), numbers.latency_html(model, measured), gr.Radio(value=pick),
                gr.Slider(minimum=1, maximum=max(last, 2), value=1), inspector.inspector_html(run, 1),
                session.trace_path, session]
    return [tick.status, *tokens, *figures, *rest]
