"""Windows of zero (mirror_core/draft_choice.py): each step proposes a window only where it is modelled to commit more
tokens per millisecond than a plain target step. The choice against set costs and acceptance; every decoder's tokens
equal ar's with the policy on and off, greedy and under both sampling rules, on the chooser's own choices and on
forced mixes of plain steps and windows of every kind; a draft that sat out catches up in one forward and drafts as
it would have; and the counts and reasons the page shows."""
from __future__ import annotations

from dataclasses import replace

import pytest

from mirror_core import LaneConfig, MirrorEngine, Request, SamplingConfig, SpecConfig, StepRecord
from mirror_core.config import ContextConfig
from mirror_core.context_draft import ContextPlan
from mirror_core.draft_choice import PROBE_GAP, ChoicePlan, WindowChoice, WindowChooser
from mirror_core.verify import accept
from testing.toy_models import hf_greedy
from ui.inspector import inspector_html
from ui.numbers import numbers_html
from ui.session import DecoderRun, TokenNamer
from ui.verdict import zero_windows_line

ROWS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)   # the load's forward of 1..6 rows in one-row steps


def chooser(gamma: int = 3, zero_windows: bool = True, max_new: int = 64) -> WindowChooser:
    """A chooser whose run has timed its steps: 5 ms a row-step, 0.1 ms waits, 1 ms a draft step."""
    ch = WindowChooser(ChoicePlan(zero_windows, max_new, ROWS, 0.005), gamma, (1, 2, 3))
    for rows in range(1, 5):
        ch.costs.learn(rows, 0.005 * ROWS[rows - 1], "zero" if rows == 1 else "model", 0.0001)
    ch.costs.learn_rollout(1, 0.001, 2, 0.002)
    return ch


def windows(ch: WindowChooser, drafted: int, accepted: int, n: int) -> None:
    for _ in range(n):
        ch.model.window(drafted, accepted)


def test_a_plain_step_wins_where_the_draft_rarely_agrees():
    ch = chooser()
    windows(ch, 3, 0, 30)
    choice = ch.choose(False, 1)
    assert choice.chosen.source == "zero" and choice.chosen.size == 0 and choice.chosen.expected == 1.0
    assert choice.other.source == "model" and choice.other.per_ms < choice.chosen.per_ms and choice.measured
    assert choice.chosen.ms == pytest.approx(5.1)   # a one-row verification and the wait for an empty reply


def test_windows_win_and_their_length_is_chosen_per_step():
    ch = chooser(gamma=3)
    windows(ch, 3, 3, 30)                            # every position accepted: the longest window pays most
    assert (ch.choose(False, 1).chosen.source, ch.last.chosen.size) == ("model", 3)
    ch = chooser(gamma=3)
    for _ in range(30):                              # the first token nearly always, the second rarely
        ch.model.see(1, 0.95)
        ch.model.see(2, 0.05)
    assert (ch.choose(False, 1).chosen.source, ch.last.chosen.size) == ("model", 1)


def test_off_is_raw_speculation():
    ch = chooser(gamma=3, zero_windows=False)
    windows(ch, 3, 0, 30)
    choice = ch.choose(False, 1)
    assert (choice.chosen.source, choice.chosen.size, choice.other) == ("model", 3, None)


def test_a_plain_step_is_priced_where_it_runs_until_the_run_times_its_own():
    """The load's row curve is one core's; a plain step runs on every core (ar's cores), where one row is cheaper than
    that curve at the run's scale says: the chooser prices it by the load's plain step there until the run has timed
    MIN_TIMED plain steps of its own."""
    from mirror_core.draft_choice import MIN_TIMED

    def run(plain_s: float) -> WindowChooser:  # the run timed only 2-row windows: 1.3 one-core steps, not the 1.05
        ch = WindowChooser(ChoicePlan(True, 64, (1.0, 1.05, 1.08, 1.1), 0.006, None, plain_s), 1, (1, 2, 3))
        for _ in range(3):
            ch.costs.learn(2, 0.0066, "model", 0.0001)
        ch.costs.learn_rollout(1, 0.0006, 0, 0.0)
        windows(ch, 1, 0, 7)
        windows(ch, 1, 1, 3)                        # the draft's first token accepted 3 times in 10
        return ch

    scaled = run(0.0)                                # a plain step at the run's scale: 0.0066 / 1.05 s
    assert scaled.costs.verify(1) == pytest.approx(0.0066 / 1.05) and scaled.choose(False, 1).chosen.source == "model"
    anchored = run(0.0044)                           # the load's plain step on every core
    assert anchored.costs.verify(1) == 0.0044 and anchored.choose(False, 1).chosen.source == "zero"
    for _ in range(MIN_TIMED):                       # then the run's own plain steps
        anchored.costs.learn(1, 0.005, "zero", 0.0)
    assert anchored.costs.verify(1) == 0.005


