"""The Run tab: its controls (built from settings.RUN_CONTROLS) above its views (ui/views.py), and the wiring of
Run, Stop, Replay and the step inspector to the per-user Session."""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import gradio as gr

from mirror_core import MirrorError
from mirror_core.config import MAX_PROMPT_CHARS

from . import inspector, verdict
from .cancellable import cancellable
from .loader import EngineLoader, PairPreset
from .session import Session
from .settings import (
    BY_NAME,
    CONTROLS,
    DECODER_TITLES,
    INFO,
    RULE_CHOICES,
    RUN_CONTROLS,
    Control,
    controls_by_name,
    format_choices,
    settings_from_ui,
)
from .streaming import DONE, RESULTS, Tick, final_status, replay, run_comparison
from .render import shown_path
from .views import COLUMNS, OUTPUT_NAMES, RAN_BEFORE, STATE, Deltas, Views, refreshed

CUSTOM = "Custom (type below)"
REPLAY_SPEEDS = {"1×": 1.0, "0.5×": 0.5, "0.25×": 0.25, "0.1×": 0.1, "0.05×": 0.05}  # of the measured time
KNOB_ROWS = ("speculation", "sampling")  # the rows of "Speculation and sampling" (Control.row), top to bottom


@dataclass
class Controls:
    fields: dict  # control name (settings.CONTROLS) → its component
    preset: gr.Dropdown
    run: gr.Button
    stop: gr.Button
    replay: gr.Button
    status: gr.Markdown  # right under Run/Stop: results and errors show where the eye is
    replay_speed: gr.Dropdown  # REPLAY_SPEEDS: slow motion for the replay
    verdict: gr.HTML  # under the status: Mirror ÷ AR, Mirror ÷ SD and why (ui/verdict.py), on the first screen
    ran: gr.Markdown  # in "Speculation and sampling": the γ, κ, ℓ_e the last run used (0 there = chosen by the pair)

    def inputs(self) -> list:
        """The /run endpoint's parameters, in CONTROLS order."""
        return [self.fields[name] for name in CONTROLS]


def build_controls(presets: list[PairPreset], examples: list[str]) -> Controls:
    first = next((p for p in presets if p.available), presets[0] if presets else None)
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label=BY_NAME["prompt"].label, lines=4, info=INFO["prompt"],
                                value=examples[0] if examples else "", max_length=MAX_PROMPT_CHARS,
                                elem_id="mirror-prompt")
            with gr.Row():  # Run right under the prompt: on a phone's first screen, above the examples
                run = gr.Button("Run", variant="primary", elem_id="mirror-run")
                stop = gr.Button("Stop", variant="stop", elem_id="mirror-stop")
                replay_btn = gr.Button("Replay side by side", elem_id="mirror-replay")
                replay_speed = gr.Dropdown([(f"replay at {k}", k) for k in REPLAY_SPEEDS], value="1×",
                                           label="Replay speed (slow motion)", show_label=False, container=False,
                                           min_width=110, elem_id="mirror-replay-speed")  # one line: Run's row stays low
            status = gr.Markdown(f"Pick a pair and press **Run**. {verdict.EMPTY}", elem_id="mirror-status")
            verdict_box = gr.HTML(verdict.verdict_html(Session()), elem_id="mirror-verdict")
            if examples:  # one line, not a wall of buttons: the streams stay on the first screen
                pick = gr.Dropdown([(_one_line(e), e) for e in examples], value=None, label="Example prompts",
                                   elem_id="mirror-examples")
                pick.input(lambda text: text, [pick], [prompt], api_visibility="private", show_progress="hidden")
        with gr.Column(scale=2):
            with gr.Row():  # the pair and the function its target computes, side by side: the streams stay on screen
                preset = gr.Dropdown([p.label for p in presets] + [CUSTOM], label="Model pair", info=INFO["preset"],
                                     value=first.label if first else CUSTOM, scale=3)
                fmt = gr.Dropdown(format_choices(), value=BY_NAME["format"].default, label=BY_NAME["format"].label,
                                  info=INFO["format"], elem_id="mirror-format", scale=2, min_width=140)
            decoders = BY_NAME["decoders"]
            fields = {"prompt": prompt,
                      "target": gr.Textbox(label=BY_NAME["target"].label, info=INFO["target"], elem_id="mirror-target",
                                           value=shown_path(first.target) if first else ""),
                      "draft": gr.Textbox(label=BY_NAME["draft"].label, info=INFO["draft"],
                                          value=shown_path(first.draft) if first else ""),
                      "format": fmt,
                      "decoders": gr.CheckboxGroup([(DECODER_TITLES[d], d) for d in COLUMNS], value=decoders.default,
                                                   label=decoders.label, info=decoders.info)}
    with gr.Accordion("Speculation and sampling", open=False, elem_id="mirror-knobs"):  # the defaults suit a first run
        ran = gr.Markdown(RAN_BEFORE, elem_id="mirror-ran")
        for row in KNOB_ROWS:
            with gr.Row():
                fields |= {c.name: _field(c) for c in RUN_CONTROLS if c.row == row}
    return Controls(fields, preset, run, stop, replay_btn, status, replay_speed, verdict_box, ran)


