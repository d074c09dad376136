"""The launched app driven through gradio_client: a run streams tokens and plots, Stop works, users are separate."""
from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from mirror_core import LaneConfig
from testing.net import free_port
from testing.reliability import close_demo, page_values, run_args
from testing.toy_models import build_pair
from ui import LAUNCH, EngineLoader, build_demo, default_presets
from ui.render import shown_path
from ui.views import OUTPUT_NAMES, by_name
from ui.settings import CONTROLS

LANES = LaneConfig(kind="inline", target_threads=1, draft_threads=1)
# The public /run endpoint's parameters, positionally (gradio_client and raw HTTP callers rely on this order).
RUN_PARAMETERS = (("Textbox", "Prompt"), ("Textbox", "Target"), ("Textbox", "Draft"),
                  ("Checkboxgroup", "Decoders to compare"), ("Number", "γ (window)"),
                  ("Number", "κ (candidates per slot)"), ("Number", "ℓ_e (early-exit layer)"),
                  ("Number", "Temperature"), ("Number", "Top-k"), ("Number", "Top-p"), ("Radio", "Rule"),
                  ("Number", "Max new tokens"), ("Number", "Seed"), ("Number", "Branch budget"),
                  ("Checkbox", "Live plots"), ("Number", "Repeats"), ("Checkbox", "Raw prompt"),
                  ("Checkbox", "Context draft"), ("Dropdown", "Format"), ("Checkbox", "Zero windows"))


