"""Headless Debian chromium driven over the DevTools protocol (standard library only), for the browser test and
scripts/page_cost.py.

Chromium is spoken to on `--remote-debugging-pipe` (JSON messages on fds 3/4): `--dump-dom
--virtual-time-budget` alone cannot wait for a streamed run, because virtual time races ahead of the
server. DevTools events (e.g. Network.dataReceived) are kept in `Chromium.events`.
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
import tempfile
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", "--window-size=1280,800")  # the first screen the page is designed for
PAGE_STATE_JS = """JSON.stringify({
  status: document.getElementById("mirror-status")?.innerText || "",
  tokens: document.querySelectorAll("#mirror-tokens-mirror .mirror-tok").length,
  arTokens: document.querySelectorAll("#mirror-tokens-ar .mirror-tok").length,
  plots: ["race", "steps", "gantt", "accept"].map(
      name => document.querySelectorAll(".mirror-plot-" + name + " canvas").length),
  spans: document.querySelector(".mirror-plot-gantt")?.dataset.painted | 0,
  racePoints: (document.querySelector(".mirror-plot-race")?.dataset.points || "").split(",").filter(Boolean).map(Number),
  alpha: JSON.parse(document.querySelector(".mirror-plot-accept")?.dataset.alpha || "{}"),
  tauRow: [...document.querySelectorAll("#mirror-numbers tr")].filter(r => r.querySelector("th")?.innerText === "τ(γ) from α_i")
      .flatMap(r => [...r.querySelectorAll("td:not(.mirror-def)")].map(td => td.innerText)),
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
        self.events: list[dict] = []  # DevTools events (no id), in arrival order

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline, method)
            if "id" not in reply:
                self.events.append(reply)
            elif reply.get("id") == self._id:
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

    def screenshot(self, path: str, first_screen: bool = False) -> None:
        """A PNG of the whole page, 1400 px wide; `first_screen`: only what the window shows at the top (1280x800,
        FLAGS' window: the screen a visitor sees first, as the README shows it)."""
        if first_screen:
            self.evaluate("window.scrollTo(0, 0)")
            time.sleep(0.5)
            data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        else:
            height = self.evaluate("document.documentElement.scrollHeight") or 2000
            self.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": int(height),
                                                             "deviceScaleFactor": 1, "mobile": False})
            time.sleep(1.0)  # let plotly re-layout at the new size
            data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def cpu_seconds(self) -> float:
        """User + system CPU time of chromium and all its processes so far."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for q in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += sum(q.cpu_times()[:2])
        return total

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


def wait_for(browser: Chromium, done, timeout: float, poll: float = 0.5) -> dict:
    deadline, state = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        state = json.loads(browser.evaluate(PAGE_STATE_JS) or "{}")
        if done(state):
            return state
        if "Error" in state.get("status", ""):
            raise AssertionError(f"the page shows an error: {state['status']}")
        time.sleep(poll)
    raise AssertionError(f"page did not reach the expected state in {timeout:.0f} s: {state}")


# The first-visit tour (ui/learn/tour.py) opens in a corner of a fresh profile's page; screenshots close it first.
CLOSE_TOUR_JS = """(() => {
  try { localStorage.setItem('mirror-tour-seen', '1'); } catch (e) {}
  const b = document.querySelector("#mirror-tour-panel [data-go='0']");
  if (b) b.click();
})()"""
SET_PROMPT_JS = """(() => {
  const box = document.querySelector("#mirror-prompt textarea");
  box.value = %s;
  box.dispatchEvent(new Event("input", {bubbles: true}));
})()"""


def press_run(browser: Chromium, tries: int = 10, before: str | None = None) -> None:
    """Click Run until the status line changes (a click before the page is wired up is lost)."""
    for _ in range(tries):
        browser.evaluate('document.getElementById("mirror-run").click()')
        try:
            wait_for(browser, lambda s: s.get("status") != before if before is not None
                     else "press" not in s.get("status", "press"), 3, poll=0.05)
            return
        except AssertionError:
            continue
    raise AssertionError("pressing Run did not start a run")


def run_once(url: str, screenshot: str | None = None, prompt: str | None = None, timeout: float = 60) -> dict:
    """Open the page, (type a prompt,) press Run, wait for the run to finish, (capture the first screen: the README's
    screenshot); returns the page state."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = Chromium(CHROMIUM, profile)
        try:
            browser.open(url)
            first = wait_for(browser, lambda s: "press" in s.get("status", "")  # the page as it opens, rendered
                             and max(s["top"].values()) < 1e9, 45)
            time.sleep(1.0)  # the tour opens 0.8 s after load
            browser.evaluate(CLOSE_TOUR_JS)
            if prompt is not None:
                browser.evaluate(SET_PROMPT_JS % json.dumps(prompt))
                time.sleep(0.5)
            press_run(browser)
            state = wait_for(browser, lambda s: "Done" in s["status"] and all(s["plots"]) and s["tokens"] > 0,
                             timeout)
            if screenshot:
                time.sleep(1.0)  # the replay's last frame and the plots' legend
                browser.screenshot(screenshot, first_screen=True)
            return {**state, "first_top": first["top"]}
        finally:
            browser.close()


