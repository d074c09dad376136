"""The page measures what it shows, in headless chromium: the default comparison's Mirror ÷ AR on the page agrees with
the same comparison through the API with no browser (live plots on or off), the page holds still while a decoder is
timed, a provisional verdict comes after the first repeat, the first token shows within 0.3 s of the engine's, the
noise clause follows the repeats on the page; the step player steps; the accelerator view gives the paper's ordering
or names the term against it; a stopped load keeps the working pair.

Skipped when chromium is not installed (CI installs it: .ci/run); the agreement test also needs the default pair's
prepared target (as tests/test_real_pair.py), and is a failure without it under CI."""
from __future__ import annotations

import html
import json
import os
import re
import statistics
import threading
import time

import pytest

from testing.browser import (CHROMIUM, MARK_JS, PAGE_STATE_JS, Chromium, open_page, page_without_models, press_run,
                             set_control, wait_for)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLACK = 0.15          # the page's Mirror ÷ AR may lie this far (relative) outside the API's range on a shared machine:
                      # the drawing this guards against cost 40 % (live plots on: 0.81× on the page, 1.36× without)
FIRST_TOKEN_S = 0.3   # the first token on the page at most this long after the engine stamped it
VERDICT = re.compile(r"Mirror-SD ([0-9.]+)× AR.*?\[([0-9.]+)–([0-9.]+)× over (\d) repeats")


def _ratios(verdict_html: str) -> tuple[list[float], str]:
    """The three repeats' Mirror ÷ AR from a verdict (its lowest, middle and highest), and its text."""
    text = html.unescape(re.sub("<[^>]+>", " ", verdict_html))
    found = VERDICT.search(text)
    assert found and found.group(4) == "3", text
    middle, lo, hi = (float(x) for x in found.groups()[:3])
    return [lo, middle, hi], text


@pytest.fixture(scope="module")
def real_page():
    """The default pair on the app's own lanes, served in this process (its load timed as app.py's), its page open."""
    from mirror_core import MirrorError, auto_lanes
    from mirror_core.models.pairs import REAL_FEATURE_DRAFT, REAL_TARGET
    from mirror_core.models.prepared import resolve_source
    from testing.net import free_port
    from testing.reliability import close_demo
    from ui import LAUNCH, EngineLoader, build_demo, default_presets, load_examples

    try:
        target = resolve_source(REAL_TARGET)
    except MirrorError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot prepare {REAL_TARGET}: {exc}")
    loader = EngineLoader(auto_lanes())
    presets = default_presets(os.path.join(ROOT, "assets", "default_pair"), real=(REAL_TARGET, REAL_FEATURE_DRAFT))
    examples = load_examples(os.path.join(ROOT, "assets", "examples.json"))
    demo = build_demo(loader, presets, examples)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    browser = Chromium(CHROMIUM, f"/tmp/mirror-chromium-measure-{os.getpid()}")
    try:
        loader.get(REAL_TARGET, REAL_FEATURE_DRAFT)
        open_page(browser, url)
        yield url, browser, (REAL_TARGET, REAL_FEATURE_DRAFT), examples[0], target
    finally:
        browser.close()
        close_demo(demo)
        loader.close()


def _api(url: str, pair, prompt: str, **over) -> str:
    from gradio_client import Client

    from testing.reliability import page_values, run_args
    from ui.settings import DEFAULTS
    from ui.views import by_name

    values = page_values(**{"prompt": prompt, "target": pair[0], "draft": pair[1], "repeats": DEFAULTS["repeats"], **over})
    return by_name(Client(url, verbose=False).predict(*run_args(values), api_name="/run"))["verdict"]


def _page_run(browser: Chromium) -> dict:
    """Press Run with the page's defaults and follow it to Done: whether a provisional verdict showed, each
    column's visible updates (ui: testing/browser.py INSTRUMENT_JS) and the page's clock against this process's."""
    mark = json.loads(browser.evaluate(MARK_JS))
    press_run(browser, before=json.loads(browser.evaluate(PAGE_STATE_JS))["status"])
    provisional = timing = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = browser.evaluate('document.getElementById("mirror-status").innerText') or ""
        verdict = browser.evaluate('document.getElementById("mirror-verdict").innerText') or ""
        provisional, timing = provisional or "Provisional" in verdict, timing or "Timing" in status
        if (timing and "Done" in status) or "Error" in status:  # (the last run's "Done" shows until this one starts)
            break
        time.sleep(0.5)
    assert "Done" in status, status
    time.sleep(1.0)
    end = json.loads(browser.evaluate(MARK_JS))
    t0 = time.perf_counter()
    now = browser.evaluate("performance.now()")
    offset = (t0 + time.perf_counter()) / 2 - now / 1e3  # this process's clock (the engine's) − the page's
    updates = {d: [(t / 1e3 + offset, n) for t, n in us if t >= mark["now"]] for d, us in end["updates"].items()}
    return {"provisional": provisional, "updates": updates, "status": status,
            "verdict": browser.evaluate('document.getElementById("mirror-verdict").innerHTML')}


