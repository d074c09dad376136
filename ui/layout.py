"""build_demo(loader, presets, examples) → gr.Blocks: components, per-user gr.State and wiring only."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import html
import re

import gradio as gr

from mirror_core import MirrorError, machine
from mirror_core.config import MAX_PROMPT_CHARS

from . import inspector, learn, numbers, plots, render, tour
from .loader import EngineLoader, PairPreset
from .session import Session, plain_text, stream_html
from .settings import (
    CONTROLS,
    DECODER_ORDER,
    DECODER_TITLES,
    DEFAULTS,
    INFO,
    RULE_CHOICES,
    controls_by_name,
    settings_from_ui,
)
from .streaming import DONE, RESET, STATUS, TEXT, Tick, final_status, replay, run_comparison



COLUMNS = DECODER_ORDER  # left to right on the page: the order they run in
QUEUE_MAX_SIZE = 32                # waiting requests beyond this are turned away ("queue is full")
# Gradio's queue loops poll every 1 ms (jobs) and 10 ms (progress) on Linux (`Queue.sleep_when_free`,
# `progress_update_sleep_when_free`: private in Gradio 6), idle or while a run holds the lanes: ~6 % of a
# core taken beside the lanes (docs/BENCHMARKS.md). 50 ms delays only the start of a queued job and the
# queue-position line; tests/test_ui_app.py fails if a Gradio release drops the attributes.
QUEUE_POLL_S = 0.05
CUSTOM = "Custom (type below)"
HONESTY = ("Decoders run **one after another**, each with both lanes to itself, so the columns fill in turn. "
           "Every time shown comes from the engine's spans and commit stamps (never from the page). "
           "*Replay side by side* re-animates the finished runs together at their measured commit times. "
           "Speedups below 1× are shown as measured. The page receives only new tokens and new step records, and "
           "draws the plots itself. If this browser runs on the machine that runs the lanes, drawing still takes "
           "some CPU from them: untick *Live plots* (under *Speculation and sampling*) to measure first and draw at "
           "the end, and use *Repeats* to see the spread.")
CSS = render.asset("page.css")  # the page's styles (ui/page.css)

# demo.launch(**LAUNCH) everywhere the page is served. Gradio's run history is off: it keeps every run's inputs and
# outputs in the browser's localStorage (up to 100 runs) and, while a generator streams, re-serialises that whole
# history every 500 ms, so the page's CPU grew with every run (docs/BENCHMARKS.md, "The page's cost"); it would
# also keep each user's prompts and outputs in their browser.
LAUNCH = {"css": CSS + tour.CSS, "run_history": False}

# The outputs of /run, /replay and /stop by name, in the endpoints' order (what gradio_client returns; the
# per-user state follows them as one more output that clients never see). Tests read results with by_name().
TOKEN_VIEWS = ("tokens", "text")  # per column: the stream (HTML: prompt, coloured tokens, rejected drafts), copy box
OUTPUT_NAMES = ("status", *(f"{d}_{view}" for d in COLUMNS for view in TOKEN_VIEWS), "plots", "numbers", "latency",
                "inspect_run", "inspect_step", "inspector", "trace")
STATE = "session"  # the gr.State output's name in a tick's refresh
REPLAY_SPEEDS = {"1×": 1.0, "0.5×": 0.5, "0.25×": 0.25, "0.1×": 0.1, "0.05×": 0.05}  # of the measured time

# Each decoder's stream: the value is append-only HTML (session.stream_html). The template is only the box; the
# script appends what the value gained since the last update (O(new) per update: re-rendering the whole stream,
# as a template with ${value} does, cost the page tens of ms per update at 900 tokens), and the box follows the
# newest token unless the reader scrolled up.
TOKENS_TEMPLATE = '<div class="mirror-tokens"></div>'
TOKENS_JS = render.asset("tokens.js")  # the stream boxes' append-only script (ui/tokens.js)
# The four live plots: the value is the feed (ui/plots.py), drawn on canvases in the browser by ui/live_plots.js.
PLOTS_TEMPLATE = "".join(f'<div class="mirror-plot mirror-plot-{name}"></div>' for name in ("race", "steps", "gantt",
                                                                                          "accept"))
PLOTS_JS = "live_plots.js"  # beside this module, read when the page is built


def by_name(outputs: Sequence) -> dict[str, object]:
    """One /run, /replay or /stop result (a list in OUTPUT_NAMES order, as gradio_client or the queue's event stream
    returns it) by output name."""
    if len(outputs) < len(OUTPUT_NAMES):
        raise ValueError(f"expected {len(OUTPUT_NAMES)} outputs ({', '.join(OUTPUT_NAMES)}), got {len(outputs)}")
    return dict(zip(OUTPUT_NAMES, outputs))


@dataclass
class Controls:
    fields: dict  # control name (settings.CONTROLS) → its component
    preset: gr.Dropdown
    run: gr.Button
    stop: gr.Button
    replay: gr.Button
    status: gr.Markdown  # right under Run/Stop: results and errors show where the eye is
    replay_speed: gr.Dropdown  # REPLAY_SPEEDS: slow motion for the replay

    def inputs(self) -> list:
        """The /run endpoint's parameters, in CONTROLS order."""
        return [self.fields[name] for name in CONTROLS]