def test_a_branch_on_a_hit_needs_no_draft_work():
    ch = chooser(gamma=2)
    windows(ch, 2, 1, 30)
    choice = ch.choose(True, 1)
    assert choice.chosen.source == "branch" and choice.other.source in ("model", "zero")
    assert ch.choose(False, 1).chosen.source != "branch"   # no hit, no branch


def test_a_catch_up_costs_by_the_rows_it_feeds():
    ch = chooser()
    ch.costs.learn_rollout(9, 0.0026, 0, 0.0)       # 8 rows beyond the first: 0.2 ms each
    assert ch.costs.draft_work(1, 9) == pytest.approx(ch.costs.draft_work(1, 1) + 8 * 0.0002, rel=0.05)


def test_probes_measure_the_draft_again_and_back_off():
    ch = chooser()
    windows(ch, 3, 0, 30)
    for _ in range(PROBE_GAP):                       # plain steps, each committing one token
        assert not ch.choose(False, 1).probe
        ch.learn(0, 0.005, 0.0001, [7])
    probe = ch.choose(False, 1)
    assert probe.probe and (probe.chosen.source, probe.chosen.size) == ("model", 1) and probe.other.source == "zero"
    ch.learn(0, 0.0055, 0.0011, [8])                 # the probe lost: the next one waits twice as long
    assert ch.probe_gap == 2 * PROBE_GAP and ch.since_news == 0
    ch.agree([1.0] * 40)                             # the draft agreed on everything the target committed since
    assert ch.choose(False, 1).chosen.source == "model"


def test_a_plain_step_promises_the_next_unless_the_context_could_offer():
    """After a plain step chosen on its merits the next is promised plain (the target starts it without waiting) unless
    the token it commits could make the context offer a window; the promise is kept even if the draft has meanwhile
    started to agree, and not renewed then."""
    ch = WindowChooser(ChoicePlan(True, 64, ROWS, 0.005, ContextPlan(2, 16)), 3, (5, 6, 7, 8, 6, 9))
    ch.costs.learn(1, 0.005, "zero", 0.0001)
    windows(ch, 3, 0, 30)
    first = ch.choose(False, 1)
    assert first.chosen.source == "zero" and not first.promised and ch.promise == frozenset()  # nothing follows 9
    ch.learn(0, 0.005, 0.0001, [6])
    second = ch.choose(False, 1)
    assert second.promised and ch.promise == {7, 9}           # after 6 the context has seen 7 and 9
    ch.learn(0, 0.005, 0.0001, [7])
    third = ch.choose(False, 1)
    assert not third.promised and third.chosen.source == "context" and ch.proposal.tokens[:2] == (8, 6)
    ch = chooser()
    windows(ch, 3, 0, 30)
    ch.choose(False, 1)
    assert ch.promise == frozenset()                          # no context draft: only a hit breaks the promise
    ch.learn(0, 0.005, 0.0001, [4])
    ch.agree([1.0] * 40)                                      # the draft agrees now: the promise holds, once
    assert ch.choose(False, 1).promised and ch.promise is None
    assert not ch.choose(True, 1).promised                    # a hit: a branch may be the next window


def test_the_budget_caps_what_a_window_can_commit():
    ch = chooser(max_new=1)
    windows(ch, 3, 3, 30)
    assert ch.choose(False, 1).chosen.source == "zero"   # one token left: any window commits one token at most


