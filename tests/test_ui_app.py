"""The launched app driven through gradio_client: a run streams tokens and plots, Stop works, users are separate."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from mirror_core import LaneConfig
from testing.toy_models import build_pair
from ui import CSS, EngineLoader, build_demo, default_presets

LANES = LaneConfig(kind="inline", target_threads=1, draft_threads=1)
STATUS, AR_TOKENS, AR_TEXT, MIRROR_TOKENS, MIRROR_TEXT, SD_TOKENS = 0, 1, 3, 4, 6, 7
RACE, GANTT, NUMBERS, TRACE = 10, 12, 14, 19


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(pair_root, tmp_path_factory):
    from gradio_client import Client

    target, draft = build_pair(pair_root, "llama")
    loader = EngineLoader(LANES)
    demo = build_demo(loader, default_presets(str(tmp_path_factory.mktemp("no_pair")), target, draft), ["1, 2, 3"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=_free_port(), quiet=True, css=CSS)
    try:
        yield url, target, draft, lambda: Client(url, verbose=False)
    finally:
        demo.close()
        loader.close()


def args(target, draft, prompt="1, 2, 3", decoders=("ar", "mirror"), max_new=24):
    return (prompt, target, draft, list(decoders), 3, 2, 0, 0.0, 0, 1.0, "exact", max_new, 0)


def is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def test_a_full_run_streams_tokens_then_plots_and_exports_a_trace(app):
    _, target, draft, client = app
    c = client()
    outputs = list(c.submit(*args(target, draft), api_name="/run"))
    final = outputs[-1]
    assert "Done" in final[STATUS]
    streamed = [o for o in outputs[:-1] if isinstance(o[AR_TOKENS], list) and o[AR_TOKENS]]
    assert streamed, "tokens should arrive before the run ends"
    assert any(is_update(o[RACE]) for o in outputs[:-1]), "plots are throttled: some yields skip them"
    assert final[RACE]["type"] == "plotly" and "Mirror-SD" in final[RACE]["plot"]
    assert '"orientation":"h"' in final[GANTT]["plot"]
    assert len(final[AR_TOKENS]) == 24 and final[AR_TEXT] == final[MIRROR_TEXT]          # greedy: lossless
    assert {t["class_or_confidence"] for t in final[MIRROR_TOKENS]} <= {
        "target", "accepted draft", "accepted · reused branch", "correction", "bonus"}
    assert "speedup vs AR" in final[NUMBERS] and os.path.exists(final[TRACE])
    replayed = list(c.submit(api_name="/replay"))                   # the same session's runs, re-animated
    assert "Replay finished" in replayed[-1][STATUS] and replayed[-1][AR_TEXT] == final[AR_TEXT]
    assert len(replayed) > 2


def test_stop_ends_the_run_and_says_so(app):
    _, target, draft, client = app
    c = client()
    job = c.submit(*args(target, draft, decoders=("ar", "sd", "mirror"), max_new=480), api_name="/run")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        outs = job.outputs()
        if any(isinstance(o[AR_TOKENS], list) and o[AR_TOKENS] for o in outs):
            break
        time.sleep(0.05)
    stopped = c.predict(api_name="/stop")
    assert "Stopped" in stopped[STATUS]
    deadline = time.monotonic() + 30
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.done() and "Stopped" in job.outputs()[-1][STATUS]
    committed = len(stopped[AR_TOKENS]) + len(stopped[SD_TOKENS] or []) + len(stopped[MIRROR_TOKENS] or [])
    assert committed < 3 * 480


def test_two_users_queue_without_seeing_each_other(app):
    _, target, draft, client = app
    a, b = client(), client()
    job_a = a.submit(*args(target, draft, "1, 2, 3", ("ar",), 16), api_name="/run")
    job_b = b.submit(*args(target, draft, "5, 6", ("mirror",), 16), api_name="/run")
    out_a, out_b = list(job_a)[-1], list(job_b)[-1]
    assert "Done" in out_a[STATUS] and "Done" in out_b[STATUS]
    assert out_a[AR_TOKENS] and not out_a[MIRROR_TOKENS]
    assert out_b[MIRROR_TOKENS] and not out_b[AR_TOKENS]


def test_bad_settings_and_models_show_a_readable_error_and_the_app_keeps_serving(app, tmp_path):
    _, target, draft, client = app
    c = client()
    bad = c.submit(*args(str(tmp_path / "nope"), draft), api_name="/run")
    assert "**Error:**" in list(bad)[-1][STATUS]
    deep_exit = list(c.submit("1, 2", target, draft, ["mirror"], 3, 2, 9, 0.0, 0, 1.0, "exact", 8, 0,
                              api_name="/run"))[-1]                           # ℓ_e = 9 on a 4-layer target
    assert "exit layer must be in 1..3" in deep_exit[STATUS]
    no_ids = list(c.submit("hello", target, draft, ["ar"], 3, 2, 0, 0.0, 0, 1.0, "exact", 8, 0, api_name="/run"))[-1]
    assert "no tokenizer" in no_ids[STATUS]
    ok = list(c.submit(*args(target, draft, decoders=("ar",), max_new=4), api_name="/run"))[-1]
    assert "Done" in ok[STATUS] and len(ok[AR_TOKENS]) == 4


def test_page_explains_a_missing_default_pair(tmp_path):
    demo = build_demo(EngineLoader(LANES), default_presets(str(tmp_path)), [])
    texts = [b.value for b in demo.blocks.values() if isinstance(getattr(b, "value", None), str)]
    assert any("No model pair available yet" in t and "--target" in t for t in texts)


def test_app_py_starts_without_models_prints_its_url_and_serves(tmp_path):
    """`python app.py` with no usable pair still serves the page (the banner/Run say what to do)."""
    port = _free_port()
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
            "import ui, app, ui.layout, ui.streaming, ui.plots\n"
            "assert not any(t.name == 'mirror-target-lane' for t in __import__('threading').enumerate())\n"
            "print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr[-2000:]