@pytest.fixture(scope="module")
def app(pair_root, tmp_path_factory):
    from gradio_client import Client

    target, draft = build_pair(pair_root, "llama")
    loader = EngineLoader(LANES)
    demo = build_demo(loader, default_presets(str(tmp_path_factory.mktemp("no_pair")), target, draft), ["1, 2, 3"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    try:
        yield url, target, draft, lambda: Client(url, verbose=False)
    finally:
        close_demo(demo)
        loader.close()


def args(target, draft, prompt="1, 2, 3", decoders=("ar", "mirror"), max_new=24, **over):
    """The /run endpoint's positional arguments, built by control name."""
    return run_args(page_values(prompt=prompt, target=target, draft=draft, decoders=list(decoders), gamma=3, kappa=2,
                                max_new_tokens=max_new, **over))


def run(client, *values) -> list[dict]:
    """Every yield of one /run call, by output name."""
    return [by_name(o) for o in client.submit(*values, api_name="/run")]


def tokens(stream_html) -> list[str]:
    """The origin labels of the committed tokens in one decoder's stream view (one span per token)."""
    return re.findall(r'<span class="mirror-tok" title="([^"]*) · step \d+" data-step="\d+"', stream_html or "")


def test_a_full_run_streams_tokens_then_plots_and_exports_a_trace(app):
    _, target, draft, client = app
    c = client()
    outputs = run(c, *args(target, draft))
    final = outputs[-1]
    assert "Done" in final["status"]
    streamed = [o for o in outputs[:-1] if isinstance(o["ar_tokens"], str) and tokens(o["ar_tokens"])]
    assert streamed, "tokens should arrive before the run ends"
    feeds = [o["plots"] for o in outputs[:-1] if isinstance(o["plots"], str) and "\nT " in o["plots"]]
    assert feeds, "the plots' records stream before the run ends"
    assert "\nE mirror Mirror-SD · " in final["plots"] and "\nP mirror draft draft_branches " in final["plots"]
    assert len(tokens(final["ar_tokens"])) == 24 and final["ar_text"] == final["mirror_text"]  # greedy: lossless
    assert set(tokens(final["mirror_tokens"])) <= {
        "target", "accepted draft", "accepted · reused branch", "correction", "bonus"}
    assert 'class="mirror-prompt"' in final["mirror_tokens"]                  # the prompt, greyed, before the text
    assert "speedup vs AR" in final["numbers"] and os.path.exists(final["trace"])
    assert "Formats, set when the pair loaded" in final["numbers"] and "target: " in final["numbers"] and "draft: " in final["numbers"]
    assert f"Ran: target {shown_path(target)} on cpu, draft {shown_path(draft)} on cpu" in final["numbers"]
    replayed = [by_name(o) for o in c.submit(api_name="/replay")]  # the same session's runs, re-animated
    assert "Replay finished" in replayed[-1]["status"] and replayed[-1]["ar_text"] == final["ar_text"]
    assert len(replayed) >= 2 and "Replaying at measured speed" in replayed[0]["status"]
    slow = [by_name(o) for o in c.submit("0.25×", api_name="/replay")]  # slow motion: 4x the ticks of the same runs
    assert "Replaying at 0.25× measured speed" in slow[0]["status"]
    end_ms = float(re.search(r"of (\d+) ms", replayed[0]["status"]).group(1))
    for ticks, step_ms in ((replayed, 50.0), (slow, 12.5)):  # one tick per 1/20 s of the page at that speed, + the end
        assert abs(len(ticks) - (math.ceil(end_ms / step_ms) + 1)) <= 1, (len(ticks), end_ms, step_ms)


def test_stop_ends_the_run_and_says_so(app):
    _, target, draft, client = app
    c = client()
    job = c.submit(*args(target, draft, decoders=("ar", "sd", "mirror"), max_new=480), api_name="/run")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        outs = [by_name(o) for o in job.outputs()]
        if any(isinstance(o["ar_tokens"], str) and tokens(o["ar_tokens"]) for o in outs):
            break
        time.sleep(0.05)
    stopped = by_name(c.predict(api_name="/stop"))
    assert "Stopped" in stopped["status"]
    deadline = time.monotonic() + 30
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.done() and "Stopped" in by_name(job.outputs()[-1])["status"]
    committed = sum(len(tokens(stopped[f"{d}_tokens"])) for d in ("ar", "sd", "mirror"))
    assert committed < 3 * 480


def test_two_users_queue_without_seeing_each_other(app):
    _, target, draft, client = app
    a, b = client(), client()
    job_a = a.submit(*args(target, draft, "1, 2, 3", ("ar",), 16), api_name="/run")
    job_b = b.submit(*args(target, draft, "5, 6", ("mirror",), 16), api_name="/run")
    out_a, out_b = by_name(list(job_a)[-1]), by_name(list(job_b)[-1])
    assert "Done" in out_a["status"] and "Done" in out_b["status"]
    assert tokens(out_a["ar_tokens"]) and not tokens(out_a["mirror_tokens"])
    assert tokens(out_b["mirror_tokens"]) and not tokens(out_b["ar_tokens"])


def test_bad_settings_and_models_show_a_readable_error_and_the_app_keeps_serving(app, tmp_path):
    _, target, draft, client = app
    c = client()
    bad = run(c, *args(str(tmp_path / "nope"), draft))[-1]
    assert "**Error:**" in bad["status"]
    deep_exit = run(c, "1, 2", target, draft, ["mirror"], 3, 2, 9, 0.0, 0, 1.0, "exact", 8, 0)[-1]  # positional;
    assert "exit layer must be in 1..3" in deep_exit["status"]                  # ℓ_e = 9 on a 4-layer target
    no_ids = run(c, *args(target, draft, "hello", ("ar",), 8))[-1]
    assert "no tokenizer" in no_ids["status"]
    ok = run(c, *args(target, draft, decoders=("ar",), max_new=4))[-1]
    assert "Done" in ok["status"] and len(tokens(ok["ar_tokens"])) == 4


def test_the_run_endpoint_keeps_its_parameters_and_outputs(app):
    """/run takes CONTROLS positionally, in the order RUN_PARAMETERS pins, and returns OUTPUT_NAMES' outputs."""
    _, _, _, client = app
    api = client().view_api(print_info=False, return_format="dict")["named_endpoints"]
    parameters = api["/run"]["parameters"]
    assert len(CONTROLS) == len(parameters)
    assert [(p["component"], p["label"]) for p in parameters] == list(RUN_PARAMETERS)
    assert [p["parameter_name"] for p in parameters] == [f"param_{i}" for i in range(1, len(CONTROLS) + 1)]
    for endpoint in ("/run", "/replay", "/stop"):
        assert len(api[endpoint]["returns"]) == len(OUTPUT_NAMES)


def test_run_controls_and_outputs_are_wired_by_name(tmp_path):
    demo = build_demo(EngineLoader(LANES), default_presets(str(tmp_path)), [])
    config = demo.get_config_file()
    props = {c["id"]: c.get("props", {}) for c in config["components"]}
    run_dep = next(d for d in config["dependencies"] if d["api_name"] == "run")
    labels = [props[i].get("label") for i in run_dep["inputs"][1:]]           # after the per-user state
    assert labels == [label for _, label in RUN_PARAMETERS]
    elem_ids = [props[i].get("elem_id") for i in run_dep["outputs"]]
    assert len(elem_ids) == len(OUTPUT_NAMES) + 1                              # + the per-user state
    named = dict(zip(OUTPUT_NAMES, elem_ids))
    assert named["status"] == "mirror-status" and named["trace"] == "mirror-trace"
    assert all(named[f"{d}_{view}"] == f"mirror-{view}-{d}" for d in ("ar", "sd", "mirror")
               for view in ("tokens", "text"))
    assert named["plots"] == "mirror-plots"


def test_page_explains_a_missing_default_pair(tmp_path):
    demo = build_demo(EngineLoader(LANES), default_presets(str(tmp_path)), [])
    texts = [b.value for b in demo.blocks.values() if isinstance(getattr(b, "value", None), str)]
    assert any("No model pair available yet" in t and "--target" in t for t in texts)


@pytest.mark.slow  # a subprocess start (the in-process app above serves the default tier's page tests)
def test_app_py_starts_without_models_prints_its_url_and_serves(tmp_path):
    """`python app.py` with no usable pair still serves the page (the banner/Run say what to do)."""
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--target", str(tmp_path / "missing"),
                             "--draft", str(tmp_path / "missing_draft"), "--lane", "inline"],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("could not load" in line for line in lines):
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        assert any(f"http://127.0.0.1:{port}" in line for line in lines), "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and "Mirror-SD Playground" in page.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_importing_the_ui_and_app_loads_no_model_and_reads_no_argv():
    code = ("import sys; sys.argv = ['app.py', '--no-such-flag']\n"
            "import mirror_core.engine as api\n"
            "def refuse(*a, **k): raise AssertionError('a model was loaded at import')\n"
            "api.MirrorEngine.load = refuse\n"
            "import ui, app, ui.layout, ui.run_tab, ui.views, ui.streaming, ui.plots\n"
            "assert not any(t.name == 'mirror-target-lane' for t in __import__('threading').enumerate())\n"
            "print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr[-2000:]


def test_the_queue_polls_gently_beside_the_lanes(tmp_path):
    """Gradio's queue loops would poll every 1 ms and 10 ms (idle or not); build_demo slows them to QUEUE_POLL_S."""
    from ui.layout import QUEUE_POLL_S

    demo = build_demo(EngineLoader(LANES), default_presets(str(tmp_path)), [])
    queue = demo._queue  # private attributes: this fails loudly if a Gradio release renames them
    assert queue.sleep_when_free == queue.progress_update_sleep_when_free == QUEUE_POLL_S