def test_the_pages_mirror_over_ar_agrees_with_the_apis_and_the_page_holds_still_while_it_times(real_page,
                                                                                                monkeypatch):
    """API, page (live plots on), API, page (live plots off), API, on the default prompt with the defaults (3
    repeats): each page's Mirror ÷ AR (the middle repeat) lies within the API's repeats (± SLACK); while a decoder
    is timed its column changes twice (its first token, then the whole run); a provisional verdict shows after the
    first repeat; the first AR token shows within FIRST_TOKEN_S of the engine's; the noise clause is said exactly
    when the page's three repeats hold 1× in their middle half."""
    from mirror_core import TokenEvent
    from ui import session as ui_session
    from ui.verdict import noise_note

    url, browser, pair, prompt, _ = real_page
    firsts: list[tuple[str, float]] = []  # (decoder, the engine's stamp of its first token), every run in order
    add = ui_session.DecoderRun.add

    def recording(self, event):
        if isinstance(event, TokenEvent) and event.index == 0:
            firsts.append((self.decoder, event.t))
        add(self, event)

    monkeypatch.setattr(ui_session.DecoderRun, "add", recording)
    _api(url, pair, prompt, repeats=1)  # untimed: whatever a first comparison after the load pays (kernels, caches)
    api, pages = [], {}
    api.append(_ratios(_api(url, pair, prompt))[0])
    for live in (True, False):
        set_control(browser, "mirror-live-plots", live)
        del firsts[:]
        pages[live] = _page_run(browser)
        if live:
            engine_first = firsts[0][1]  # the first repeat's AR run (AR runs first)
        api.append(_ratios(_api(url, pair, prompt))[0])
    lo, hi = min(min(r) for r in api), max(max(r) for r in api)
    for live, page in pages.items():
        ratios, text = _ratios(page["verdict"])
        print(f"live plots {live}: page {ratios}, API {api}")  # -s: the figures
        assert lo * (1 - SLACK) <= ratios[1] <= hi * (1 + SLACK), (live, ratios, api)
        assert page["provisional"], "no provisional verdict while the repeats ran"
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")  # of the figures as the page rounds them
        if min(abs(q1 - 1), abs(q3 - 1)) > 0.01:  # else the page's unrounded quartile may lie either side of 1×
            assert ("timing noise" in text) == bool(noise_note(ratios)), (ratios, text)
        assert "the page drawing nothing while it ran" in text
    calm = pages[False]["updates"]  # live plots off: no replay at the end, so every update came while timing
    for d in ("ar", "mirror", "sd"):
        shown = [n for _, n in calm[d] if n > 0]
        assert len(shown) <= 2 * 3, (d, calm[d])  # a first token and a whole run per repeat, nothing in between
    page_first = next(t for t, n in pages[True]["updates"]["ar"] if n >= 1)
    assert page_first - engine_first <= FIRST_TOKEN_S, page_first - engine_first


PLAYER_JS = """(() => {
  const tab = [...document.querySelectorAll("button[role=tab]")].find(b => b.textContent.trim() === "Learn");
  if (tab && tab.getAttribute("aria-selected") !== "true") tab.click();
  const click = %s;
  if (click) { const b = document.getElementById(click); if (b) b.click(); }
  const head = [...document.querySelectorAll("#mirror-player p.mirror-def")].find(p => / phase \d+ of /.test(p.innerText));
  const slider = document.querySelector("#mirror-player-phase input[type=number]");
  return JSON.stringify({head: head ? head.innerText : "", phase: slider ? Number(slider.value) : 0});
})()"""


def _player(browser: Chromium, click: str | None = None) -> dict:
    return json.loads(browser.evaluate(PLAYER_JS % json.dumps(click)) or "{}")