@dataclass
class Views:
    outputs: dict  # output name (OUTPUT_NAMES) → its component
    columns: dict  # decoder → gr.Column
    seek: dict     # "hit" / "miss" → the inspector's Next hit / Next miss button
    learn: gr.Button  # the inspector's "Slow it down": the inspected step in the Learn tab's step player


def build_demo(loader: EngineLoader, presets: list[PairPreset], examples: list[str] | None = None,
               plan: tuple[str, ...] = ()) -> gr.Blocks:
    """The playground page; loads nothing until the first Run (the loader does that, once per pair). `plan`: why
    the lanes are where they are (lanes.placement.plan_lanes), shown in the header."""
    with gr.Blocks(title="Mirror-SD Playground", delete_cache=(3600, 3600)) as demo:  # hourly: old trace copies
        state = gr.State(Session(), delete_callback=Session.close)  # tab closed: stop its run, drop its trace
        gr.Markdown("# Mirror-SD Playground\nMirror speculative decoding (arXiv 2510.13161): the draft rolls out "
                    "branches for the target's early-exit candidates *while* the target finishes its layers. "
                    "New to it? The **Learn** tab.\n\n" + _banner(presets, loader, plan))
        gr.HTML(tour.stops_json(), elem_id="mirror-tour", html_template=tour.TEMPLATE, js_on_load=tour.JS)
        with gr.Tabs() as tabs:
            with gr.Tab("Run", id="run"):
                controls = _controls(presets, examples or [])
                views = _views(controls.status)
            with gr.Tab("Learn", id="learn"):
                player = learn.build(state, loader)
        _wire(demo, loader, presets, state, controls, views)
        _wire_learn_link(state, views, tabs, player)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=1)  # one run on the lanes at a time
    demo._queue.sleep_when_free = demo._queue.progress_update_sleep_when_free = QUEUE_POLL_S
    return demo