def test_a_window_of_zero_commits_the_targets_own_draw():
    import torch

    logits = torch.tensor([[0.3, 1.2, -0.4, 0.8]])                                        # [1, V]: [w0] alone
    for cfg in (SamplingConfig(), SamplingConfig(1.0, seed=3), SamplingConfig(0.8, seed=4, rule="rejection")):
        from mirror_core.sampling import target_token
        got = accept(logits, [], cfg, 17, None, torch.Generator().manual_seed(0))
        assert (got.accepted, got.token) == (0, target_token(logits[0], cfg, 17))   # ar's token at position 17


# -- the engine --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(llama_with_drafts):
    return llama_with_drafts


CHOOSE = WindowChooser.choose
MIX = (0, 0, "own", 1, 0, "γ", "own", 0, 0, 0, 2)   # forced: 0 = a plain step, n = a model window of n, own = chosen


def forced(pattern):
    """WindowChooser.choose following `pattern` step by step ("own": what the chooser chose): a mix of plain steps and
    windows of every kind that the toy pair's timings alone would not give reliably."""
    def choose(self, hit, fed):
        own = CHOOSE(self, hit, fed)
        self.forced = getattr(self, "forced", -1) + 1
        kind = pattern[self.forced % len(pattern)]
        if kind == "own" or own.promised:  # a promised plain step is already under way on the target lane
            return own
        size = self.gamma if kind == "γ" else min(kind, self.gamma)
        chosen = self._plain() if size == 0 else self._model("model", size, fed)
        self.last, self.proposal, self.work_s = WindowChoice(chosen, None), None, 0.0
        self.promise = self.promise if size == 0 and own.chosen.source == "zero" else None
        return self.last
    return choose


PROMPTS = [tuple(range(10, 40)) + tuple(range(10, 16)),   # copies from the prompt: context windows too
           (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5) * 3, (5, 17, 42, 8)]
SAMPLINGS = [SamplingConfig(), SamplingConfig(1.0, seed=3), SamplingConfig(0.8, top_k=20, seed=11)]


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
@pytest.mark.parametrize("policy", ["chooser", "mix"])
def test_every_decoder_equals_ar_with_zero_windows_on_and_off(pair, draft_kind, policy, monkeypatch):
    """Greedy and Rule E: every token is ar's, whatever the windows were; the mix takes windows of zero."""
    target, draft, fdraft = pair
    if policy == "mix":
        monkeypatch.setattr(WindowChooser, "choose", forced(MIX))
    zero = 0
    with MirrorEngine.load(target, draft if draft_kind == "token" else fdraft,
                           LaneConfig(kind="inline", dtype="float32")) as engine:
        for prompt in PROMPTS:
            assert list(engine.generate(Request(prompt, "ar", 30)).token_ids) == hf_greedy(target, prompt, 30)
            for sampling in SAMPLINGS:
                want = engine.generate(Request(prompt, "ar", 30, sampling=sampling)).token_ids
                for decoder in ("sd", "mirror"):
                    for on in (True, False):
                        spec = SpecConfig(gamma=3, kappa=2, zero_windows=on)
                        end = engine.generate(Request(prompt, decoder, 30, sampling=sampling, spec=spec))
                        assert end.error is None and end.fallback is None
                        assert end.token_ids == want, (prompt, decoder, sampling, on)
                        assert on or policy == "mix" or end.summary.zero_windows == 0
                        zero += end.summary.zero_windows
    assert policy == "chooser" or zero > 50


