"""build_demo(loader, presets, examples) → gr.Blocks: the page's header, its two tabs (ui/run_tab.py over
ui/views.py; ui/learn/tab.py), the link between them, per-user gr.State and the queue."""
from __future__ import annotations

import html
import re
import threading

import gradio as gr

from mirror_core import machine

from . import render, run_tab, views
from .learn import tab as learn, tour
from .loader import EngineLoader, PairPreset
from .session import Session

QUEUE_MAX_SIZE = 32                # waiting requests beyond this are turned away ("queue is full")
# Gradio's queue loops poll every 1 ms (jobs) and 10 ms (progress) on Linux (`Queue.sleep_when_free`,
# `progress_update_sleep_when_free`: private in Gradio 6), idle or while a run holds the lanes: ~6 % of a
# core taken beside the lanes (BENCHMARKS.md's history). 50 ms delays only the start of a queued job and the
# queue-position line; tests/test_ui_app.py fails if a Gradio release drops the attributes.
QUEUE_POLL_S = 0.05
CSS = render.asset("page.css")  # the page's styles (ui/page.css)
# A tab shown again: its plots were laid out while it was hidden, so a window resized meanwhile left them at their old
# width (the roofline's axis title cut off): a resize event lays every plot out at the width it has now.
RELAYOUT_JS = "() => { setTimeout(() => dispatchEvent(new Event('resize')), 50); }"

# demo.launch(**LAUNCH) everywhere the page is served. Gradio's run history is off: it keeps every run's inputs and
# outputs in the browser's localStorage (up to 100 runs) and, while a generator streams, re-serialises that whole
# history every 500 ms, so the page's CPU grew with every run (BENCHMARKS.md's history, "The page's cost"); it would
# also keep each user's prompts and outputs in their browser.
LAUNCH = {"css": CSS + tour.CSS, "run_history": False}


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
                controls = run_tab.build_controls(presets, examples or [])
                shown = views.build(controls.status, controls.verdict, controls.ran, controls.fields["format"])
            with gr.Tab("Learn", id="learn") as learn_tab:
                player = learn.build(state, loader, learn_tab)
        for ended in run_tab.wire(demo, loader, presets, state, controls, shown):
            player.follow_after(ended, state)  # the Learn tab's player on the comparison's Mirror-SD run, unasked
        _wire_learn_link(state, shown, tabs, player)
        tabs.select(None, None, None, js=RELAYOUT_JS, api_visibility="private", queue=False)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=1)  # one run on the lanes at a time
    demo._queue.sleep_when_free = demo._queue.progress_update_sleep_when_free = QUEUE_POLL_S
    return demo


def end_streams(demo: gr.Blocks) -> threading.Event:
    """Set the app's asyncio stop event on the server's own loop: every heartbeat stream (one per open tab or
    gradio_client) waits on it, and Gradio's server only closes once they end. The returned event is set once it is.

    Gradio 6 sets it in Blocks.close() from the calling thread, where the loop can add or drop a waiter meanwhile
    ("RuntimeError: deque mutated during iteration"), and block_thread's Ctrl-C does not set it at all: its server
    then waited out a 5 s join for them (docs/BENCHMARKS.md: Ctrl-C with a client connected)."""
    done = threading.Event()
    event = getattr(getattr(demo, "app", None), "stop_event", None)
    loop = getattr(event, "_loop", None)  # bound by asyncio when the first stream waits on it
    if loop is None or not loop.is_running():
        done.set()
        return done

    def set_on_loop() -> None:
        event.set()
        done.set()

    loop.call_soon_threadsafe(set_on_loop)
    return done


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


def _wire_learn_link(state: gr.State, v: views.Views, tabs: gr.Tabs, player: learn.StepPlayer) -> None:
    """The inspector's "Slow it down" button: the inspected Mirror-SD step in the Learn tab's step player."""
    def open_in_learn(session: Session, decoder, step):
        run = session.runs.get("mirror")
        if decoder != "mirror" or run is None or not run.steps:
            raise gr.Error("the step player plays Mirror-SD steps: run Mirror-SD and pick its run in the inspector",
                           print_exception=False)
        try:
            s = min(max(int(step or 1), 1), run.steps[-1].step)
        except (TypeError, ValueError):
            s = 1
        return (gr.Tabs(selected="learn"), s, 1) + player.views(session, s, 1) + (learn.follow_key(session),)

    v.learn.click(open_in_learn, [state, v.outputs["inspect_run"], v.outputs["inspect_step"]],
                  [tabs, player.step, player.phase, player.player, player.tree, player.followed],
                  api_name="inspect_learn", show_progress="hidden", queue=False,
                  preprocess=False)  # the raw step, clamped above: an out-of-range one is not an error badge