OPEN_KNOBS_JS = """(() => {
  if (!document.querySelector("#mirror-max-new-tokens input")) document.querySelector("#mirror-knobs .label-wrap").click();
})()"""
FOCUS_INPUT_JS = """(() => {
  const box = document.querySelector(%s);
  if (!box) return "";
  if (box.type === "checkbox") { if (box.checked !== %s) box.click(); return "checkbox"; }
  box.focus();
  box.value = %s;
  box.dispatchEvent(new Event("input", {bubbles: true}));
  box.blur();
  return box.value;
})()"""
# Installed once the page is up: long main-thread tasks (Long Tasks API) and, per decoder column, every distinct
# count of token spans the page showed (a "visible update" of that stream).
INSTRUMENT_JS = """(() => {
  if (window.__mirror) return;
  const m = window.__mirror = {long: [], updates: {}};
  new PerformanceObserver((list) => { for (const e of list.getEntries()) m.long.push([e.startTime, e.duration]); })
      .observe({type: "longtask"});
  for (const d of ["ar", "mirror", "sd"]) {
    const el = document.getElementById("mirror-tokens-" + d);
    const u = m.updates[d] = [];
    if (el) new MutationObserver(() => {
      const n = el.querySelectorAll(".mirror-tok").length;
      if (!u.length || u[u.length - 1][1] !== n) u.push([performance.now(), n]);
    }).observe(el, {childList: true, subtree: true, characterData: true});
  }
})()"""
MARK_JS = """JSON.stringify({now: performance.now(), long: window.__mirror.long,
  updates: window.__mirror.updates})"""


UNTICK_SD_JS = """(() => {
  const box = [...document.querySelectorAll("label")].find(l => l.textContent.trim() === "Vanilla SD");
  const input = box && box.querySelector("input[type=checkbox]");
  if (input && input.checked) input.click();
  return input ? input.checked : null;
})()"""  # AR and Mirror-SD only: the 900-token measurements (tests/test_ui_browser.py, scripts/page_tasks.py)