@pytest.mark.parametrize("decoder", ["sd", "mirror"])
def test_rule_r_with_windows_of_zero_only_is_ar_token_for_token(pair, decoder, monkeypatch):
    """Rule R draws c from its own stream where a window had drafts; a window of zero commits the target's keyed draw,
    ar's, so a run of plain steps alone is ar's run; a mix stays lossless (the slow tier's law test)."""
    target, draft, _ = pair
    monkeypatch.setattr(WindowChooser, "choose", forced((0,)))
    sampling = SamplingConfig(0.9, seed=5, rule="rejection")
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        for prompt in PROMPTS:
            want = engine.generate(Request(prompt, "ar", 24, sampling=SamplingConfig(0.9, seed=5))).token_ids
            end = engine.generate(Request(prompt, decoder, 24, sampling=sampling, spec=SpecConfig(gamma=2, kappa=2)))
            assert end.token_ids == want and end.summary.zero_windows == end.summary.steps


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_promised_plain_steps_start_without_waiting_and_stay_exact(pair, draft_kind, monkeypatch):
    """Where no window can win (the model's made hopeless, no probes, no context) every step after the first is a
    promised plain step: its request posted, the plain step started at once, the reply collected after it; the tokens
    are ar's under every rule, Rule R included (a window of zero commits ar's draw)."""
    target, draft, fdraft = pair
    model = WindowChooser._model
    monkeypatch.setattr(WindowChooser, "_model", lambda self, *a: replace(model(self, *a), ms=1e6))
    monkeypatch.setattr("mirror_core.draft_choice.PROBE_GAP", 10**6)
    spec = SpecConfig(gamma=2, kappa=2, context=ContextConfig(enabled=False))
    with MirrorEngine.load(target, draft if draft_kind == "token" else fdraft,
                           LaneConfig(kind="inline", dtype="float32")) as engine:
        for sampling in (*SAMPLINGS[:2], SamplingConfig(0.9, seed=5, rule="rejection")):
            want = engine.generate(Request(PROMPTS[2], "ar", 24, sampling=replace(sampling, rule="exact"))).token_ids
            for decoder in ("sd", "mirror"):
                events = list(engine.stream(Request(PROMPTS[2], decoder, 24, sampling=sampling, spec=spec)))
                records = [e for e in events if isinstance(e, StepRecord)]
                assert events[-1].token_ids == want and events[-1].fallback is None, (decoder, sampling)
                assert all(r.source == "zero" for r in records)
                unpromised = 3 + sum(bool(r.hit) for r in records)  # the first step, the last two (the budget), hits
                assert sum(r.choice.promised for r in records) >= len(records) - unpromised


def _first_drafts(events, prompt_len: int) -> dict[int, int]:
    """Position of w0 → d1, for every window with drafts (w0 of step 1 is the prefill's token, at the prompt's end)."""
    out, at = {}, prompt_len
    for r in (e for e in events if isinstance(e, StepRecord)):
        if r.drafted:
            out[at] = r.window[1]
        at += r.committed
    return out


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_a_draft_that_sat_out_catches_up_and_drafts_as_before(pair, draft_kind, monkeypatch):
    """After windows of zero the draft is fed the skipped tokens in one forward when it next drafts; greedy, its
    first tokens after a run of plain steps are those it proposes at the same positions when it drafts every step
    (up to the rounding of a longer forward), and the catch-up rows tell the chooser how well it agreed."""
    target, draft, fdraft = pair
    samples = []
    agree = WindowChooser.agree
    monkeypatch.setattr(WindowChooser, "agree", lambda self, s: (samples.extend(s), agree(self, s)))
    off = SpecConfig(gamma=1, kappa=1, context=ContextConfig(enabled=False), zero_windows=False)
    prompt = (5, 17, 42, 8, 23, 61)
    with MirrorEngine.load(target, draft if draft_kind == "token" else fdraft,
                           LaneConfig(kind="inline", dtype="float32")) as engine:
        every = _first_drafts(list(engine.stream(Request(prompt, "sd", 64, spec=off))), len(prompt))
        samples.clear()
        monkeypatch.setattr(WindowChooser, "choose", forced((0, 0, 1)))
        monkeypatch.setattr(WindowChooser, "_promise", lambda self: None)  # the pattern alone, whatever the timings
        events = list(engine.stream(Request(prompt, "sd", 64, spec=replace(off, zero_windows=True))))
    sat_out = _first_drafts(events, len(prompt))
    common = [p for p in sat_out if p in every]
    assert len(common) >= 8 and sum(sat_out[p] == every[p] for p in common) >= 0.9 * len(common)
    zero_steps = events[-1].summary.zero_windows
    assert len(samples) >= zero_steps // 2 and set(samples) <= {0.0, 1.0}   # greedy: agreement is 0 or 1