def _banner(presets: list[PairPreset], loader: EngineLoader, plan: tuple[str, ...] = ()) -> str:
    lanes = loader.lanes
    cores = (f" (target cores {list(lanes.target_cpus)}, draft cores {list(lanes.draft_cpus)})"
             if lanes.target_cpus else "")
    # One folded line (the first screen keeps the prompt, Run, the status and the streams): the pair and the lanes,
    # unfolding to what the pair is and why the lanes are where they are on this machine.
    about = next((p for p in presets if p.available and p.about), None)
    summary = (f"{'Pair: ' + html.escape(about.label) + ' · ' if about else ''}Lanes: target on <code>"
               f"{html.escape(lanes.target_device)}</code>, draft on <code>{html.escape(lanes.draft_device)}</code> "
               f"as a <b>{lanes.kind}</b> lane{cores}")
    body = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(about.about, quote=False)) + "<br>" if about else ""
    if plan:
        body += f"Why the lanes are here: {html.escape(machine.describe(lanes.target_device))}: {html.escape('; '.join(plan))}."
    text = f"<details><summary>{summary}</summary>{body}</details>" if body else summary + "."
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
                replay_speed = gr.Dropdown(list(REPLAY_SPEEDS), value="1×", label="Replay speed (slow motion)",
                                           min_width=110, elem_id="mirror-replay-speed")
            status = gr.Markdown("Pick a pair and press **Run**.", elem_id="mirror-status")
        with gr.Column(scale=2):
            preset = gr.Dropdown([p.label for p in presets] + [CUSTOM], label="Model pair", info=INFO["preset"],
                                 value=first.label if first else CUSTOM)
            fields = {"prompt": prompt,
                      "target": gr.Textbox(label="Target", info=INFO["target"], value=first.target if first else ""),
                      "draft": gr.Textbox(label="Draft", info=INFO["draft"],
                                          value=(first.draft or "") if first else ""),
                      "decoders": gr.CheckboxGroup([(DECODER_TITLES[d], d) for d in COLUMNS],
                                                   value=DEFAULTS["decoders"], label="Decoders to compare",
                                                   info=INFO["decoders"])}
    with gr.Accordion("Speculation and sampling", open=False, elem_id="mirror-knobs"):  # the defaults suit a first run
        with gr.Row():
            fields |= {"gamma": _number("gamma", "γ (window)"),
                       "kappa": _number("kappa", "κ (candidates per slot)"),
                       "exit_layer": _number("exit_layer", "ℓ_e (early-exit layer)"),
                       "branch_budget": _number("branch_budget", "Branch budget"),
                       "max_new_tokens": _number("max_new_tokens", "Max new tokens"),
                       "repeats": _number("repeats", "Repeats")}
        with gr.Row():
            fields |= {"temperature": _number("temperature", "Temperature", step=0.05),
                       "top_k": _number("top_k", "Top-k"),
                       "top_p": _number("top_p", "Top-p", step=0.01),
                       "rule": gr.Radio(list(RULE_CHOICES), value=DEFAULTS["rule"], label="Rule", info=INFO["rule"]),
                       "seed": _number("seed", "Seed"),
                       "live_plots": gr.Checkbox(DEFAULTS["live_plots"], label="Live plots", info=INFO["live_plots"],
                                                 elem_id="mirror-live-plots"),
                       "raw_prompt": gr.Checkbox(DEFAULTS["raw_prompt"], label="Raw prompt", info=INFO["raw_prompt"],
                                                 elem_id="mirror-raw-prompt")}
    return Controls(fields, preset, run, stop, replay_btn, status, replay_speed)


def _number(name: str, label: str, step: float = 1) -> gr.Number:
    """A number box (never a slider: a slider clamps a typed value silently); settings_from_ui checks every bound
    and answers an out-of-range value with one line naming the range."""
    return gr.Number(DEFAULTS[name], precision=0 if step == 1 else None, step=step, label=label, info=INFO[name],
                     elem_id=f"mirror-{name.replace('_', '-')}")


def _views(status: gr.Markdown) -> Views:
    out = {"status": status}
    gr.HTML(render.legend_html())
    columns = {}
    with gr.Row(equal_height=False):
        for d in COLUMNS:
            with gr.Column(visible=d in DEFAULTS["decoders"], elem_id=f"mirror-col-{d}") as columns[d]:
                out[f"{d}_tokens"] = gr.HTML("", label=DECODER_TITLES[d], show_label=True, container=True,
                                             elem_id=f"mirror-tokens-{d}", html_template=TOKENS_TEMPLATE,
                                             js_on_load=TOKENS_JS)
                with gr.Accordion("Committed text (copy)", open=False):
                    out[f"{d}_text"] = gr.Textbox(label="Committed text", lines=3, interactive=False,
                                                  buttons=["copy"], elem_id=f"mirror-text-{d}")
    gr.Markdown(HONESTY)  # below the streams: the first screen shows the prompt, Run, the status and the streams
    out["plots"] = gr.HTML("", elem_id="mirror-plots", html_template=PLOTS_TEMPLATE,
                           js_on_load=render.asset(PLOTS_JS),
                           config=plots.config_json())
    with gr.Row():
        with gr.Column():
            gr.Markdown("### Numbers (measured by the engine)")
            out["numbers"] = gr.HTML(numbers.numbers_html({}), elem_id="mirror-numbers")
        with gr.Column():
            gr.Markdown("### Latency model (docs/ALGORITHM.md §4), modelled from the measured spans")
            out["latency"] = gr.HTML(numbers.latency_html(None, None), elem_id="mirror-latency")
    gr.Markdown("### Step inspector")
    with gr.Row():
        out["inspect_run"] = gr.Radio([(DECODER_TITLES["mirror"], "mirror"), (DECODER_TITLES["sd"], "sd")],
                                      value="mirror", label="Run", info="Which speculative run to inspect.",
                                      elem_id="mirror-inspect-run")
        out["inspect_step"] = gr.Slider(1, 2, 1, step=1, label="Step",
                                        info="Verification step t (1 = first after prefill). Or click a token of "
                                             "SD or Mirror-SD, or a bar of the tokens-per-step plot.",
                                        elem_id="mirror-inspect-step")
        seek = {kind: gr.Button(f"Next {kind} ▶", elem_id=f"mirror-next-{kind}", size="sm") for kind in ("hit", "miss")}
        learn_link = gr.Button("Slow it down (Learn tab) ▶", elem_id="mirror-inspect-learn", size="sm")
    out["inspector"] = gr.HTML(inspector.inspector_html(None, 1), elem_id="mirror-inspector")
    out["trace"] = gr.File(label="Run trace (JSON): every event of every decoder", interactive=False,
                           elem_id="mirror-trace")
    return Views(out, columns, seek, learn_link)


