"""End to end in headless Debian chromium: load the page, press Run, wait for tokens and plots, screenshot.

Chromium is driven over the DevTools protocol on `--remote-debugging-pipe` (JSON messages on fds 3/4,
standard library only): `--dump-dom --virtual-time-budget` alone cannot wait for a streamed run,
because virtual time races ahead of the server. Skipped when chromium is not installed.

    python tests/test_ui_browser.py URL OUT.png [PROMPT]   # screenshot of a running app after one run
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", "--window-size=1280,800")  # the first screen the page is designed for
PAGE_STATE_JS = """JSON.stringify({
  status: document.getElementById("mirror-status")?.innerText || "",
  tokens: document.querySelectorAll("#mirror-tokens-mirror .mirror-tok").length,
  arTokens: document.querySelectorAll("#mirror-tokens-ar .mirror-tok").length,
  plots: ["mirror-race", "mirror-steps", "mirror-gantt", "mirror-accept"].map(
      id => document.querySelectorAll("#" + id + " .main-svg").length),
  bars: document.querySelectorAll("#mirror-gantt .bars path, #mirror-gantt .point path").length,
  top: Object.fromEntries(["mirror-status", "mirror-run", "mirror-tokens-ar", "mirror-tokens-mirror"].map(
      id => [id, (document.getElementById(id)?.getBoundingClientRect().top ?? 1e9) + window.scrollY])),
})"""


class Chromium:
    """A headless chromium with one page, spoken to over the DevTools pipe."""

    def __init__(self, exe: str, user_data_dir: str):
        cmd_read, self._cmd = _high(os.pipe())   # we write commands; chromium reads them on its fd 3
        self._res, res_write = _high(os.pipe())  # chromium writes replies on its fd 4
        shell = f'exec "$0" "$@" 3<&{cmd_read} 4>&{res_write}'  # the pipe's fixed fds, without a preexec_fn
        self.proc = subprocess.Popen(["bash", "-c", shell, exe, *FLAGS, f"--user-data-dir={user_data_dir}",
                                      "about:blank"], pass_fds=(cmd_read, res_write),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_read)
        os.close(res_write)
        self._id, self._buf, self.session = 0, b"", None

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float, method: str) -> dict:
        while b"\0" not in self._buf:
            if not select.select([self._res], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"no reply to {method}")
            chunk = os.read(self._res, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def evaluate(self, expression: str):
        return self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def screenshot(self, path: str) -> None:
        height = self.evaluate("document.documentElement.scrollHeight") or 2000
        self.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": int(height), "deviceScaleFactor": 1,
                                                         "mobile": False})
        time.sleep(1.0)  # let plotly re-layout at the new size
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):  # already gone
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._cmd)
        os.close(self._res)


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """Move a pipe's fds to numbers >= 10 so that redirecting onto fds 3 and 4 cannot clobber them."""
    out = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return out


def wait_for(browser: Chromium, done, timeout: float) -> dict:
    deadline, state = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        state = json.loads(browser.evaluate(PAGE_STATE_JS) or "{}")
        if done(state):
            return state
        if "Error" in state.get("status", ""):
            raise AssertionError(f"the page shows an error: {state['status']}")
        time.sleep(0.5)
    raise AssertionError(f"page did not reach the expected state in {timeout:.0f} s: {state}")


SET_PROMPT_JS = """(() => {
  const box = document.querySelector("#mirror-prompt textarea");
  box.value = %s;
  box.dispatchEvent(new Event("input", {bubbles: true}));
})()"""


def press_run(browser: Chromium, tries: int = 10) -> None:
    """Click Run until the status line changes (a click before the page is wired up is lost)."""
    for _ in range(tries):
        browser.evaluate('document.getElementById("mirror-run").click()')
        try:
            wait_for(browser, lambda s: "press" not in s.get("status", "press"), 3)
            return
        except AssertionError:
            continue
    raise AssertionError("pressing Run did not start a run")


def run_once(url: str, screenshot: str | None = None, prompt: str | None = None, timeout: float = 60) -> dict:
    """Open the page, (type a prompt,) press Run, wait for the run to finish; returns the page state."""
    with tempfile.TemporaryDirectory() as profile:
        browser = Chromium(CHROMIUM, profile)
        try:
            browser.open(url)
            first = wait_for(browser, lambda s: "press" in s.get("status", "")  # the page as it opens, rendered
                             and max(s["top"].values()) < 1e9, 45)
            if prompt is not None:
                browser.evaluate(SET_PROMPT_JS % json.dumps(prompt))
                time.sleep(0.5)
            press_run(browser)
            state = wait_for(browser, lambda s: "Done" in s["status"] and all(s["plots"]) and s["tokens"] > 0,
                             timeout)
            if screenshot:
                browser.screenshot(screenshot)
            return {**state, "first_top": first["top"]}
        finally:
            browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_page_runs_a_generation_and_shows_tokens_and_plots(pair_root, tmp_path):
    from mirror_core import LaneConfig
    from testing.toy_models import build_pair
    from ui import CSS, EngineLoader, build_demo, default_presets

    target, draft = build_pair(pair_root, "llama")
    loader = EngineLoader(LaneConfig(kind="inline", target_threads=1, draft_threads=1))
    demo = build_demo(loader, default_presets(str(tmp_path), target, draft), ["1, 2, 3"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=_free_port(), quiet=True, css=CSS)
    try:
        loader.get(target, draft)  # load before the browser starts, so the run itself is short
        shot = str(tmp_path / "page.png")
        state = run_once(url, shot)
        assert state["tokens"] > 0 and state["arTokens"] > 0
        assert state["bars"] > 0                                   # the Gantt drew its spans
        assert os.path.getsize(shot) > 20_000
        top = state["first_top"]  # page y of each element as the page opens, in a 1280x800 window
        assert top["mirror-status"] < 800 and top["mirror-tokens-ar"] < 800, top  # status and streams: first screen
    finally:
        demo.close()
        loader.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":  # python tests/test_ui_browser.py URL OUT.png [PROMPT]
    print(run_once(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, timeout=300))
