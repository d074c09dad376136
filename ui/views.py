"""The Run tab's views: the streams, the live plots, the numbers, the step inspector and the trace; the outputs of
/run, /replay and /stop by name (OUTPUT_NAMES, by_name), and what one tick of a run refreshes (refreshed)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gradio as gr

from mirror_core.models.pairs import target_function

from . import inspector, numbers, plots, render, verdict
from .render import shown_path
from .session import Session, plain_text, stream_html
from .settings import DECODER_ORDER, DECODER_TITLES, DEFAULTS, format_choices
from .streaming import DONE, RESET, RESULTS, STATUS, TEXT, Tick

COLUMNS = DECODER_ORDER  # left to right on the page: the order they run in

# The outputs of /run, /replay and /stop by name, in the endpoints' order (what gradio_client returns; the
# per-user state follows them as one more output that clients never see). Tests read results with by_name().
TOKEN_VIEWS = ("tokens", "text")  # per column: the stream (HTML: prompt, coloured tokens, rejected drafts), copy box
OUTPUT_NAMES = ("status", *(f"{d}_{view}" for d in COLUMNS for view in TOKEN_VIEWS), "plots", "numbers", "latency",
                "inspect_run", "inspect_step", "inspector", "trace",
                "verdict",  # under the status line: Mirror ÷ AR, Mirror ÷ SD and why (ui/verdict.py)
                "ran",      # beside the "0 = chosen by the pair" knobs: the γ, κ, ℓ_e the last run used
                "who",      # under the streams: the function that wrote the text (the target in its format)
                "format")   # the Format control, its choices the loaded target's formats
STATE = "session"  # the gr.State output's name in a tick's refresh
RAN_BEFORE = "After a run, the γ, κ and ℓ_e it used show here (0 above = chosen by the pair when it loads)."

# Under the streams: what the text is, before anyone reads the default example's answer as the method's quality.
WHO_WROTE_IT = ("**Who wrote this:** the target model in its **Format** (the function it computes), whichever decoder "
                "ran it; after a run, that function is named here.")
SAME_TEXT = ("All the columns are this function's own tokens, token for token (greedy, or the exact rule with one "
             "seed): speculation changes how fast the text comes, never what it says. Another format is another "
             "function, with other tokens where the two disagree (**Format** switches it), and a small model gets "
             "facts wrong in any format.")
HONESTY = ("Decoders run **one after another**, each with both lanes to itself, and the page **holds still while "
           "each one is timed**: it shows a run's first token at once and the rest when the run ends, so drawing "
           "never takes CPU from the lanes it measures. Every time shown comes from the engine's spans and commit "
           "stamps (never from the page). When the timing ends, the streams and plots replay the runs the verdict "
           "reads side by side at their measured pace (*Replay side by side* plays them again; untick *Live plots* "
           "to skip it). Speedups below 1× are shown as measured; *Repeats* shows the spread.")

# Each decoder's stream: append-only HTML (session.stream_html), sent as Deltas. The template is only the box; the
# script appends each delta (O(new) per update: re-rendering the whole stream, as a template with ${value} does,
# cost the page tens of ms per update at 900 tokens), and the box follows the newest token unless the reader
# scrolled up.
TOKENS_TEMPLATE = '<div class="mirror-tokens"></div>'
DELTA_JS = render.asset("delta.js")  # how the page scripts read a Deltas value (ui/delta.js)
TOKENS_JS = DELTA_JS + render.asset("tokens.js")  # the stream boxes' script (ui/tokens.js)
# The four live plots: the value is the feed (ui/plots.py), drawn on canvases in the browser by ui/live_plots.js.
PLOTS_TEMPLATE = "".join(f'<div class="mirror-plot mirror-plot-{name}"></div>' for name in ("race", "steps", "gantt",
                                                                                          "accept"))
PLOTS_JS = DELTA_JS + render.asset("live_plots.js")  # draws the feed on canvases (ui/live_plots.js)


def by_name(outputs: Sequence) -> dict[str, object]:
    """One /run, /replay or /stop result (a list in OUTPUT_NAMES order, as gradio_client or the queue's event stream
    returns it) by output name."""
    if len(outputs) < len(OUTPUT_NAMES):
        raise ValueError(f"expected {len(OUTPUT_NAMES)} outputs ({', '.join(OUTPUT_NAMES)}), got {len(outputs)}")
    return dict(zip(OUTPUT_NAMES, outputs))


@dataclass
class Views:
    outputs: dict  # output name (OUTPUT_NAMES) → its component
    columns: dict  # decoder → gr.Column
    seek: dict     # "hit" / "miss" → the inspector's Next hit / Next miss button
    learn: gr.Button  # the inspector's "Slow it down": the inspected step in the Learn tab's step player


def build(status: gr.Markdown, verdict_box: gr.HTML, ran: gr.Markdown, fmt: gr.Dropdown) -> Views:
    """The views under the controls (the status line, the verdict, the "ran" line and the Format control are the
    controls', right under Run, beside the knobs and beside the pair)."""
    out = {"status": status, "verdict": verdict_box, "ran": ran, "format": fmt}
    with gr.Row(elem_id="mirror-legend-row"):
        gr.HTML(render.legend_html())
        hide = gr.Checkbox(False, label="Hide rejected drafts", elem_id="mirror-hide-rejected", min_width=160,
                           container=False, scale=0)
    hide.change(None, hide, None, js=render.HIDE_REJECTED_JS, api_visibility="private")  # in the browser only
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
    out["who"] = gr.Markdown(WHO_WROTE_IT, elem_id="mirror-streams-note")
    gr.Markdown(HONESTY)  # below the streams: the first screen shows the prompt, Run, the status and the streams
    out["plots"] = gr.HTML("", elem_id="mirror-plots", html_template=PLOTS_TEMPLATE,
                           js_on_load=PLOTS_JS,
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


def refreshed(session: Session, tick: Tick) -> dict[str, object]:
    """What one tick refreshes, by output name (OUTPUT_NAMES, plus STATE); every other output stays as it is."""
    out: dict[str, object] = {"status": tick.status}
    if tick.kind == STATUS:
        return out
    if tick.kind == RESULTS:
        return out | _results(session)
    # Every stream goes out whole on every tick, unchanged ones too; the Run tab sends the append-only ones as
    # Deltas (what grew since the event's last value: an unchanged one is the same empty delta again, which Gradio
    # does not resend).
    for d in COLUMNS:
        run = session.runs.get(d)
        upto = None if tick.replay_at is None or run is None else run.count_until(tick.replay_at)
        out |= {f"{d}_tokens": stream_html(run, upto, session.prompt),
                f"{d}_text": plain_text(run, upto)}
    if tick.kind != TEXT or tick.plots:
        out["plots"] = session.feed.text()
    if tick.kind in (DONE, RESET):
        out |= _inspection(session)
    if tick.kind == DONE:
        out |= _results(session)
    return out


APPEND_ONLY = ("plots", *(f"{d}_tokens" for d in COLUMNS))  # the views that only grow while a run streams


class Deltas:
    """One event's (a /run, /replay or /stop call's) append-only views as it sends them: the whole text, or, while a
    run streams, "+START CHUNK": only what grew since the event's previous value (the text from character START on;
    read by ui/delta.js).

    Why: Gradio's page does work in proportion to a value's length on every update (it compares, copies and
    re-renders the whole value; the server's own diff only saves bytes on the wire), which at 900 tokens made each
    update of the whole stream and feed a 50-200 ms task on 2 busy cores (BENCHMARKS.md's history, "The page's updates
    as deltas"). A delta's work is in proportion to what it adds. An event's first value of each view and its last
    (`whole`) are whole: a view that missed updates (Gradio keeps only the newest value of a component that is not
    mounted, e.g. in a column hidden and shown again mid-run) is right again at the end, and an API client's final
    result has every view whole.
    """

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}  # view → the whole text its last value brought the page to

    def __call__(self, outputs: dict[str, object], tick: Tick) -> dict[str, object]:
        """`outputs` (one tick's refresh, whole) with the append-only views as this event sends them."""
        whole = tick.whole or tick.kind == DONE
        for name in APPEND_ONLY:
            text = outputs.get(name)
            if not isinstance(text, str):
                continue
            before = self.sent.get(name)
            if not whole and before and len(text) >= len(before) and text.startswith(before):
                outputs[name] = f"+{len(before)} {text[len(before):]}"
            self.sent[name] = text
        return outputs


def _results(session: Session) -> dict[str, object]:
    """The comparison's numbers, the latency model, the verdict and the ran line."""
    model = numbers.latency_model(session.runs.get("mirror"), session.runs.get("ar"))
    measured = numbers.speedup(session.runs.get("ar"), session.runs.get("mirror"))[0]
    info = session.pair_info
    return {"numbers": numbers.numbers_html(session.runs) + numbers.spread_html(session.history),
            "latency": numbers.latency_html(model, measured, session.runs.get("mirror"), session.runs.get("sd")), "verdict": verdict.verdict_html(session),
            "ran": ran_line(session), "who": who_wrote(session),
            "format": gr.skip() if info is None else gr.Dropdown(choices=format_choices(info))}


def who_wrote(session: Session) -> str:
    """Who wrote the text: the target in the format its runs computed (models/pairs.py: TargetFunction, the CLI's
    wording), with the recorded agreement between its formats where one was measured."""
    run = next((r for r in session.runs.values() if r.start is not None), None)
    said = None if run is None else target_function(run.start.settings)
    if said is None:
        return WHO_WROTE_IT
    return (f"**Who wrote this:** the target, `{shown_path(run.start.settings.target)}`, whichever decoder ran it, in "
            f"this function: {said.line}. {SAME_TEXT}")


def _inspection(session: Session) -> dict[str, object]:
    """The step inspector (reset to step 1 of the speculative run), the trace, and the session."""
    pick = "mirror" if "mirror" in session.runs else "sd"
    run = session.runs.get(pick)
    # the slider reaches the longest speculative run's last step: a token or bar of either run opens its step
    last = max((r.steps[-1].step for r in (session.runs.get(d) for d in ("mirror", "sd")) if r is not None and r.steps),
               default=1)
    return {"inspect_run": gr.Radio(value=pick), "inspect_step": gr.Slider(minimum=1, maximum=max(last, 2), value=1),
            "inspector": inspector.inspector_html(run, 1), "trace": session.trace_path, STATE: session}


def ran_line(session: Session) -> str:
    """The γ, κ and ℓ_e the last speculative run used, for the knobs where 0 means "chosen by the pair"."""
    run = next((r for r in (session.runs.get(d) for d in ("mirror", "sd")) if r is not None and r.start), None)
    if run is None:
        return RAN_BEFORE if not session.runs else "The last run was AR alone: it used no γ, κ or ℓ_e."
    s = run.start.settings
    spec = s.request.spec
    chosen = f" (γ, κ: {s.spec_note})" if s.spec_note else ""  # the note says how the pair chose them
    return (f"**Last run used** γ = {spec.gamma}, κ = {spec.kappa}, ℓ_e = {s.exit_layer}{chosen}."
            f"{_choice_checked(session, run)} Typing one of these here and pressing Run again repeats that run; 0 "
            "leaves the choice to the pair.")


def _choice_checked(session: Session, run) -> str:
    """The load's modelled speedup for this machine's γ, κ, re-checked against what this Mirror-SD run measured."""
    modelled = run.start.settings.spec_modelled
    measured, _ = numbers.speedup(session.runs.get("ar"), run) if run.decoder == "mirror" else (None, None)
    if modelled is None or measured is None:
        return ""
    held = ("the choice held" if measured >= 0.9 * modelled else "the choice did not hold here: the fold under the "
            "verdict names the term that moved most, and the Learn tab's γ and κ experiments measure the other "
            "settings on this prompt")
    return f" Modelled at load {modelled:.2f}× AR; this run measured {measured:.2f}× ({held})."