def test_windows_of_zero_are_counted_and_explained(pair, monkeypatch):
    target, draft, _ = pair
    monkeypatch.setattr(WindowChooser, "choose", forced(MIX))
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        events = list(engine.stream(Request(PROMPTS[2], "sd", 40, spec=SpecConfig(gamma=3, kappa=2))))
    records = [e for e in events if isinstance(e, StepRecord)]
    plain = [r for r in records if r.source == "zero"]
    summary = events[-1].summary
    assert plain and all(r.drafted == 0 and r.accepted == 0 and len(r.window) == 1 for r in plain)
    assert all(r.choice is not None and r.choice.chosen.source == r.source for r in records)
    assert summary.zero_windows == len(plain) == summary.by_source["zero"]["steps"]
    assert summary.to_dict()["zero_windows"] == len(plain)
    assert sum(summary.hist) == summary.steps - len(plain)          # A_t is counted over windows with drafts
    assert summary.tau == pytest.approx(summary.committed / summary.steps)
    run = DecoderRun("sd", TokenNamer(None))
    for e in events:
        run.add(e)
    shown = inspector_html(run, plain[0].step)
    assert "a window of zero" in shown and "W = [w0] alone" in shown and "a plain step:" in shown
    table = numbers_html({"sd": run})
    assert "windows of zero" in table and f"{len(plain)} of {len(records)} steps" in table
    line = zero_windows_line({"sd": run})
    assert f"at {len(plain)} of {len(records)} steps" in line and "modelled" in line


def test_the_switch_reaches_the_request_from_the_cli_and_the_page():
    """One default (SpecConfig.zero_windows: on); --zero-windows off and the page's Zero windows unticked are raw
    speculation."""
    from mirror_core.cli import build_parser, request_from_args
    from ui.settings import CONTROLS, DEFAULTS, controls_by_name, settings_from_ui

    assert SpecConfig().zero_windows is True and DEFAULTS["zero_windows"] is True
    for flag, on in ((), True), (("--zero-windows", "off"), False), (("--zero-windows", "on"), True):
        args = build_parser().parse_args(["generate", "--prompt", "x", *flag])
        assert request_from_args(args, (1,)).spec.zero_windows is on
    values = {**DEFAULTS, "prompt": "hi", "target": "t", "draft": "d"}
    for on in (True, False):
        s = settings_from_ui(controls_by_name([{**values, "zero_windows": on}[k] for k in CONTROLS]))
        assert s.requests((1, 2))[0].spec.zero_windows is on
    with pytest.raises(Exception, match="zero windows"):
        SpecConfig(zero_windows="yes")


def test_a_mirror_run_of_plain_steps_only_gets_a_verdict(pair, monkeypatch):
    """Every step a window of zero (no prefix, readout or suffix to time): the verdict, its fold, the gauge and the
    numbers still read the run, and say its steps were plain."""
    from ui.session import Session
    from ui.verdict import verdict_html

    target, draft, _ = pair
    monkeypatch.setattr(WindowChooser, "choose", forced((0,)))
    session = Session()
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        for decoder in ("ar", "mirror", "sd"):
            run = DecoderRun(decoder, TokenNamer(None))
            for e in engine.stream(Request(PROMPTS[2], decoder, 24, spec=SpecConfig(gamma=2, kappa=2))):
                run.add(e)
            session.history.append(run)
            session.runs[decoder] = run
    session.idle.set()
    shown = verdict_html(session)
    assert "Speculation" in shown and "at 23 of 23 steps" in shown and "plain" in shown
    assert "windows of zero" in numbers_html(session.runs)
    from ui.costs import step_bar
    parts = dict(step_bar(session.runs["mirror"]).parts)  # the plain steps' passes are a phase, not "the rest"
    assert parts["verify"] > parts["the rest"] and parts["prefix"] == parts["suffix"] == 0.0