@contextlib.contextmanager
def toy_pair_page(load=None):
    """The embedded toy pair (assets/default_pair) served on the app's own lanes in this process, its page open in
    headless Chromium (1280x800, instruments on, tour closed): yields (browser, the page's state as it opened).
    `load`: the loader's (e.g. testing.reliability.WatchedLoad); MirrorEngine.load when None."""
    from mirror_core import MirrorEngine, auto_lanes
    from testing.net import free_port
    from testing.reliability import close_demo
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    loader = EngineLoader(auto_lanes(), load=load or MirrorEngine.load)
    presets = default_presets(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                                           "default_pair"))
    demo = build_demo(loader, presets, ["The quick brown fox"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    browser = None
    try:
        loader.get(presets[0].target, presets[0].draft)
        browser = Chromium(CHROMIUM, tempfile.mkdtemp(prefix="mirror-chromium-"))
        yield browser, open_page(browser, url)
    finally:
        if browser is not None:
            browser.close()
        close_demo(demo)
        loader.close()


def set_control(browser: Chromium, elem_id: str, value) -> None:
    """Type a value into one of the page's knobs (opening the accordion they live in)."""
    browser.evaluate(OPEN_KNOBS_JS)
    selector = json.dumps(f"#{elem_id} input")
    deadline = time.monotonic() + 10
    script = FOCUS_INPUT_JS % (selector, json.dumps(bool(value)), json.dumps(str(value)))
    while browser.evaluate(script) not in ("checkbox", str(value)) or (
            time.sleep(0.5) or browser.evaluate(f"document.querySelector({selector}).value") not in ("on", str(value))):
        if time.monotonic() > deadline:  # (a field that has just been rendered may reset itself once)
            raise AssertionError(f"could not set #{elem_id} to {value}")
        time.sleep(0.2)


OPEN_LIST_JS = """(() => {
  const input = document.querySelector(%s + " input");
  if (!input) return "";
  if (input.getAttribute("aria-expanded") !== "true") {
    input.dispatchEvent(new MouseEvent("mousedown", {bubbles: true}));
    input.focus();
  }
  const items = [...document.querySelectorAll("#" + input.getAttribute("aria-controls") + " li.item")];
  return JSON.stringify(items.map(li => li.getAttribute("aria-label")));
})()"""
CHOOSE_JS = """(() => {
  const input = document.querySelector(%s + " input");
  const item = [...document.querySelectorAll("#" + input.getAttribute("aria-controls") + " li.item")]
      .find(li => li.getAttribute("aria-label") === %s);
  if (item) item.dispatchEvent(new MouseEvent("mousedown", {bubbles: true}));
  return !!item;
})()"""


def options(browser: Chromium, elem_id: str) -> list[str]:
    """The labels of a dropdown's options: its list opened (it renders a frame after the click) and read."""
    selector = json.dumps(f"#{elem_id}")
    deadline = time.monotonic() + 10
    while not (found := json.loads(browser.evaluate(OPEN_LIST_JS % selector) or "[]")):
        if time.monotonic() > deadline:
            raise AssertionError(f"#{elem_id}'s list did not open")
        time.sleep(0.2)
    return found


def pick_option(browser: Chromium, elem_id: str, label: str) -> None:
    """Choose the option shown as `label` in one of the page's dropdowns, then leave it (the choice is sent)."""
    if label not in options(browser, elem_id):
        raise AssertionError(f"#{elem_id} offers no {label!r}")
    browser.evaluate(CHOOSE_JS % (json.dumps(f"#{elem_id}"), json.dumps(label)))
    time.sleep(0.3)
    browser.evaluate(f"document.querySelector({json.dumps(f'#{elem_id} input')}).blur()")
    time.sleep(0.3)


def open_page(browser: Chromium, url: str, close_tour: bool = True) -> dict:
    """Open the app, wait until it is rendered, turn on network events and the page instruments; by default close
    the first-visit tour (measurements are of the page as a returning visitor sees it)."""
    browser.open(url)
    browser.send("Network.enable")
    first = wait_for(browser, lambda s: "press" in s.get("status", "") and max(s["top"].values()) < 1e9, 45)
    if close_tour:
        time.sleep(1.0)  # the tour opens 0.8 s after load
        browser.evaluate(CLOSE_TOUR_JS)
    browser.evaluate(INSTRUMENT_JS)
    return first


def measured_run(browser: Chromium, timeout: float = 300, stop_after_tokens: int | None = None) -> dict:
    """Press Run and wait for Done (or press Stop once the Mirror-SD column shows `stop_after_tokens` tokens).

    Returns: bytes the page received during the run (DevTools Network.dataReceived), the longest main-thread
    task (ms), the visible updates per stream, the final page state, for a stop the seconds from the
    click on Stop until the status says Stopped, and the browser's CPU use during the run (cores).
    """
    mark = json.loads(browser.evaluate(MARK_JS))
    first_event = len(browser.events)
    cpu0, t0 = browser.cpu_seconds(), time.monotonic()
    press_run(browser, before=json.loads(browser.evaluate(PAGE_STATE_JS))["status"])
    wait_for(browser, lambda s: "Timing" in s["status"], 60, poll=0.05)
    stop_s = None
    if stop_after_tokens is not None:
        wait_for(browser, lambda s: s["tokens"] >= stop_after_tokens, timeout, poll=0.05)
        t = time.monotonic()
        browser.evaluate('document.getElementById("mirror-stop").click()')
        state = wait_for(browser, lambda s: "Stopped" in s["status"], 30, poll=0.02)
        stop_s = time.monotonic() - t
    else:
        state = wait_for(browser, lambda s: "Done" in s["status"], timeout)
    cpu = browser.cpu_seconds() - cpu0
    wall = time.monotonic() - t0
    time.sleep(1.0)  # the last draws (the plots pace themselves)
    end = json.loads(browser.evaluate(MARK_JS))
    state = json.loads(browser.evaluate(PAGE_STATE_JS))
    received = sum(e["params"].get("dataLength", 0) for e in browser.events[first_event:]
                   if e.get("method") == "Network.dataReceived")
    long = [d for t, d in end["long"] if t >= mark["now"]]
    updates = {d: len([u for u in us if u[0] >= mark["now"]]) for d, us in end["updates"].items()}
    return {"bytes": received, "longest_task_ms": max(long, default=0.0), "long_tasks": len(long),
            "updates": updates, "state": state, "stop_s": stop_s, "browser_cpu": cpu / wall}


LEARN_FROM_RUN_JS = """(() => {
  const tab = [...document.querySelectorAll("button[role=tab]")].find(b => b.textContent.trim() === "Learn");
  if (tab) tab.click();
  const mine = document.querySelector("#mirror-whatif-mine");
  if (mine) mine.click();
  const note = document.querySelector("#mirror-whatif-note");
  return note ? note.innerText : "";
})()"""


def learn_screenshot(url: str, path: str, prompt: str | None = None, timeout: float = 300) -> str:
    """One run on the Run tab, then the Learn tab started from it (the what-if from the run, the step player on the
    run's first hit at phase 4); a screenshot of the Learn tab. Returns the what-if's note."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = Chromium(CHROMIUM, profile)
        try:
            browser.open(url)
            wait_for(browser, lambda s: "press" in s.get("status", "") and max(s["top"].values()) < 1e9, 45)
            time.sleep(1.0)
            browser.evaluate(CLOSE_TOUR_JS)
            if prompt is not None:
                browser.evaluate(SET_PROMPT_JS % json.dumps(prompt))
                time.sleep(0.5)
            press_run(browser)
            wait_for(browser, lambda s: "Done" in s["status"] and s["tokens"] > 0, timeout)
            note = ""
            for _ in range(40):
                note = browser.evaluate(LEARN_FROM_RUN_JS) or ""
                if note.startswith("Started from"):
                    break
                time.sleep(0.5)
            for click in ["mirror-tree-hit"] + ["mirror-player-next"] * 3:  # the first hit, at phase 4 (branches)
                browser.evaluate(f'document.getElementById("{click}").click()')
                time.sleep(1.5)
            time.sleep(1.0)
            browser.screenshot(path)
            return note
        finally:
            browser.close()


@contextlib.contextmanager
def page_without_models(tmp_path):
    """The page with no pair loaded (the Learn tab's what-if and the tour need none) and a fresh browser on it:
    yields (url, browser)."""
    from mirror_core import LaneConfig
    from testing.net import free_port
    from testing.reliability import close_demo
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    demo = build_demo(EngineLoader(LaneConfig(kind="inline")), default_presets(str(tmp_path)), [])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    browser = Chromium(CHROMIUM, tempfile.mkdtemp(prefix="mirror-chromium-"))
    try:
        yield url, browser
    finally:
        browser.close()
        close_demo(demo)


@contextlib.contextmanager
def served_pair(target: str, draft: str | None, lanes=None, examples: tuple[str, ...] = ("1, 2, 3",)):
    """The page serving one pair (loaded before the browser starts, so a test's runs are short) and a fresh headless
    chromium: yields (loader, url, browser), and closes all three. `lanes`: inline lanes on one thread each unless
    given."""
    from mirror_core import LaneConfig
    from testing.net import free_port
    from testing.reliability import close_demo
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    loader = EngineLoader(lanes or LaneConfig(kind="inline", target_threads=1, draft_threads=1))
    demo = build_demo(loader, default_presets("/nonexistent", target, draft), list(examples))
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    browser = Chromium(CHROMIUM, tempfile.mkdtemp(prefix="mirror-chromium-"))
    try:
        loader.get(target, draft)
        yield loader, url, browser
    finally:
        browser.close()
        close_demo(demo)
        loader.close()