def _one_line(text: str, width: int = 90) -> str:
    """An example prompt as one line of the picker (newlines shown as ⏎, cut at `width` characters)."""
    line = text.replace("\n", " ⏎ ").strip()
    return line if len(line) <= width else line[: width - 1] + "…"


def _field(c: Control):
    """A knob's component, by what it holds: the rule's radio, a checkbox, or a number box (never a slider: a slider
    clamps a typed value silently; settings_from_ui checks every bound and answers an out-of-range value with one
    line naming the range)."""
    elem_id = f"mirror-{c.name.replace('_', '-')}"
    if c.name == "rule":
        return gr.Radio(list(RULE_CHOICES), value=c.default, label=c.label, info=c.info)
    if isinstance(c.default, bool):
        return gr.Checkbox(c.default, label=c.label, info=c.info, elem_id=elem_id)
    return gr.Number(c.default, precision=0 if c.step == 1 else None, step=c.step, label=c.label, info=c.info,
                     elem_id=elem_id)


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


def view(components: dict, session: Session, tick: Tick, deltas: Deltas) -> dict:
    """{component: value} for what this tick refreshes (Gradio leaves the other outputs as they are), the streams and
    the feed as this event's deltas."""
    return {components[name]: value for name, value in deltas(refreshed(session, tick), tick).items()}


def wire(demo: gr.Blocks, loader: EngineLoader, presets: list[PairPreset], state: gr.State, c: Controls,
         v: Views) -> list:
    """The Run tab's events; returns the two that end a comparison (Run's, and Stop's), for what follows them."""
    components = {**v.outputs, STATE: state}
    outputs = [components[name] for name in (*OUTPUT_NAMES, STATE)]  # the endpoints' output order

    on_run, on_unload = _run_handlers(loader, presets, components)

    def on_stop(session: Session):
        running = not session.idle.is_set()
        session.stop.set()
        session.replay_stop.set()
        session.idle.wait(timeout=60)  # the run's generator ends within one step (or is closed by `cancels`)
        status = final_status(session) if running else "Nothing was running."
        return view(components, session, Tick(DONE, status), Deltas())

    def on_replay(session: Session, speed="1×"):
        deltas = Deltas()
        stopped = threading.Event()
        with loader.holding(stopped):  # a server shutting down ends the replay at once
            for tick in replay(session, speed=REPLAY_SPEEDS.get(speed, 1.0), stopped=stopped):
                yield view(components, session, tick, deltas)

    # The controls go in as a positional list (CONTROLS order, named once in the Run handler): set-style inputs would
    # reorder the public /run endpoint's parameters (Gradio sorts a set by component id). Progress only on the status
    # line: it shows the queue position ("queue: 2/3") while waiting, and no spinner covers the live plots. No
    # preprocessing: out-of-range or non-numeric values reach settings_from_ui, which answers each with one line.
    run_evt = c.run.click(on_run, [state, *c.inputs()], outputs, api_name="run", concurrency_id="lanes",
                          concurrency_limit=1, show_progress="minimal", show_progress_on=[v.outputs["status"]],
                          scroll_to_output=True, preprocess=False)  # raw values: settings_from_ui checks every field with one message
    run_evt.then(_error_toast, state, None, api_visibility="private", concurrency_limit=None, show_progress="hidden")
    replay_evt = c.replay.click(on_replay, [state, c.replay_speed], outputs, api_name="replay", concurrency_limit=8,
                                show_progress="hidden")
    stop_evt = c.stop.click(on_stop, [state], outputs, api_name="stop", cancels=[run_evt, replay_evt],
                            concurrency_limit=None, show_progress="hidden")
    demo.unload(on_unload)
    _wire_inspector(state, v)
    _wire_pickers(presets, c, v)
    return [run_evt, stop_evt]


