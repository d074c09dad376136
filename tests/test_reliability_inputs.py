"""Every row of docs/RELIABILITY.md's bad-input table, on every surface it applies to: the CLI, the Python
API and the launched app (through gradio_client). One readable line each, nothing written, the app keeps serving."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from mirror_core import MirrorEngine, Request, SpecConfig
from mirror_core.cli import main
from testing.reliability import (
    CATALOGUE,
    INLINE,
    app_run,
    app_values,
    build_models,
    cli_case,
    close_demo,
    expect_mirror_error,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(str(tmp_path_factory.mktemp("catalogue")))


@pytest.fixture(scope="module")
def engine(models):
    with MirrorEngine.load(models.tok_target, models.tok_draft, INLINE) as e:
        yield e


def _rows(surface: str):
    return [pytest.param(c, id=c.row) for c in CATALOGUE if getattr(c, surface) is not None]


@pytest.mark.parametrize("case", _rows("cli"))
def test_cli_row(case, models, tmp_path):
    assert cli_case(case, models, str(tmp_path / "trace.json")) is None


@pytest.mark.parametrize("case", _rows("api"))
def test_api_row(case, models, engine):
    assert expect_mirror_error(lambda: case.api(models, engine), case.needle) is None
    assert len(engine.generate(Request((1, 2), "mirror", 4)).token_ids) == 4  # the engine still serves


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(models, tmp_path_factory):
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    loader = EngineLoader(INLINE)
    demo = build_demo(loader, default_presets(str(tmp_path_factory.mktemp("no_pair")), models.tok_target,
                                              models.tok_draft), ["w1 w2"])
    demo.launch(prevent_thread_lock=True, server_port=_port(), quiet=True, **LAUNCH)
    try:
        yield demo.local_url
    finally:
        close_demo(demo)
        loader.close()


@pytest.mark.slow
def test_app_rows_each_give_one_readable_error_and_the_app_keeps_serving(app, models):
    from ui.views import by_name

    failures = []
    for case in CATALOGUE:
        if case.app is None:
            continue
        final = by_name(app_run(app, app_values(models, **case.app(models)), raw=case.app_raw))
        status, trace = final["status"], final["trace"]
        if not (status.startswith("**Error:**") and case.needle in status and "\n" not in status):
            failures.append((case.row, status))
        if isinstance(trace, str) or (isinstance(trace, dict) and trace.get("path")):
            failures.append((case.row, "a trace was exported for a refused request"))
    assert not failures, failures
    ok = by_name(app_run(app, app_values(models)))
    assert "Done" in ok["status"] and ok["ar_text"] and ok["ar_text"] == ok["mirror_text"]


def test_app_refuses_an_unavailable_device_at_start(capsys):
    import app as app_module

    assert app_module.main(["--target-device", "cuda:3", "--port", str(_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "not available" in err[0]


def test_invalid_utf8_bytes_on_the_command_line(models):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT, LC_ALL="C.UTF-8")
    proc = subprocess.run([sys.executable, "-m", "mirror_core", "generate", "--target", models.tok_target,
                           "--draft", models.tok_draft, "--lane", "inline", "--prompt", b"w1 \xff\xfe w2"],
                          capture_output=True, env=env, cwd=ROOT, timeout=120)
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "not valid UTF-8" in err[0], err


def test_padded_vocabularies_with_one_tokenizer_work_and_stay_lossless(models, app, capsys):
    """Row 'vocabulary sizes differ': accepted when both sides share the tokenizer (embedding tables padded)."""
    with MirrorEngine.load(models.tok_target, models.padded_draft, INLINE) as e:
        assert e.info.vocab_size == 96
        ids = e.encode("w1 w5 w9")
        ar = e.generate(Request(ids, "ar", 12, stop_at_eos=False))
        mirror = e.generate(Request(ids, "mirror", 12, spec=SpecConfig(3, 2), stop_at_eos=False))
        assert mirror.token_ids == ar.token_ids and mirror.fallback is None
    assert main(["generate", "--target", models.tok_target, "--draft", models.padded_draft, "--lane", "inline",
                 "--prompt", "w1 w5 w9", "--max-new-tokens", "6", "--json"]) == 0
    capsys.readouterr()
    from ui.views import by_name

    final = by_name(app_run(app, app_values(models, draft=models.padded_draft)))
    assert "Done" in final["status"] and final["ar_text"] == final["mirror_text"]


def test_prompt_text_checks_allow_ordinary_text():
    from mirror_core.config import check_prompt_text

    for text in ("def fib(n):\n\treturn n\r\n", "naïve café 日本語 🙂", "x" * 1000):
        assert check_prompt_text(text) == text