def _next_step(hit: bool):
    """The inspector's Next hit / Next miss: the first step after the shown one whose verdict was a hit (a miss)."""
    def handler(session: Session, decoder, step):
        run = session.runs.get(decoder) if isinstance(decoder, str) else None
        try:
            after = int(float(step or 0))
        except (TypeError, ValueError, OverflowError):
            after = 0
        found = next((r.step for r in run.steps if r.step > after and r.hit is hit), None) if run else None
        if found is None:
            raise gr.Error(f"no {'hit' if hit else 'miss'} after step {after} in this run" if run else
                           "run SD or Mirror-SD first", print_exception=False)
        return found
    return handler


def _wire(demo: gr.Blocks, loader: EngineLoader, presets: list[PairPreset], state: gr.State, c: Controls,
          v: Views) -> None:
    components = {**v.outputs, STATE: state}
    outputs = [components[name] for name in (*OUTPUT_NAMES, STATE)]  # the endpoints' output order

    def view(session: Session, tick: Tick) -> dict:
        """{component: value} for what this tick refreshes; Gradio leaves the other outputs as they are."""
        return {components[name]: value for name, value in refreshed(session, tick).items()}

    in_flight: dict[str, Session] = {}  # session hash → its Session while a run is going (this page's visitors)

    def on_run(request: gr.Request, session: Session, *values):
        try:
            settings = settings_from_ui(controls_by_name(values))
        except MirrorError as exc:
            session.status = f"**Error:** {exc}"
            gr.Warning(str(exc))  # a toast too: the page answers even when the status line is off screen
            yield view(session, Tick(STATUS, session.status))
            return
        in_flight[request.session_hash] = session
        try:
            for tick in run_comparison(loader, session, settings):
                if tick.kind == DONE and session.error:
                    gr.Warning(session.error)
                yield view(session, tick)
        finally:
            in_flight.pop(request.session_hash, None)

    def on_unload(request: gr.Request):
        """The tab was closed or reloaded (Gradio's heartbeat dropped): stop its work within one step."""
        session = in_flight.pop(request.session_hash, None)
        if session is not None:
            session.cancel()

    def on_stop(session: Session):
        running = not session.idle.is_set()
        session.stop.set()
        session.replay_stop.set()
        session.idle.wait(timeout=60)  # the run's generator ends within one step (or is closed by `cancels`)
        return view(session, Tick(DONE, final_status(session) if running else "Nothing was running."))

    def on_replay(session: Session, speed="1×"):
        for tick in replay(session, speed=REPLAY_SPEEDS.get(speed, 1.0)):
            yield view(session, tick)

    def on_inspect(session: Session, decoder, step):
        return inspector.inspector_html(session.runs.get(decoder) if isinstance(decoder, str) else None, step)

    # The controls go in as a positional list (CONTROLS order, named once in on_run): set-style inputs would
    # reorder the public /run endpoint's parameters (Gradio sorts a set by component id).
    # Progress only on the status line: it shows the queue position ("queue: 2/3") while waiting,
    # and no spinner covers the live plots. No preprocessing: out-of-range or non-numeric values reach
    # settings_from_ui, which answers each with one readable line on the status (Gradio's own checks would not).
    run_evt = c.run.click(on_run, [state, *c.inputs()], outputs, api_name="run", concurrency_id="lanes",
                          concurrency_limit=1, show_progress="minimal", show_progress_on=[v.outputs["status"]],
                          scroll_to_output=True, preprocess=False)  # raw values: settings_from_ui checks every field with one message
    replay_evt = c.replay.click(on_replay, [state, c.replay_speed], outputs, api_name="replay", concurrency_limit=8,
                                show_progress="hidden")
    c.stop.click(on_stop, [state], outputs, api_name="stop", cancels=[run_evt, replay_evt], concurrency_limit=None,
                 show_progress="hidden")
    demo.unload(on_unload)
    inspect_run, inspect_step = v.outputs["inspect_run"], v.outputs["inspect_step"]
    gr.on([inspect_run.change, inspect_step.change], on_inspect, [state, inspect_run, inspect_step],
          v.outputs["inspector"], api_name="inspect", show_progress="hidden",
          preprocess=False)  # a typed step out of range gets a line in the inspector, not a server traceback
    for kind, button in v.seek.items():
        button.click(_next_step(kind == "hit"), [state, inspect_run, inspect_step], inspect_step,
                     api_name=f"inspect_next_{kind}", show_progress="hidden", preprocess=False)
    c.preset.change(lambda label: _pair_of(presets, label), [c.preset], [c.fields["target"], c.fields["draft"]],
                    api_visibility="private", show_progress="hidden")
    c.fields["decoders"].change(lambda ds: [gr.Column(visible=d in (ds or ())) for d in COLUMNS],
                                [c.fields["decoders"]], [v.columns[d] for d in COLUMNS], api_visibility="private",
                                show_progress="hidden")