def _error_toast(session: Session) -> None:
    """The last Run's error as the page's error toast (titled "Error"), so that the page answers even when the status
    line is off screen; nothing when it had none. Raised by an event of its own after the run's: it has no outputs,
    so no component is marked failed and /run's clients get its outputs whole (and queued: Gradio shows no toast
    for an error of an unqueued event)."""
    if session.error:
        raise gr.Error(session.error, print_exception=False)



def _run_handlers(loader: EngineLoader, presets: list[PairPreset], components: dict):
    """Run's handler and the unload handler that stops a closed tab's run (they share the runs in flight)."""
    in_flight: dict[str, Session] = {}  # session hash → its Session while a run is going (this page's visitors)

    async def on_run(request: gr.Request, session: Session, *values):
        """The comparison's page updates; Gradio's cancel (Stop, a client's cancel) stops the engine between two
        steps, however long the page has held still (ui/cancellable.py)."""
        async with contextlib.aclosing(cancellable(comparison_views(request, session, values), session.cancel)) as run:
            async for update in run:
                yield update

    def comparison_views(request: gr.Request, session: Session, values: tuple):
        """on_run's body: the settings checked, then each tick of the comparison as {component: value}."""
        try:
            settings = settings_from_ui(with_sources(controls_by_name(values), preset_sources(presets)))
        except MirrorError as exc:
            session.refuse(str(exc))
            yield view(components, session, Tick(RESULTS, session.status), Deltas())  # the verdict says it is earlier
            return
        in_flight[request.session_hash] = session
        deltas = Deltas()
        try:
            for tick in run_comparison(loader, session, settings):
                yield view(components, session, tick, deltas)
        finally:
            in_flight.pop(request.session_hash, None)

    def on_unload(request: gr.Request):
        """The tab was closed or reloaded (Gradio's heartbeat dropped): stop its work within one step."""
        session = in_flight.pop(request.session_hash, None)
        if session is not None:
            session.cancel()

    return on_run, on_unload


def _wire_inspector(state: gr.State, v: Views) -> None:
    """The step inspector: the run and step it shows, and Next hit / Next miss."""
    def on_inspect(session: Session, decoder, step):
        return inspector.inspector_html(session.runs.get(decoder) if isinstance(decoder, str) else None, step)

    inspect_run, inspect_step = v.outputs["inspect_run"], v.outputs["inspect_step"]
    gr.on([inspect_run.change, inspect_step.change], on_inspect, [state, inspect_run, inspect_step],
          v.outputs["inspector"], api_name="inspect", show_progress="hidden",
          preprocess=False)  # a typed step out of range gets a line in the inspector, not a server traceback
    for kind, button in v.seek.items():
        button.click(_next_step(kind == "hit"), [state, inspect_run, inspect_step], inspect_step,
                     api_name=f"inspect_next_{kind}", show_progress="hidden", preprocess=False)


def _wire_pickers(presets: list[PairPreset], c: Controls, v: Views) -> None:
    """The pair preset fills Target and Draft; the decoders chosen show their columns (neither is an endpoint)."""
    c.preset.change(lambda label: (*_pair_of(presets, label), gr.Dropdown(format_choices(), value="auto")), [c.preset],
                    [c.fields["target"], c.fields["draft"], c.fields["format"]], api_visibility="private",
                    show_progress="hidden")  # another pair: its formats are known once it loads
    c.fields["decoders"].change(lambda ds: [gr.Column(visible=d in (ds or ())) for d in COLUMNS],
                                [c.fields["decoders"]], [v.columns[d] for d in COLUMNS], api_visibility="private",
                                show_progress="hidden")


def _pair_of(presets: list[PairPreset], label: str):
    for p in presets:
        if p.label == label:
            return shown_path(p.target), shown_path(p.draft)
    return gr.skip(), gr.skip()


def preset_sources(presets: list[PairPreset]) -> dict[str, str]:
    """The presets' folders as the Target and Draft boxes show them (render.shown_path) → the folders themselves."""
    return {shown_path(src): src for p in presets for src in (p.target, p.draft) if src}


def with_sources(values: dict, sources: dict[str, str]) -> dict:
    """Target and Draft as typed → what to load: a preset's shown folder is that folder, ~/… is under the home
    folder; anything else (a hub id, a typed path) as it is."""
    out = dict(values)
    for name in ("target", "draft"):
        text = out.get(name)
        if isinstance(text, str) and text.strip():
            text = text.strip()
            out[name] = sources.get(text) or (os.path.expanduser(text) if text.startswith("~/") else text)
    return out