def _settled(browser: Chromium, want) -> dict:
    state, deadline = _player(browser), time.monotonic() + 10
    while not want(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _player(browser)
    return state


def test_the_step_player_steps_one_phase_plays_and_pauses(tmp_path):
    """The recorded example, before any run: Next ▶ and ◀ Back move exactly one phase and nothing plays by itself;
    Play plays on, Pause stops; the header counts the phases it names."""
    with page_without_models(tmp_path) as (url, browser):
        open_page(browser, url)
        first = _settled(browser, lambda s: s["phase"] == 1 and "phase 1 of" in s["head"])
        names = first["head"].split(":", 1)[1].split("→")  # the trail: each phase's name, arrows between them
        assert f"phase 1 of {len(names)}" in first["head"], first  # counts the phases it names
        _player(browser, "mirror-player-next")
        after = _settled(browser, lambda s: s["phase"] == 2 and "phase 2 of" in s["head"])
        assert after["phase"] == 2 and f"phase 2 of {len(names)}" in after["head"], after
        time.sleep(3.0)  # longer than two phases at the default speed: Next does not play
        assert _player(browser)["phase"] == 2
        _player(browser, "mirror-player-back")
        assert _settled(browser, lambda s: s["phase"] == 1)["phase"] == 1
        _player(browser, "mirror-player-play")
        playing = _settled(browser, lambda s: s["phase"] >= 3)
        assert playing["phase"] >= 3, playing  # Play goes on by itself (1 s a phase)
        _player(browser, "mirror-player-pause")
        time.sleep(0.5)
        paused = _player(browser)["phase"]
        time.sleep(2.5)
        assert _player(browser)["phase"] == paused  # Pause stopped it


CURVE_JS = """(() => {
  const tab = [...document.querySelectorAll("button[role=tab]")].find(b => b.textContent.trim() === "Learn");
  if (tab && tab.getAttribute("aria-selected") !== "true") tab.click();
  const box = document.querySelector('#mirror-curve-switch input[type=checkbox]');
  if (%s && box && !box.checked) box.click();
  const text = document.querySelector('#mirror-curve-text'), data = document.querySelector('#mirror-curve-data');
  return JSON.stringify({text: text ? text.innerText : "", data: data ? JSON.parse(data.dataset.curve) : null});
})()"""


def test_the_accelerator_view_moves_the_draft_and_orders_mirror_sd_above_sd_or_names_the_term(tmp_path):
    """The curve's switch on the recorded example: the window at one step, the readout and branch batch moved with
    it (listed as modelled, the kept terms listed), and Mirror-SD ≥ vanilla SD there, or the term against it named."""
    with page_without_models(tmp_path) as (url, browser):
        open_page(browser, url)
        state, deadline = json.loads(browser.evaluate(CURVE_JS % "false")), time.monotonic() + 20
        while state["data"] is None and time.monotonic() < deadline:  # the Learn tab drawn, its switch wired
            time.sleep(0.25)
            state = json.loads(browser.evaluate(CURVE_JS % "false"))
        time.sleep(1.0)
        while not state["data"].get("accelerator") and time.monotonic() < deadline:
            state = json.loads(browser.evaluate(CURVE_JS % "true"))  # (ticks the box when it is not ticked)
            time.sleep(0.5)
        here, text = state["data"]["here"], state["text"]
        assert here["verify"] == 1.0 and "the branch batch ≤ one fresh rollout" in text, state
        assert "kept as the knobs give them" in text and "the draft's time per token" in text
        if here["mirror"] >= here["sd"]:
            assert "the paper's ordering" in text and "≥ vanilla SD" in text, text
        else:
            assert "the largest term that prevents it" in text, text


TARGET_JS = """(() => { const box = document.querySelector("#mirror-target textarea, #mirror-target input");
  if (%s !== null) { box.value = %s; box.dispatchEvent(new Event("input", {bubbles: true})); }
  return box.value; })()"""


def _target(browser: Chromium, value: str | None = None) -> str:
    """The Target box's text (typed first when `value` is given)."""
    shown = browser.evaluate(TARGET_JS % (json.dumps(value), json.dumps(value)))
    if value is not None:
        time.sleep(0.5)
    return shown


def test_a_stopped_load_keeps_the_working_pair(tmp_path, monkeypatch):
    """The toy pair loaded; Run with another pair (the same folders by another path, so that it loads afresh), Stop
    while it loads: the status says the loaded pair stays, the stopped load ends in the background and is dropped,
    and a Run on the working pair starts at once, without loading it again."""
    # Room for both pairs, as on a machine with memory to spare: the loader's check counts this test's Chromium (a
    # child of this process) as the app's, and on a shared machine it closed the working pair before the new load.
    monkeypatch.setattr("ui.loader._room_for_both", lambda: True)
    from mirror_core import LaneConfig, MirrorEngine
    from testing.net import free_port
    from testing.reliability import close_demo
    from ui import LAUNCH, EngineLoader, build_demo, default_presets

    loads: list[str] = []              # the targets loaded, in order
    release = threading.Event()        # the other pair's load lasts until Stop has been seen (on any CPU)

    def slow_load(target, draft, lanes):  # the other pair takes a while to load (the real one: about 13 s)
        loads.append(target)
        if "/./" in target:
            release.wait(60)
        return MirrorEngine.load(target, draft, lanes)

    loader = EngineLoader(LaneConfig(kind="inline", target_threads=1, draft_threads=1), load=slow_load)
    presets = default_presets(os.path.join(ROOT, "assets", "default_pair"))
    demo = build_demo(loader, presets, ["1, 2, 3"])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **LAUNCH)
    browser = Chromium(CHROMIUM, f"/tmp/mirror-chromium-load-{os.getpid()}")
    working = (presets[0].target, presets[0].draft)
    try:
        engine = loader.get(*working)
        open_page(browser, url)
        set_control(browser, "mirror-repeats", 1)
        shown = _target(browser)
        _target(browser, os.path.join(os.path.dirname(working[0]), ".", os.path.basename(working[0])))
        press_run(browser)
        wait_for(browser, lambda s: "Loading" in s["status"], 20, poll=0.1)
        browser.evaluate('document.getElementById("mirror-stop").click()')
        state = wait_for(browser, lambda s: "Stopped" in s["status"], 10, poll=0.1)
        assert "the pair that was loaded stays loaded" in state["status"], state
        assert loader.loaded() == working
        release.set()
        deadline = time.monotonic() + 30
        while loader.loading() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert loader.loaded() == working and loader.get(*working) is engine  # the working pair, as it was
        _target(browser, shown)
        loaded = len(loads)
        press_run(browser, before=state["status"])
        wait_for(browser, lambda s: "Done" in s["status"], 60)
        assert len(loads) == loaded, loads  # the working pair ran as it was: no reload
    finally:
        browser.close()
        close_demo(demo)
        loader.close()


