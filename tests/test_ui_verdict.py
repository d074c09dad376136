"""The Run tab's verdict (ui/verdict.py) on synthetic runs with known spans, the too-short rule, one slot numbering
across the inspector, the branch tree and the step player, and no absolute server path on the page."""
from __future__ import annotations

import html
import os
import re

import pytest

from mirror_core import (
    LaneConfig,
    Request,
    RunEnd,
    RunSettings,
    RunStart,
    RunSummary,
    SpanEvent,
    SpecConfig,
    StepRecord,
    TokenEvent,
)
from ui.inspector import inspector_html
from ui.numbers import MIN_TIMED_STEPS, MIN_TIMED_TOKENS, decode_tokens_per_s, numbers_html, too_short
from ui.learn.player import player_html
from ui.render import shown_path
from ui.session import DecoderRun, Session, TokenNamer
from ui.settings import DEFAULTS
from ui.learn.tree import tree_html
from ui.verdict import EMPTY, verdict_html, verdict_text
from ui.views import ran_line

PREFILL = 0.010  # seconds, every run's prefill


def _settings(decoder: str, gamma: int, target: str = "target", draft: str = "draft", note: str = "",
              modelled: float | None = None) -> RunSettings:
    return RunSettings(request=Request((1,), decoder, spec=SpecConfig(gamma=gamma, kappa=2)),
                       lanes=LaneConfig(kind="inline"), exit_layer=2, target=target, draft=draft,
                       target_runner="FastLlamaRunner", spec_note=note, spec_modelled=modelled)


def ar(steps: int, step_s: float = 0.010) -> DecoderRun:
    """AR: a prefill token, then `steps` one-token target steps of `step_s` each."""
    run = DecoderRun("ar", TokenNamer(None))
    run.add(RunStart("ar", (1,), _settings("ar", 1), 0.0))
    t = PREFILL
    run.add(SpanEvent("target", "prefill", 0.0, t, 0))
    run.add(TokenEvent(5, 0, 0, "target", False, t))
    for i in range(1, steps + 1):
        run.add(SpanEvent("target", "target_step", t, t + step_s, i))
        t += step_s
        run.add(TokenEvent(5, i, i, "target", False, t))
    run.add(RunEnd((5,) * (steps + 1), RunSummary(1, new_tokens=steps + 1, single_steps=steps, wall_s=t,
                                                  ttft_s=PREFILL), None))
    return run


def mirror(steps: int, pre: float, readout: float, suffix: float, accept: float, decoder: str = "mirror",
           settings: RunSettings | None = None) -> DecoderRun:
    """γ = 1, every window accepted (A_t = 1, the bonus at slot 2: τ = 2), each step's stages of the given seconds."""
    run = DecoderRun(decoder, TokenNamer(None))
    run.add(RunStart(decoder, (1,), settings or _settings(decoder, 1), 0.0))
    t = PREFILL
    run.add(SpanEvent("target", "prefill", 0.0, t, 0))
    run.add(TokenEvent(5, 0, 0, "target", False, t))
    for i in range(1, steps + 1):
        for stage, seconds in (("target_prefix", pre), ("exit_readout", readout), ("target_suffix", suffix),
                               ("accept", accept)):
            run.add(SpanEvent("target", stage, t, t + seconds, i))
            t += seconds
        run.add(TokenEvent(5, 2 * i - 1, i, "accepted", i > 1, t))
        run.add(TokenEvent(6, 2 * i, i, "bonus", False, t))
        run.add(StepRecord(i, (5, 5), 1, 1, 6, 2, i > 1, True, topk_ids=((7, 8), (6, 9)),
                           topk_logprobs=((-0.1, -2.0), (-0.2, -2.5)), target_tokens=(5, 6),
                           branches=((5,), (6,), (7,), (8,)), branch_rows=((0, 7), (0, 8), (1, 6), (1, 9)),
                           branch_row=2, t_end=t))
    run.add(RunEnd((5, 6) * steps + (5,), RunSummary(1, new_tokens=2 * steps + 1, steps=steps, committed=2 * steps,
                                                     drafted=steps, accepted=steps, branched_steps=steps, hits=steps,
                                                     hist=(0, steps), pos_accepted=(steps,), pos_drafted=(steps,),
                                                     wall_s=t, ttft_s=PREFILL), None))
    return run


def session_of(*repeats: dict[str, DecoderRun]) -> Session:
    session = Session()
    for rep in repeats:
        session.history.extend(rep.values())
        session.runs.update(rep)
    return session


# 20 steps of 2 tokens against 40 AR steps of 10 ms (41 tokens each, same count): AR wall 410 ms, 100.0 tok/s.
# SD: 20 steps of 24 ms (wall 490 ms).
SD = dict(pre=0.012, readout=0.0, suffix=0.012, accept=0.0)