def _pair_of(presets: list[PairPreset], label: str):
    for p in presets:
        if p.label == label:
            return p.target, p.draft or ""
    return gr.skip(), gr.skip()


def _wire_learn_link(state: gr.State, v: Views, tabs: gr.Tabs, player: learn.StepPlayer) -> None:
    """The inspector's "Slow it down" button: the inspected Mirror-SD step in the Learn tab's step player."""
    def open_in_learn(session: Session, decoder, step):
        run = session.runs.get("mirror")
        if decoder != "mirror" or run is None or not run.steps:
            raise gr.Error("the step player plays Mirror-SD steps: run Mirror-SD and pick its run in the inspector",
                           print_exception=False)
        s = min(max(int(step or 1), 1), run.steps[-1].step)
        return (gr.Tabs(selected="learn"), s, 1) + player.views(session, s, 1)

    v.learn.click(open_in_learn, [state, v.outputs["inspect_run"], v.outputs["inspect_step"]],
                  [tabs, player.step, player.phase, player.player, player.tree], api_name="inspect_learn",
                  show_progress="hidden", queue=False)


def refreshed(session: Session, tick: Tick) -> dict[str, object]:
    """What one tick refreshes, by output name (OUTPUT_NAMES, plus STATE); every other output stays as it is."""
    out: dict[str, object] = {"status": tick.status}
    if tick.kind == STATUS:
        return out
    # Every stream goes out on every tick, unchanged ones too: Gradio diffs each output against what it sent last,
    # so an unchanged value costs nothing and a grown one only its new characters (an output left out would be
    # sent whole the next time).
    for d in COLUMNS:
        run = session.runs.get(d)
        upto = None if tick.replay_at is None or run is None else run.count_until(tick.replay_at)
        out |= {f"{d}_tokens": stream_html(run, upto, session.prompt),
                f"{d}_text": plain_text(run, upto)}
    if tick.kind != TEXT or session.live_plots or tick.plots:
        out["plots"] = session.feed.text()
    if tick.kind in (DONE, RESET):
        out |= _summary(session)
    return out


def _summary(session: Session) -> dict[str, object]:
    """The numbers, the latency model, the inspector (reset to step 1 of the speculative run) and the trace."""
    model = numbers.latency_model(session.runs.get("mirror"), session.runs.get("ar"))
    measured = numbers.speedup(session.runs.get("ar"), session.runs.get("mirror"))[0]
    pick = "mirror" if "mirror" in session.runs else "sd"
    run = session.runs.get(pick)
    last = run.steps[-1].step if run is not None and run.steps else 1
    return {"numbers": numbers.numbers_html(session.runs) + numbers.spread_html(session.history), "latency": numbers.latency_html(model, measured),
            "inspect_run": gr.Radio(value=pick), "inspect_step": gr.Slider(minimum=1, maximum=max(last, 2), value=1),
            "inspector": inspector.inspector_html(run, 1), "trace": session.trace_path, STATE: session}