SIGINT_BOUND_S = 8.0  # Ctrl-C: the process is gone within this (3-5 s measured with the client's streams ended at the
                      # signal; without that Gradio's server waited out a 5 s join for them: 8-12 s, docs/BENCHMARKS.md)


def test_ctrl_c_stops_the_app_within_eight_seconds_while_a_run_streams():
    """python app.py on the embedded pair, a long comparison through the API, then SIGINT: the run stops within a
    step (app.py stops what the loader holds before the server closes) and the process is gone within the bound."""
    import signal
    import subprocess
    import sys

    from gradio_client import Client

    from testing.net import free_port
    from testing.reliability import page_values, run_args
    from ui.views import by_name

    pair = [os.path.join("assets", "default_pair", name) for name in ("target", "draft_ar")]
    port = free_port()
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--target", pair[0], "--draft", pair[1]],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in app.stdout:
            if line.startswith(("loaded", "note:")):
                break
        threading.Thread(target=lambda: [None for _ in app.stdout], daemon=True).start()  # keep its pipe drained
        values = page_values(prompt="The quick brown fox", target=pair[0], draft=pair[1], max_new_tokens=900,
                             repeats=3)
        job = Client(f"http://127.0.0.1:{port}/", verbose=False).submit(*run_args(values), api_name="/run")
        deadline = time.monotonic() + 60  # until a decoder is timed (a fixed wait raced the load on a busy machine)
        while not any("Timing" in str(by_name(o)["status"]) for o in job.outputs()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not job.done(), "the comparison ended before the signal"
        t0 = time.monotonic()
        app.send_signal(signal.SIGINT)
        app.wait(timeout=30)
        gone_s = time.monotonic() - t0
        print(f"Ctrl-C during a timed decoder: the process gone in {gone_s:.1f} s")  # -s
        assert gone_s <= SIGINT_BOUND_S and app.returncode == 0
    finally:
        if app.poll() is None:
            app.kill()