def test_the_verdict_says_why_mirror_sd_is_slower_with_the_arithmetic():
    # a step: 10 + 1 + 10 ms of verification (2.10 AR steps) + 1 ms acceptance = 22 ms; wall 450 ms, 91.1 tok/s
    session = session_of({"ar": ar(40), "mirror": mirror(20, 0.010, 0.001, 0.010, 0.001), "sd": mirror(20, **SD,
                                                                                                        decoder="sd")})
    text = html.unescape(verdict_html(session))
    assert ("Mirror-SD 0.91× AR (91.1 vs 100.0 tok/s) · 1.09× vanilla SD. Slower here than AR: each verification "
            "(the window of γ+1 = 2 tokens and the early-exit readout) cost 2.10 AR steps and committed 2.00 tokens (2.00 ÷ 2.10 ≈ 0.95). With the draft's waits and "
            "acceptance a whole step cost 2.20 AR steps (2.00 ÷ 2.20 ≈ 0.91 per step, the prefill aside; the latency "
            "model predicts 0.91×).") in text
    assert "mirror-slow" not in verdict_html(session) and "mirror-fast" not in verdict_html(session)  # neutral


def _above_the_fold(box: str) -> str:
    """The verdict's text a reader sees before opening its fold (the fold's summary line included)."""
    closed = re.sub(r"<details id='mirror-why-fold'><summary>(.*?)</summary>.*</details>", r" \1", box, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", closed))


def test_the_noise_meter_says_when_another_process_took_a_core_and_shows_the_spread_beside_it():
    """A run timed while other processes used more than NOISY_CORES of a core: the verdict says so under its sentence,
    with the repeats' spread of Mirror ÷ AR (or that one repeat has none); below the threshold it says nothing; the
    numbers give each run's figure with its definition; above the fold it stays within 70 words."""
    from ui.numbers import NOISY_CORES, numbers_html, spread_html

    repeats = [{"ar": ar(40), "mirror": _mirror_at(x)} for x in (0.82, 1.19, 1.02)]
    session = session_of(*repeats)
    for run in session.history:
        run.others = 0.02
    assert "mirror-noisy" not in verdict_html(session)
    repeats[1]["mirror"].others = 0.85
    box = verdict_html(session)
    said = html.unescape(re.search(r"<p class='mirror-noisy' id='mirror-noisy'>(.*?)</p>", box).group(1))
    assert said == ("Another process used 85% of a core while this was timed; the figures are not clean (Mirror ÷ AR "
                    "spread 0.82–1.19× over 3 repeats).")
    assert len(_above_the_fold(box).split()) <= 70, _above_the_fold(box)
    one = session_of({"ar": ar(40), "mirror": _mirror_at(1.1)})
    one.history[0].others = NOISY_CORES + 0.01
    assert "one repeat, no spread to judge by: raise Repeats" in html.unescape(verdict_html(one))
    table = html.unescape(numbers_html(session.runs) + spread_html(session.history))
    assert "<th>other processes</th>" in table and "2% of a core" in table and "not clean" in table
    assert "other processes (of a core)" in table and "[2% – 85%]" in table


def test_the_verdict_opens_with_one_plain_sentence_then_the_gauge_then_the_fold():
    """Whether speculation won and the one reason, in at most ~40 words; beside it each speculative decoder's
    break-even gauge (τ needed: its step in AR steps; τ got); the arithmetic and every definition in the fold."""
    from ui.gauge import break_even

    lost = {"ar": ar(40), "mirror": mirror(20, 0.010, 0.001, 0.010, 0.001), "sd": mirror(20, **SD, decoder="sd")}
    box = verdict_html(session_of(lost))
    head = html.unescape(re.search(r"<p class='mirror-headline' id='mirror-headline'>(.*?)</p>", box).group(1))
    assert head == ("Speculation lost here: Mirror-SD ran at 0.91× AR's speed (1.09× vanilla SD's speed), because each "
                    "step cost 2.20 AR steps but committed only 2.00 tokens.")
    assert len(head.split()) <= 40 and len(_above_the_fold(box).split()) <= 70, _above_the_fold(box)
    rows = {r.decoder: r for r in break_even(lost)}
    assert (rows["mirror"].needed, rows["mirror"].got) == pytest.approx((2.2, 2.0))
    assert (rows["sd"].needed, rows["sd"].got) == pytest.approx((2.4, 2.0))
    gauge = box.split("<details")[0]
    assert gauge.index("data-decoder='mirror'") < gauge.index("data-decoder='sd'") and "short by 0.20" in gauge
    assert gauge.count("mirror-gauge-short'") == 2 and "mirror-gauge-ahead'" not in gauge  # both gaps red
    fold = html.unescape(box.split("<details")[1])
    assert "Slower here than AR: each verification" in fold and "τ needed = its mean verification step ÷ T_AR" in fold
    fast = {"ar": ar(40), "mirror": mirror(20, 0.006, 0.001, 0.006, 0.001)}
    from ui.verdict import headline

    assert headline([fast]) == ("Speculation won here: Mirror-SD ran 1.41× as fast as AR, because each step committed "
                                "2.00 tokens for the time of 1.40 AR steps.")
    assert "mirror-gauge-ahead'" in verdict_html(session_of(fast))
    # vanilla SD beat AR where Mirror-SD did not: the sentence does not say speculation lost
    sd_won = {"ar": ar(40), "mirror": mirror(20, 0.010, 0.001, 0.010, 0.001),
              "sd": mirror(20, 0.005, 0.0, 0.005, 0.001, decoder="sd")}
    assert headline([sd_won]).startswith("Vanilla SD won here (1.78× AR's speed), Mirror-SD lost: it ran at 0.91× "
                                         "AR's speed, because each step cost 2.20 AR steps"), headline([sd_won])
    tie = [{"ar": ar(40), "mirror": _mirror_at(x)} for x in (0.95, 1.02, 1.05)]
    assert headline(tie).startswith("Speculation tied with AR here: Mirror-SD ran at 1.02× AR's speed, within timing")
    from dataclasses import replace as dc_replace

    slow_start = mirror(20, 0.004, 0.001, 0.004, 0.001)  # steps of 1 AR step for 2 tokens, after a 350 ms prefill
    slow_start.end = dc_replace(slow_start.end, summary=dc_replace(slow_start.end.summary, wall_s=0.6, ttft_s=0.35))
    assert headline([{"ar": ar(40), "mirror": slow_start}]) == (
        "Speculation lost here: Mirror-SD ran at 0.68× AR's speed, though each step committed 2.00 tokens for 1.00 AR "
        "steps: its prefill took 350 ms against AR's 10 ms in 41 tokens.")


def test_the_verdict_says_why_mirror_sd_is_faster_and_when_sd_beat_it():
    # a step: 6 + 1 + 6 ms of verification (1.30 AR steps) + 1 ms = 14 ms; wall 290 ms, 141.4 tok/s
    fast = mirror(20, 0.006, 0.001, 0.006, 0.001)
    text = verdict_text([{"ar": ar(40), "mirror": fast, "sd": mirror(20, 0.005, 0.0, 0.005, 0.0, decoder="sd")}])
    assert text.startswith("Mirror-SD 1.41× AR (141.4 vs 100.0 tok/s) · 0.72× vanilla SD (SD was faster). Faster "
                           "here than AR: each verification (the window of γ+1 = 2 tokens and the early-exit readout) "
                           "cost 1.30 AR steps and committed 2.00 tokens (2.00 ÷ 1.30 ≈ 1.54)."), text
    # Mirror ÷ SD's reason in the verdict, in one step's parts (no scrolling to the latency table)
    assert "Against vanilla SD a step cost 14.00 vs 10.00 ms (τ 2.00 vs 2.00: 7.00 vs 5.00 ms a token)" in text
    assert "the early-exit readout 1.00 vs 0.00 ms" in text
    assert "Tick Vanilla SD" in verdict_text([{"ar": ar(40), "mirror": fast}])  # Mirror ÷ SD only when SD ran


def test_with_repeats_the_verdict_reads_the_middle_repeat_and_gives_the_range():
    reps = [{"ar": ar(40), "mirror": mirror(20, pre, 0.001, pre, 0.001)} for pre in (0.010, 0.006, 0.008)]
    text = html.unescape(verdict_html(session_of(*reps)))
    # walls 450, 290 and 370 ms against 410: 0.91, 1.41 and 1.11×; the middle one (1.11×, 18 ms steps) is read out
    assert "Mirror-SD 1.11× AR (110.8 vs 100.0 tok/s) [0.91–1.41× over 3 repeats, the middle one shown]" in text
    assert "cost 1.70 AR steps" in text and "timing noise" not in text  # 1× is below the middle half (1.01–1.26×)


def test_within_noise_only_when_the_middle_half_of_the_repeats_holds_one():
    """One repeat touching 1× is not a tie: 0.67, 0.70 and 1.00× are slower; 0.95, 1.02 and 1.05× are not told
    apart from 1× (its interquartile range holds 1×)."""
    from ui.verdict import noise_note

    assert noise_note([0.67, 0.70, 1.00]) == "" and noise_note([1.0]) == ""
    assert "(0.98–1.04×) holds 1×" in noise_note([0.95, 1.02, 1.05]) and "timing noise" in noise_note([0.9, 1.1])


def test_runs_too_short_to_time_get_no_verdict():
    assert (MIN_TIMED_TOKENS, MIN_TIMED_STEPS) == (16, 4)  # the rule, defined once (ui/numbers.py)
    assert too_short(mirror(3, 0.01, 0.0, 0.01, 0.0)) == "7 tokens committed (fewer than 16)"
    assert too_short(ar(15)) is None and too_short(ar(14)) == "15 tokens committed (fewer than 16)"
    text = re.sub("<[^>]+>", "", html.unescape(verdict_html(session_of({"ar": ar(40),
                                                                     "mirror": mirror(3, 0.01, 0.0, 0.01, 0.0)}))))
    assert "Too short to time (Mirror-SD: 7 tokens committed (fewer than 16))" in text and "× AR" not in text
    assert "too short to time" in numbers_html({"ar": ar(6), "mirror": mirror(3, 0.01, 0.0, 0.01, 0.0)})
    assert verdict_html(Session()) == "" and "The verdict appears under this line" in EMPTY
    assert "tick both" in verdict_html(session_of({"ar": ar(40)}))


def test_decode_tokens_per_s_leaves_out_the_prefill():
    run = mirror(20, 0.010, 0.001, 0.010, 0.001)  # 41 tokens: wall 450 ms, of which 10 ms prefill
    assert decode_tokens_per_s(run.summary) == pytest.approx(40 / 0.440)
    page = numbers_html({"ar": ar(40), "mirror": run})
    row = page.split("<th>tokens/s (decode)</th>")[1].split("</tr>")[0]
    assert "<td>100.0</td><td>90.9</td>" in row and "(new tokens − 1) / (wall time − TTFT)" in row
    assert "<td>100.0</td><td>91.1</td>" in page.split("<th>tokens/s (wall)</th>")[1].split("</tr>")[0]


def test_first_run_defaults_repeat_three_times_with_vanilla_sd():
    assert DEFAULTS["repeats"] == 3 and set(DEFAULTS["decoders"]) == {"ar", "mirror", "sd"}


def test_one_slot_numbering_in_the_inspector_the_tree_and_the_player():
    run = mirror(5, 0.004, 0.001, 0.004, 0.001)  # every step: A_t = 1 of γ = 1, the bonus at slot s_t = 2
    inspected = html.unescape(inspector_html(run, 2))
    tree = html.unescape(tree_html(run, 2))
    phases = [html.unescape(player_html(run, 2, k)) for k in range(6)]
    assert "sits at slot s_t = A_t + 1 = 2" in inspected and "slot s_t = 2's candidates" in inspected
    assert "so slot s_t = A_t + 1 = 2 decides" in tree and "was a candidate at slot 2" in tree
    assert any("at slot s_t = A_t + 1 = 2:" in p for p in phases) and any("slot s_t = 2, so its branch" in p
                                                                            for p in phases)
    # the window's slots are 1..γ+1 = 1..2 in all three views, never 0
    assert re.findall(r"<td>(\d)</td><td><code>", inspected.split("Branches precomputed")[0]) == ["1", "2"]
    assert re.findall(r"slot (\d) <span", tree) == ["1", "2"]
    assert re.findall(r"slot (\d): ", next(p for p in phases if "top-κ (" in p)) == ["1", "2"]
    assert "τ =" not in inspected.split("</p>")[0] and "slot τ" not in inspected  # τ is only the mean
    # one draft token is d1, not "d1..d1"; a count of one takes the singular
    shown = " ".join([inspected, tree, *phases])
    assert "d1..d1" not in shown and not re.search(r"(?<!j − )\b1 (tokens|draft tokens|fresh tokens)\b", shown)
    assert "W = [w0, d1]" in inspected and "window d1 = " in tree and "after d1<" in tree
    assert any("branches, 1 token each" in p for p in phases) and any("of 1 draft token (" in p for p in phases)


def test_both_numbers_tables_keep_the_pages_column_order_whatever_order_the_runs_ran_in():
    """Every other repeat runs in reverse order; the shown repeat's table and the spread table both go AR, Mirror-SD,
    vanilla SD (the streams' order), so a column never changes place between the two."""
    first = {"ar": ar(40), "mirror": mirror(20, **SD), "sd": mirror(20, **SD, decoder="sd")}
    second = {"sd": mirror(20, **SD, decoder="sd"), "mirror": mirror(20, **SD), "ar": ar(40)}
    session = session_of(first, second)
    session.runs = second  # the repeat shown, in its run order
    from ui.numbers import spread_html

    for table in (numbers_html(session.runs), spread_html(session.history)):
        head = table.split("<table")[1].split("</tr>")[0]
        assert head.index("Target-only AR") < head.index("Mirror-SD") < head.index("Vanilla SD"), head


def test_the_numbers_give_each_positions_acceptance_with_its_count_and_the_tau_it_implies():
    from ui.learn.glossary import GLOSSARY

    table = html.unescape(numbers_html({"ar": ar(40), "mirror": mirror(20, **SD)}))  # γ = 1, every d1 accepted
    row = lambda label: table.split(f"<th>{label}</th>")[1].split("</tr>")[0]  # noqa: E731
    assert "<td>—</td><td>α_1 1.00 (n 20)</td>" in row("α_i (n) by position")
    assert "<td>—</td><td>2.00</td>" in row("τ(γ) from α_i")
    assert {"α_i (n)", "τ(γ) from α_i"} <= {term for term, _ in GLOSSARY}


def test_an_earlier_comparisons_verdict_left_under_a_failed_run_says_so():
    from ui.run_tab import _error_toast

    session = session_of({"ar": ar(40), "mirror": mirror(20, **SD)})
    assert "earlier comparison" not in verdict_html(session)
    session.begin_comparison()  # the next Run fails while its pair loads: the results are the earlier ones
    session.error = "the target does not exist"
    session.idle.set()
    assert "The earlier comparison's verdict</b>: the last Run failed" in verdict_html(session)
    with pytest.raises(Exception) as raised:  # and the page's toast is an error's, titled "Error"
        _error_toast(session)
    assert type(raised.value).__name__ == "Error" and raised.value.title == "Error"
    session.begin_comparison()
    session.refuse("max new tokens must be in 1..1024")  # a bad setting: nothing ran, the verdict is the earlier one
    assert "the last Run failed" in verdict_html(session) and session.status.startswith("**Error:**")
    session.begin_comparison()
    session.load_stopped, session.error = True, None
    session.idle.set()
    assert "the last Run was stopped while its pair loaded" in verdict_html(session)
    _error_toast(session)  # no error: no toast
    session.clear_results()
    assert verdict_html(session) == "" and not session.earlier


def test_the_last_runs_gamma_kappa_and_exit_layer_show_beside_the_knobs():
    chosen = _settings("mirror", 1, note="chosen for this machine by the latency model (modelled): γ 1: a 2nd draft "
                                         "token adds little here")
    session = session_of({"ar": ar(40), "mirror": mirror(20, 0.01, 0.0, 0.01, 0.0, settings=chosen)})
    line = ran_line(session)
    assert "γ = 1, κ = 2, ℓ_e = 2 (γ, κ: chosen for this machine by the latency model" in line
    assert "Modelled at load" not in line  # no modelled figure recorded: nothing to re-check
    for modelled, verdict in ((1.5, "did not hold"), (0.2, "the choice held")):  # the choice re-checked by the run
        settings = _settings("mirror", 1, note="chosen for this machine by the latency model (modelled): γ 1",
                             modelled=modelled)
        run = mirror(20, 0.01, 0.0, 0.01, 0.0, settings=settings)
        line = ran_line(session_of({"ar": ar(40), "mirror": run}))
        assert f"Modelled at load {modelled:.2f}× AR; this run measured" in line and verdict in line, line
    assert "AR alone" in ran_line(session_of({"ar": ar(40)})) and "After a run" in ran_line(Session())


def test_no_absolute_server_path_reaches_the_page():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    home = os.path.expanduser("~")
    assert shown_path(os.path.join(root, "assets", "smollm2_pair", "feature_draft")) == "assets/smollm2_pair/feature_draft"
    assert shown_path("/somewhere/else/cache/models/x", root="/r", home="/somewhere/else") == "~/cache/models/x"
    assert shown_path("/var/tmp/pairs/target", root="/r", home="/h") == "…/pairs/target"
    assert shown_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    target, draft = os.path.join(root, "assets", "default_pair", "target"), "/var/tmp/x/draft"
    run = mirror(20, 0.01, 0.0, 0.01, 0.0, settings=_settings("mirror", 1, target=target, draft=draft))
    page = numbers_html({"mirror": run})
    assert "Ran: target assets/default_pair/target on cpu, draft …/x/draft on cpu" in page
    assert root not in page and (home == "/" or home not in page) and "/var/tmp" not in page


def test_the_page_shows_presets_by_short_paths_and_loads_them_by_their_folders(tmp_path):
    from ui import EngineLoader, build_demo, default_presets
    from ui.run_tab import preset_sources, with_sources

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    presets = default_presets(os.path.join(root, "assets", "default_pair"))
    demo = build_demo(EngineLoader(LaneConfig(kind="inline")), presets, ["x"])
    config = repr(demo.get_config_file())
    assert root not in config and "assets/default_pair/target" in config
    sources = preset_sources(presets)
    values = with_sources({"target": "assets/default_pair/target", "draft": " ~/models/d ", "prompt": "p"}, sources)
    assert values["target"] == os.path.join(root, "assets", "default_pair", "target")
    assert values["draft"] == os.path.join(os.path.expanduser("~"), "models", "d") and values["prompt"] == "p"
    assert with_sources({"target": "org/model", "draft": None}, sources) == {"target": "org/model", "draft": None}


@pytest.mark.parametrize("steps", [MIN_TIMED_STEPS - 1, MIN_TIMED_STEPS])
def test_the_step_rule_applies_to_speculative_runs(steps):
    run = mirror(steps, 0.01, 0.0, 0.01, 0.0)
    run.end = RunEnd(run.end.token_ids, RunSummary(1, new_tokens=40, steps=steps, committed=39, wall_s=0.2,
                                                   ttft_s=PREFILL), None)
    assert (too_short(run) is not None) == (steps < MIN_TIMED_STEPS)


VERDICT_JS = """JSON.stringify({
  top: document.getElementById("mirror-verdict").getBoundingClientRect().top + window.scrollY,
  text: document.getElementById("mirror-verdict").innerText,
  headline: document.getElementById("mirror-headline")?.innerText || "",
  noisy: document.getElementById("mirror-noisy")?.innerText || "",
  fold: document.getElementById("mirror-why-fold")?.textContent || "",
  open: !!document.getElementById("mirror-why-fold")?.open,
  gauge: [...document.querySelectorAll("#mirror-gauge .mirror-gauge-row")].map(r => [r.dataset.decoder,
    r.querySelector(".mirror-gauge-track").getBoundingClientRect().width,
    r.querySelector(".mirror-gauge-track b").getBoundingClientRect().height]),
  streamDels: [...document.querySelectorAll(".mirror-tokens del.mirror-rejected")].map(d => getComputedStyle(d).display),
  legendDel: getComputedStyle(document.querySelector(".mirror-legend del.mirror-rejected")).display,
  hidden: document.body.classList.contains("mirror-hide-rejected"),
})"""


@pytest.mark.slow  # headless Chromium drives the page
def test_the_verdict_is_on_the_first_screen_and_rejected_drafts_can_be_hidden(pair_root):
    import json

    from testing.browser import CHROMIUM, open_page, press_run, served_pair, wait_for
    from testing.toy_models import build_pair

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with served_pair(*build_pair(pair_root, "llama")) as (_, url, browser):
        open_page(browser, url)
        press_run(browser)  # the page's defaults: AR, Mirror-SD and vanilla SD, 3 repeats, 64 new tokens
        wait_for(browser, lambda s: "Done" in s["status"] and s["tokens"] > 0, 120)
        page = json.loads(browser.evaluate(VERDICT_JS))
        assert page["top"] < 800, page  # a 1280x800 window: the verdict is on the first screen, under Run
        # one plain sentence, the break-even gauge, and the fold closed: above it at most 70 words (the wall it was
        # filled a phone's screen), the sentence at most 40
        assert page["headline"].startswith(("Speculation ", "Vanilla SD won")) and len(page["headline"].split()) <= 40, page
        verdict = page["text"].replace(page["noisy"], "")  # the noise meter's line, where it flagged, comes on top
        assert len(verdict.split()) <= 70 and not page["open"] and "over 3 repeats" not in verdict, page
        assert not page["noisy"] or "not clean (Mirror ÷ AR spread" in page["noisy"] and "over 3 repeats" in page["noisy"]
        assert [d for d, _, _ in page["gauge"]] == ["mirror", "sd"], page
        assert all(width > 100 and mark > 0 for _, width, mark in page["gauge"]), page  # each track and its mark shown
        assert "× vanilla SD" in page["fold"] and "over 3 repeats" in page["fold"], page  # the arithmetic, folded,
        assert "AR steps and committed" in page["fold"] and "τ needed = " in page["fold"], page  # and the definitions
        assert not page["hidden"] and set(page["streamDels"]) <= {"inline"}, page
        browser.evaluate('document.querySelector("#mirror-hide-rejected input").click()')
        wait_for(browser, lambda s: json.loads(browser.evaluate(VERDICT_JS))["hidden"], 10, poll=0.1)
        page = json.loads(browser.evaluate(VERDICT_JS))
        assert page["streamDels"] and set(page["streamDels"]) == {"none"} and page["legendDel"] != "none", page


def test_the_verdict_names_where_its_baseline_ran():
    """ar runs the target alone on every core (LaneConfig.serial_cores "all"): the verdict says so beside its tok/s;
    with --serial-cores lane it names the target lane's cores instead."""
    from dataclasses import replace

    from ui.verdict import _where

    run = ar(40)
    base = run.start.settings
    run.start = replace(run.start, settings=replace(base, serial_cpus=(0, 1)))
    assert _where(run) == "; AR on both cores, the whole machine"
    run.start = replace(run.start, settings=replace(base, lanes=LaneConfig(kind="process", target_cpus=(0,))))
    assert _where(run) == "; AR on one core"
    run.start = None
    assert _where(run) == ""


def _load_info(draft: str = "draft", window_ms: float = 16.0, step_ms: float = 10.0):
    """A loaded pair's load-time figures (pair.PairInfo's fields the chain reads): its target timed a one-token
    step of `step_ms` and a window of the default γ+1 of `window_ms`."""
    from types import SimpleNamespace

    from mirror_core.records import Calibration, Timing

    target = Calibration("target", "auto", "float32", "float32", (Timing("float32", "step", step_ms),
                                                                  Timing("float32", "window", window_ms)))
    draft_cal = Calibration("draft", "auto", "float32", "float32", (Timing("float32", "step", 2.0),
                                                                    Timing("float32", "rows", 40.0)))
    return SimpleNamespace(target="target", draft=draft, target_dtype=target, draft_dtype=draft_cal,
                           whole_machine=None, serial_cpus=(), num_layers=4, overheads=None,
                           resolve=lambda spec: SpecConfig(gamma=1, kappa=2, exit_layer=2))


def test_one_steps_bars_add_up_to_the_measured_step_and_the_chain_quotes_each_verify_cost_once():
    from ui.costs import chain, chain_html, step_bar

    ar_run, run = ar(40), mirror(20, 0.010, 0.001, 0.010, 0.001)
    bar = step_bar(run)
    assert dict(bar.parts) == pytest.approx({"prefix": 10.0, "readout": 1.0, "suffix": 10.0, "verify": 0.0,
                                             "accept": 1.0, "wait for the draft": 0.0, "the rest": 0.0}, abs=1e-6)
    assert bar.step_ms == pytest.approx(22.0) and step_bar(ar_run).step_ms == pytest.approx(10.0)
    c = chain(run, ar_run, _load_info())
    text = re.sub(r"\s+", " ", html.unescape(re.sub("<[^>]+>", " ", chain_html(c))))
    # the load's window at γ = 1: 10 + (16 − 10) · 1/γ_default ms over its 10 ms step; the run's: 20 ms over 10 ms
    from mirror_core.config import DEFAULT_GAMMA

    load_window = 10.0 + 6.0 / DEFAULT_GAMMA
    assert f"window at load {load_window:.2f} ms {load_window / 10:.2f} AR steps" in text
    assert "window 20.00 ms 2.00 AR steps" in text and "verification 21.00 ms 2.10 AR steps" in text
    assert "step 22.00 ms 2.20 AR steps" in text
    verdict = html.unescape(verdict_html(session_of({"ar": ar_run, "mirror": run})))
    assert "cost 2.10 AR steps" in verdict and "whole step cost 2.20 AR steps" in verdict  # the same figures
    assert f"This run's window took 20.00 ms against {load_window:.2f} ms at load" in text  # outside its spread: why
    assert chain(run, ar_run, _load_info(window_ms=10.0 + 10.0 * DEFAULT_GAMMA)).load_window == pytest.approx(20.0)
    same = chain_html(chain(run, ar_run, _load_info(window_ms=10.0 + 10.0 * DEFAULT_GAMMA)))
    assert "lies within this run" in html.unescape(same)
    other = _load_info()
    other.target = "another target"  # the loaded pair is not the run's: no load figures
    assert chain(run, ar_run, other).load_window is None


def test_the_loads_choice_is_checked_against_the_run_with_the_term_that_moved_most():
    from ui.costs import choice_check, moved
    from ui.learn.example import ROOT
    from ui.whatif import WhatIf

    load = WhatIf(10.0, 1.2, 0.5, 2.0, 1.0, 0.0, 2.0, 0.3, 1)
    run = WhatIf(10.0, 2.1, 0.5, 2.0, 1.0, 1.0, 2.0, 0.3, 1)  # the window nearly doubled, the readout appeared
    assert [name for name, _ in moved(load, run)][:2] == ["the window's forward", "the readout and messages"]
    draft = os.path.join(ROOT, "assets", "smollm2_pair", "feature_draft")  # a draft with a profile
    settings = _settings("mirror", 1, draft=draft, note="chosen for this machine", modelled=1.2)
    run_ = mirror(20, 0.010, 0.001, 0.010, 0.001, settings=settings)
    text = choice_check(run_, ar(40), _load_info(draft=draft))
    assert text.startswith("The load chose γ 1, κ 2 here as modelled ") and "it measured 0.91×" in text
    assert "The term that moved most: the window's forward" in text
    assert choice_check(run_, ar(40), None) == ""  # no load figures: nothing to check against


def _mirror_at(ratio: float) -> DecoderRun:
    """A Mirror-SD run whose wall time is AR's (ar(40): 410 ms for 41 tokens) ÷ `ratio`, for the same 41 tokens."""
    step = (0.41 / ratio - PREFILL) / 20  # 20 steps of two tokens after the prefill's
    return mirror(20, step / 2 - 0.0005, 0.0005, step / 2 - 0.0005, 0.0005)


def test_a_run_of_clearly_slower_repeats_is_slower_though_one_repeat_touches_one():
    """[0.67, 0.70, 1.00]: the middle half of the repeats (0.69–0.85×) does not hold 1×, so the verdict says slower,
    with no noise clause; [0.95, 1.02, 1.05] holds 1× in its middle half: within timing noise."""
    slower = verdict_text([{"ar": ar(40), "mirror": _mirror_at(x)} for x in (0.67, 0.70, 1.00)])
    assert slower.startswith("Mirror-SD 0.70× AR") and "[0.67–1.00× over 3 repeats" in slower, slower
    assert "Slower here than AR" in slower and "timing noise" not in slower
    tie = verdict_text([{"ar": ar(40), "mirror": _mirror_at(x)} for x in (0.95, 1.02, 1.05)])
    assert "holds 1×: on this machine the two are within timing noise" in tie


def test_the_verdict_says_how_much_was_copied_and_where_speculation_pays():
    from dataclasses import replace as dc_replace

    from ui.verdict import where_it_pays

    run = mirror(20, **SD)
    assert where_it_pays({"mirror": run}, False).startswith("0 of 41 tokens were copied from the context: on open-ended")
    run.end = dc_replace(run.end, summary=dc_replace(run.end.summary, source_steps=(0, 0, 10),
                                                     source_drafted=(0, 0, 30), source_accepted=(0, 0, 20)))
    paid, lost = where_it_pays({"mirror": run}, True), where_it_pays({"mirror": run}, False)
    assert paid == ("20 of 41 tokens (49%) were copied from the context (yellow): speculation pays where the answer "
                    "copies from the prompt or from itself.")
    # a run that did not pay says where speculation pays only as a condition ("Slower here" then "it pays" read false)
    assert lost.startswith("20 of 41 tokens (49%) were copied from the context (yellow), and still speculation did "
                           "not pay here: copying pays only where") and "speculation pays where" not in lost


def test_mirror_over_sd_is_the_median_of_the_per_repeat_ratios():
    """Three repeats, Mirror-SD at 1.11×, 0.91×, 1.41× AR and vanilla SD beside each: the repeat read for Mirror ÷ AR
    (1.11×) has SD slower, but SD beat Mirror-SD in the other two, so Mirror ÷ SD is their median, below 1."""
    slow_sd, fast_sd = mirror(20, **SD, decoder="sd"), mirror(20, 0.004, 0.0, 0.004, 0.0, decoder="sd")
    reps = [{"ar": ar(40), "mirror": _mirror_at(1.11), "sd": slow_sd},
            {"ar": ar(40), "mirror": _mirror_at(0.91), "sd": fast_sd},
            {"ar": ar(40), "mirror": _mirror_at(1.41), "sd": mirror(20, 0.003, 0.0, 0.003, 0.0, decoder="sd")}]
    from ui.numbers import speedup
    from ui.verdict import versus_sd_median

    ratios = sorted(speedup(r["sd"], r["mirror"])[0] for r in reps)
    assert speedup(slow_sd, reps[0]["mirror"])[0] > 1 > ratios[1]
    text = verdict_text(reps)
    assert versus_sd_median(reps) == pytest.approx(ratios[1])
    assert f" · {ratios[1]:.2f}× vanilla SD [{ratios[0]:.2f}–{ratios[2]:.2f}× over 3 repeats, the median shown] " \
           "(SD was faster)" in text, text
    # the middle repeat's steps put Mirror-SD ahead per token: said as a disagreement, not left beside "SD was faster"
    assert "These steps put Mirror-SD ahead per token, while the median of the repeats' wall times" in text
    assert f"puts SD ahead ({ratios[1]:.2f}×): the readings disagree" in text
    agreed = verdict_text([reps[1]])
    assert "(SD was faster)" in agreed and "the readings disagree" not in agreed, agreed


def test_context_windows_are_quoted_with_their_mean_length():
    from dataclasses import replace as dc_replace

    from ui.costs import window_words

    run = mirror(20, **SD)
    assert window_words(run) == "the window of γ+1 = 2 tokens"
    run.end = dc_replace(run.end, summary=dc_replace(run.end.summary, drafted=160))  # 8 tokens drafted a step
    assert window_words(run) == "windows of 9.00 tokens on average, the context's copies beside the draft model's " \
                                "γ+1 = 2"
    assert "windows of 9.00 tokens on average" in verdict_text([{"ar": ar(40), "mirror": run}])


def test_the_consistency_reader_finds_each_kind_of_contradiction():
    """testing/consistency.py, which the browser test runs on the page: silent on consistent texts, and it names a
    figure said two ways, a claim against its figure, and a hidden draft that was waited for."""
    from testing.consistency import PageTexts, contradictions

    verdict = ("Speculation lost here: Mirror-SD ran at 0.76× AR's speed (0.82× vanilla SD's speed), because each step "
               "cost 1.89 AR steps but committed only 1.50 tokens.\nMirror-SD\nneeds τ 1.89 · got 1.50: short by 0.39")
    fold = ("Mirror-SD 0.76× AR (96.4 vs 126.4 tok/s) · 0.82× vanilla SD (SD was faster). Slower here than AR: a whole "
            "step cost 1.89 AR steps (1.50 ÷ 1.89 ≈ 0.80). Against vanilla SD a step cost 14.81 vs 13.85 ms (τ 1.50 vs "
            "1.50: 9.87 vs 9.23 ms a token), by part. Mirror-SD: one step, τ = 1.50 tokens14.81 ms · 9.87 ms a token")
    why = "Measured in this run: a Mirror-SD step took 14.81 ms, of which the target waited 0.02 ms for the draft"
    assert contradictions(PageTexts(verdict, fold, why)) == []
    cases = {
        "Mirror-SD × AR": (verdict.replace("0.76× AR's", "0.86× AR's"), fold, why),
        "the gauge's τ": (verdict.replace("needs τ 1.89", "needs τ 1.95"), fold, why),
        "cheaper per token": (verdict, fold.replace("9.87 vs 9.23", "9.23 vs 9.87"), why),
        "measured step": (verdict, fold, why.replace("14.81 ms, of", "12.80 ms, of")),
        "called hidden": (verdict, fold, why.replace("0.02", "3.45") + "; so the draft is hidden"),
        "speculation pays": (verdict, fold + " speculation pays where the answer copies from the prompt", why),
    }
    for needle, texts in cases.items():
        found = contradictions(PageTexts(*texts))
        assert any(needle in line for line in found), (needle, found)
