"""UI pure parts on synthetic events: token renderer, figure builders, numbers, inspector, settings mapping."""
from __future__ import annotations

import copy
import html
import json

import pytest

from mirror_core import (
    LaneConfig,
    MirrorError,
    RejectedEvent,
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
from mirror_core.config import parse_token_ids
from ui import plots
from ui.inspector import inspector_html
from ui.numbers import latency_model, numbers_html, speedup
from ui.render import COLOR_MAP
from ui.session import plain_text, stream_html
from ui.session import DecoderRun, Session, TokenNamer
from ui.settings import (
    BOUNDS,
    CONTROLS,
    DEFAULTS,
    INFO,
    controls_by_name,
    load_examples,
    settings_from_ui,
)


class ByteTokenizer:
    """Token id = one UTF-8 byte, so a multi-byte character spans several tokens."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")

    def encode(self, text):
        return list(text.encode("utf-8"))


def _settings(decoder: str, gamma: int) -> RunSettings:
    request = Request((1,), decoder, spec=SpecConfig(gamma=gamma))
    return RunSettings(request=request, lanes=LaneConfig(kind="inline"), exit_layer=1, target="target", draft="draft",
                       target_runner="FastLlamaRunner")


def mirror_run(tokenizer=None) -> DecoderRun:
    """Two Mirror-SD steps: step 1 accepts 1 of 2 drafts (miss), step 2 accepts both from a reused branch (bonus)."""
    t0 = 100.0
    run = DecoderRun("mirror", TokenNamer(tokenizer))
    events = [
        RunStart("mirror", (104, 105), _settings("mirror", 2), t0),
        SpanEvent("target", "prefill", t0, t0 + 0.010, 0),
        SpanEvent("draft", "prefill", t0, t0 + 0.004, 0),
        TokenEvent(0xC3, 0, 0, "target", False, t0 + 0.010),       # first byte of "é": held back
        SpanEvent("draft", "draft_rollout", t0 + 0.004, t0 + 0.008, 0),
        SpanEvent("target", "target_prefix", t0 + 0.011, t0 + 0.015, 1),
        SpanEvent("target", "exit_readout", t0 + 0.015, t0 + 0.016, 1),
        SpanEvent("target", "target_suffix", t0 + 0.016, t0 + 0.020, 1),
        SpanEvent("target", "accept", t0 + 0.020, t0 + 0.021, 1),
        TokenEvent(0xA9, 1, 1, "accepted", False, t0 + 0.021),      # completes "é"
        TokenEvent(ord("x"), 2, 1, "correction", False, t0 + 0.021),
        RejectedEvent(1, (ord("q"),), 2),
        SpanEvent("draft", "draft_branches", t0 + 0.016, t0 + 0.019, 1),
        SpanEvent("draft", "draft_rollout", t0 + 0.021, t0 + 0.024, 1),
        StepRecord(1, (0xC3, 0xA9, ord("q")), 2, 1, ord("x"), 2, False, False,
                   topk_ids=((ord("a"), ord("b")), (ord("y"), -1), (ord("z"), ord("w"))),
                   topk_logprobs=((-0.5, -1.5), (-0.1, float("-inf")), (-0.7, -0.9)),
                   target_tokens=(0xA9, ord("x"), ord("z")),
                   branches=((1, 2), (3, 4), (5, 6), (7, 8), (9, 10)),
                   branch_rows=((0, ord("a")), (0, ord("b")), (1, ord("y")), (2, ord("z")), (2, ord("w"))),
                   branch_row=None, t_end=t0 + 0.024),
        SpanEvent("target", "target_prefix", t0 + 0.025, t0 + 0.029, 2),
        SpanEvent("target", "exit_readout", t0 + 0.029, t0 + 0.030, 2),
        SpanEvent("target", "target_suffix", t0 + 0.030, t0 + 0.034, 2),
        SpanEvent("target", "accept", t0 + 0.034, t0 + 0.035, 2),
        TokenEvent(ord("y"), 3, 2, "accepted", True, t0 + 0.035),
        TokenEvent(ord("z"), 4, 2, "accepted", True, t0 + 0.035),
        TokenEvent(ord("!"), 5, 2, "bonus", False, t0 + 0.035),
        SpanEvent("draft", "draft_branches", t0 + 0.030, t0 + 0.033, 2),
        SpanEvent("draft", "select_branch", t0 + 0.035, t0 + 0.036, 2),
        StepRecord(2, (ord("x"), ord("y"), ord("z")), 2, 2, ord("!"), 3, True, True,
                   topk_ids=((ord("a"),), (ord("b"),), (ord("!"),)), topk_logprobs=((-1.0,), (-1.0,), (-0.2,)),
                   target_tokens=(ord("y"), ord("z"), ord("!")), branches=((1, 1), (2, 2), (3, 3)),
                   branch_rows=((0, ord("a")), (1, ord("b")), (2, ord("!"))), branch_row=2,
                   t_end=t0 + 0.036),
        RunEnd((0xC3, 0xA9, ord("x"), ord("y"), ord("z"), ord("!")),
               # τ 2.5, α 0.75, hit rate 0.5, draft-hidden 0.4, wall 36 ms
               RunSummary(2, new_tokens=6, steps=2, committed=5, drafted=4, accepted=3, branched_steps=2, hits=1,
                          draft_busy_s=0.010, hidden_s=0.004, wall_s=0.036, ttft_s=0.01), None),
    ]
    for e in events:
        run.add(e)
    return run


def ar_run(wall: float = 0.072, n: int = 6) -> DecoderRun:
    run = DecoderRun("ar", TokenNamer(None))
    run.add(RunStart("ar", (1,), _settings("ar", 4), 0.0))
    for i in range(n):
        run.add(SpanEvent("target", "target_step" if i else "prefill", i * wall / n, (i + 1) * wall / n, i))
        run.add(TokenEvent(10 + i, i, i, "target", False, (i + 1) * wall / n))
    run.add(RunEnd(tuple(range(10, 10 + n)), RunSummary(4, new_tokens=n, wall_s=wall), None))
    return run


def test_renderer_is_utf8_safe_and_keeps_rejected_drafts_out_of_the_copyable_text():
    run = mirror_run(ByteTokenizer())
    assert plain_text(run) == "éxyz!"
    pieces = [(text, label) for text, label in run.pieces if text]  # what the stream shows, one span each
    assert pieces[0] == ("é", "accepted draft")                 # the held-back byte joined the next token
    assert ("x", "correction") in pieces and ("!", "bonus") in pieces
    assert ("y", "accepted · reused branch") in pieces
    assert all("\ufffd" not in text for text, _ in pieces)
    assert {label for _, label in pieces} <= set(COLOR_MAP)
    html = stream_html(run, prompt="hé")
    assert "<del" in html and ">q</del>" in html and html.index(">q</del>") < html.index(">x<")
    assert html.index('class="mirror-prompt"') < html.index('class="mirror-tok"')
    assert html.count('class="mirror-tok"') == len(pieces)
    assert plain_text(run, upto=3) == "éx" and stream_html(run, upto=1).count("<del") == 0


def test_models_without_a_tokenizer_show_token_ids():
    run = mirror_run(None)
    assert plain_text(run).split() == ["195", "169", "120", "121", "122", "33"]
    assert TokenNamer(None).show(7) == "#7"


def test_the_inspector_answers_any_typed_step_with_a_line():
    run = mirror_run()
    assert "Step 1" in inspector_html(run, 1) and "Step 2" in inspector_html(run, "2")
    assert "not in this run (steps 1..2)" in inspector_html(run, 999)
    assert "whole number" in inspector_html(run, "two")


def test_the_stream_only_grows_at_its_end_event_after_event():
    """Append-only HTML is what lets Gradio send each update as the new characters (render.StreamHTML)."""
    events = list(mirror_run(ByteTokenizer()).events)
    run, last = DecoderRun("mirror", TokenNamer(ByteTokenizer())), ""
    for e in events:
        run.add(e)
        now = stream_html(run, prompt="p")
        assert now.startswith(last)
        last = now
    assert last == stream_html(mirror_run(ByteTokenizer()), prompt="p")


def test_plot_feed_records_on_synthetic_events():
    mirror, ar = mirror_run(ByteTokenizer()), ar_run()
    feed = plots.Feed(7, ["ar", "mirror"])
    for run in (ar, mirror):
        for e in run.events:
            feed.add(plots.event_line(run.decoder, run.t0, e))
    feed.add(plots.end_line("mirror", speedup(ar, mirror)))
    lines = [line.split(" ") for line in feed.text().splitlines()]
    assert lines[0] == ["R", "7", "ar", "mirror"] and ["B", "mirror", "2", "cpu", "cpu"] in lines  # γ, target, draft device
    tokens = [float(f[2]) for f in lines if f[:2] == ["T", "mirror"]]
    assert len(tokens) == 6 and tokens[-1] == pytest.approx(35.0)         # ms since the run's RunStart.t0
    steps = [f[2:] for f in lines if f[:2] == ["S", "mirror"]]
    assert steps == [["1", "2", "1", "2", "0", "0"], ["2", "2", "2", "3", "1", "1"]]   # step D A n reused hit
    branches = [f for f in lines if f[:3] == ["P", "mirror", "draft"] and f[3] == "draft_branches"]
    assert [(float(f[4]), float(f[5])) for f in branches] == [pytest.approx((16.0, 19.0)), pytest.approx((30.0, 33.0))]
    assert lines[-1][:2] == ["E", "mirror"] and "2.00× vs AR (wall time)" in " ".join(lines[-1])
    assert all(len(f) == 7 for f in lines if f[0] == "P") and len(feed.text()) == len(feed.text())
    before = feed.text()
    feed.add(plots.event_line("ar", 0.0, TokenEvent(1, 0, 0, "target", False, 0.5)))
    assert feed.text().startswith(before) and feed.text().endswith("T ar 500.000\n")
    config = json.loads(plots.config_json())
    assert {k for k, _, _ in config["stages"]} == set(plots.STAGE_STYLE) and len(config["hits"]) == 2
    from dataclasses import replace as with_

    from mirror_core import LaneConfig, RunStart
    start = next(e for e in mirror.events if isinstance(e, RunStart))
    spread = LaneConfig("cuda:0", "cuda:2", "process", target_devices=("cuda:0", "cuda:1"))
    line = plots.event_line("mirror", 0.0, with_(start, settings=with_(start.settings, lanes=spread)))
    assert line == "B mirror 2 cuda:0+cuda:1 cuda:2\n"  # the lane timeline names non-CPU devices per row


def test_speedup_below_one_is_shown_and_token_counts_must_match():
    slow = ar_run(wall=0.036)
    value, kind = speedup(slow, mirror_run())
    assert value == pytest.approx(1.0) and kind == "wall time"
    value, kind = speedup(ar_run(wall=0.009, n=3), mirror_run())
    assert value == pytest.approx(0.5) and kind == "per-token time"
    html = numbers_html({"ar": ar_run(wall=0.018, n=6), "mirror": mirror_run()})
    assert "0.50×" in html and "Σ A_t / Σ D_t" in html
    # 6 tokens in 2 verification steps: shown, but marked too short to time instead of coloured as a loss
    assert "too short to time: 6 tokens committed (fewer than 16)" in html and "mirror-slow" not in html


def test_latency_model_from_spans():
    model = latency_model(mirror_run(), ar_run())
    assert model.t_pre == pytest.approx(0.004) and model.delta == pytest.approx(0.004)
    assert model.t_branch == pytest.approx(0.003) and model.t_rv_ee == pytest.approx(0.001)
    assert model.t_rv_fv == pytest.approx(0.001 + 0.001)   # accept + adopting a branch (hit path: steps that did)
    assert model.t_mirror == pytest.approx(0.004 + 0.001 + 0.004 + 0.002)
    assert model.expected_step == pytest.approx(model.t_mirror + 0.5 * model.t_fresh)
    assert model.speedup == pytest.approx(2.5 * 0.012 / model.expected_step)
    assert latency_model(None, None) is None
    from ui.numbers import latency_html
    why = html.unescape(latency_html(model, 1.2))  # no run's steps to quote: the model alone, said to be one
    assert "Modelled from this run's stage means: the branch rollouts (3.0 ms) fit inside the target's last layers " \
           "(Δ = 4.0 ms), so the draft is hidden" in why and "τ = 2.50 tokens" in why
    # with the runs: the measured steps and the wait first (the figures the verdict and the bars quote), the model's
    # after them and marked
    from ui.numbers import measured_step
    mirror = mirror_run()
    step, wait = measured_step(mirror)
    why = html.unescape(latency_html(model, 1.2, mirror, mirror))
    head, modelled = why.split("Modelled from the same stage means")
    assert f"Measured in this run: a Mirror-SD step took {1e3 * step:.2f} ms" in head
    assert f"the target waited {1e3 * wait:.2f} ms for the draft" in head and "fit inside" in head
    assert "+0.00 ms a step saved" in head and f"{1e3 * model.expected_step:.1f} ms against" in modelled


def test_inspector_shows_topk_probabilities_branches_and_fallback_reason():
    run = mirror_run(ByteTokenizer())
    miss = inspector_html(run, 1)
    assert "Miss → fallback" in miss and "0.607" in miss                # exp(-0.5)
    assert "rejected → c = x" in miss
    # branch rows grouped by slot: slot τ = 2's row reusable, slots 1 and 3 dimmed as unreachable
    assert "slot 1 · 2 branch(es) · unreachable" in miss and "slot 3 · 2 branch(es) · unreachable" in miss
    assert "slot 2 · 1 branch(es) · the correction's slot" in miss
    assert miss.count("mirror-unreachable") == 2 + 4  # two slot headings and their four rows
    hit = inspector_html(run, 2)
    assert "Hit" in hit and "branch row 2" in hit and "mirror-reused" in hit and "bonus" in hit
    assert "not in this run" in inspector_html(run, 9)
    assert "target sampled" not in miss and "Why d_j is not among slot j's candidates" in miss  # greedy: no column
    from dataclasses import replace as with_

    from mirror_core import SamplingConfig
    for rule, correction_from in (("exact", "from p_target"), ("rejection", "from the residual")):
        start = run.start
        request = with_(start.settings.request, sampling=SamplingConfig(temperature=0.8, rule=rule))
        sampled = with_(run, start=with_(start, settings=with_(start.settings, request=request)))
        page = inspector_html(sampled, 1)
        assert f"target sampled (Rule {'E' if rule == 'exact' else 'R'})" in page and correction_from in page
        assert ("= d_j (" in page) == (rule == "exact") and ("ratio test passed" in page) == (rule == "rejection")
        assert "its argmax is only its likeliest token" in page


def _values(**over) -> dict:
    return {"prompt": "p", "target": "t", "draft": "d", **DEFAULTS, "repeats": 1, **over}


def test_settings_map_to_configs_in_one_place():
    s = settings_from_ui(_values(prompt="hi", target=" t ", draft="", decoders=["mirror", "ar"], gamma=5.0, kappa=3,
                                 temperature=0.7, top_k=10, top_p=0.9, rule="rejection", max_new_tokens=32, seed=7))
    assert s.decoders == ("ar", "mirror") and s.draft is None and s.target == "t"
    assert s.spec.gamma == 5 and s.spec.exit_layer is None and s.sampling.rule == "rejection"
    (req,) = s.requests((1, 2))[1:]
    assert req.decoder == "mirror" and req.max_new_tokens == 32 and req.sampling.seed == 7
    for bad in ({"gamma": -1}, {"kappa": 2.5}, {"temperature": -1}, {"top_p": 0}, {"max_new_tokens": 0},
                {"format": "float64"}):
        with pytest.raises(MirrorError):
            settings_from_ui(_values(**bad))
    with pytest.raises(MirrorError, match="token ids"):
        parse_token_ids("not ids")
    assert parse_token_ids("1, 2 3") == parse_token_ids("1,2,3") == (1, 2, 3)  # the page's and the CLI's parser


def test_settings_take_every_control_by_name_and_nothing_else():
    assert set(CONTROLS) == {"prompt", "target", "draft", *DEFAULTS} and len(CONTROLS) == len(set(CONTROLS))
    positional = [_values()[name] for name in CONTROLS]
    assert settings_from_ui(controls_by_name(positional)) == settings_from_ui(_values())
    without_seed = {k: v for k, v in _values().items() if k != "seed"}
    with pytest.raises(MirrorError, match=r"^the run settings do not match the page's controls \(missing seed\)$"):
        settings_from_ui(without_seed)
    with pytest.raises(MirrorError, match=r"unknown 'colour'"):
        settings_from_ui(_values(colour="red"))
    with pytest.raises(MirrorError, match="must map control names to values, got list"):
        settings_from_ui(positional)
    with pytest.raises(MirrorError, match=f"a run takes {len(CONTROLS)} values"):
        controls_by_name(positional[:-1])


def test_a_control_is_one_entry_and_the_run_tab_builds_its_field(monkeypatch):
    """Every control of the table has its field on the Run tab (a number box, a checkbox or the rule's radio, with
    the table's label, default and help); a new entry gets its field in its row with no other edit to the page."""
    import gradio as gr

    from ui import run_tab
    from ui.settings import RUN_CONTROLS, Control

    extra = Control("temperature_floor", "Temperature floor", "A new knob.", 0.25, (0.0, 1.0), "floor", 0.05, "sampling")
    monkeypatch.setattr(run_tab, "RUN_CONTROLS", RUN_CONTROLS + (extra,))
    with gr.Blocks():
        fields = run_tab.build_controls([], []).fields
    assert list(fields) == ["prompt", "target", "draft", "format", "decoders",
                            *(c.name for row in run_tab.KNOB_ROWS for c in RUN_CONTROLS + (extra,) if c.row == row)]
    for c in RUN_CONTROLS + (extra,):
        field = fields[c.name]
        assert (field.label, field.info) == (c.label, c.info), c.name
        if c.row:
            kind = gr.Radio if c.name == "rule" else gr.Checkbox if isinstance(c.default, bool) else gr.Number
            assert isinstance(field, kind) and field.value == c.default, c.name
    assert fields["temperature_floor"].step == 0.05 and fields["gamma"].precision == 0


def test_bounds_and_their_help_come_from_the_engine_limits():
    from mirror_core.config import AUTO_BRANCH_BUDGET, MAX_GAMMA, MAX_KAPPA, MAX_NEW_TOKENS_CAP
    from ui.settings import APP_MAX_NEW_TOKENS

    assert BOUNDS["gamma"] == (0, MAX_GAMMA) and f"(0..{MAX_GAMMA})" in INFO["gamma"] and "0 = " in INFO["gamma"]
    assert BOUNDS["kappa"] == (0, MAX_KAPPA) and f"(0..{MAX_KAPPA})" in INFO["kappa"] and "0 = " in INFO["kappa"]
    assert BOUNDS["branch_budget"][0] == AUTO_BRANCH_BUDGET and "−1 = auto" in INFO["branch_budget"]
    assert BOUNDS["max_new_tokens"] == (1, APP_MAX_NEW_TOKENS) and APP_MAX_NEW_TOKENS <= MAX_NEW_TOKENS_CAP
    for name, (lo, hi) in BOUNDS.items():
        assert hi is None or lo <= DEFAULTS[name] <= hi, name
        with pytest.raises(MirrorError):  # one below the page's range is refused server-side too
            settings_from_ui(_values(**{name: lo - 1}))


def test_session_copies_start_fresh_and_examples_load():
    session = Session()
    session.runs["ar"] = ar_run()
    copied = copy.deepcopy(session)
    assert copied.runs == {} and copied.stop is not session.stop
    examples = load_examples("assets/examples.json")
    assert examples and all(isinstance(e, str) and e for e in examples)


def test_closing_a_session_stops_every_kind_of_work():
    session = Session()
    flags = (session.stop, session.replay_stop, session.experiment_stop)  # a run, a replay, a Learn-tab experiment
    assert not any(f.is_set() for f in flags)
    session.close()
    assert all(f.is_set() for f in flags)


def test_the_numbers_name_the_targets_function_and_the_drafts_format():
    from types import SimpleNamespace

    from mirror_core.kernels.formats import FUNCTIONS
    from mirror_core.records import Calibration, Timing
    from ui.numbers import dtype_line

    target = Calibration("target", "auto", "bfloat16", "bfloat16", (
        Timing("bfloat16", "step", 12.3), Timing("bfloat16", "window", 12.1)), note="the pair's format")
    draft = Calibration("draft", "auto", "float32", "bfloat16", (
        Timing("float32", "step", 1.9), Timing("float32", "rows", 13.5),
        Timing("bfloat16", "step", 2.6), Timing("bfloat16", "rows", 12.9)))
    on = SimpleNamespace(target="t", roofline=SimpleNamespace(kernel="avx2"))
    line = dtype_line(SimpleNamespace(**vars(on), target_dtype=target, draft_dtype=draft)).replace("&#x27;", "'")
    assert f"target: {FUNCTIONS['bfloat16']}; on the exact kernel" in line and "fastest window" not in line
    assert "its window of γ+1 12.1 ms at load" in line and "≈" not in line  # one verify cost: the fold's
    assert "draft: float32 (rows: bfloat16), the fastest step (1.9 ms) and branch rollout (12.9 ms)" in line
    asked = Calibration("target", "float32", "float32", "float32", note="asked for by name")
    forced = dtype_line(SimpleNamespace(**vars(on), target_dtype=asked, draft_dtype=None))
    assert f"target: {FUNCTIONS['float32']}" in forced and "(asked for by name)" in forced and "draft:" not in forced
    assert dtype_line(SimpleNamespace(**vars(on), target_dtype=None, draft_dtype=None)) == ""
    own = Calibration("draft", "auto", "q8_0", "q8_0", (Timing("q8_0", "step", 0.31), Timing("q8_0", "rows", 9.6)),
                      note="the pair's draft format: int8 activations on Q8_0 blocks")
    line = dtype_line(SimpleNamespace(**vars(on), target_dtype=target, draft_dtype=own)).replace("&#x27;", "'")
    assert "draft: q8_0 (the pair's draft format: int8 activations on Q8_0 blocks), its step 0.31 ms and branch " \
           "rollout 9.6 ms" in line and "fastest step" not in line


def test_the_roofline_view_plots_the_forward_by_rows_against_both_limits_and_says_where_the_ridge_is():
    from dataclasses import replace as with_

    from mirror_core.records import Roofline
    from ui.learn.tab import GLOSSARY
    from ui.learn.roofline import ridge_rows, roofline_figure, roofline_sentence, roofline_view

    # 100 MB at 10 GB/s: a 10 ms memory limit; 2 · 50 M multiply-adds at 50 GFLOP/s: 2 ms of arithmetic per row, so
    # the rows are memory-bound at 1..4 (2..8 ms < 10), meet at 5 and are compute-bound at 8 (16 ms)
    roof = Roofline("avx512", "", "bfloat16", 100_000_000, 10.0, (12.5, 12.6, 12.8, 13.0, 13.5, 14.6, 16.8, 19.0),
                    50_000_000, 50.0)
    assert ridge_rows(roof) == pytest.approx(5.0)
    traces = {t.name: t for t in roofline_figure(roof).data}
    assert list(traces) == ["measured at load", "memory limit: weights ÷ bandwidth",
                            "compute limit: arithmetic ÷ peak rate", "modelled: the larger limit"]
    measured, memory, compute, modelled = traces.values()
    assert measured.mode == "lines+markers" and list(measured.x) == list(range(1, 9)) and measured.y == roof.rows_ms
    assert list(memory.y) == pytest.approx([10.0] * 8)
    assert list(compute.y) == pytest.approx([2.0 * m for m in range(1, 9)])
    assert modelled.line.dash == "dash" and list(modelled.y) == pytest.approx([10.0] * 5 + [12.0, 14.0, 16.0])
    assert all(memory.y[m - 1] >= compute.y[m - 1] for m in range(1, 5)) and compute.y[7] > memory.y[7]
    figure = roofline_figure(roof)
    assert [s.x0 for s in figure.layout.shapes] == [pytest.approx(5.0)]          # the ridge, marked at 5 rows
    assert tuple(figure.layout.xaxis.range) == (0.5, 8.5)  # fixed: a phone's autorange started the axis at -2 rows
    title = figure.layout.title  # under the toolbar row (its top 40 px), the plot's top margin holding its 2 lines
    assert title.yref == "container" and title.pad.t >= 40 and figure.layout.margin.t >= title.pad.t + 40
    assert figure.layout.annotations[0].text == "ridge ≈ 5.0 rows"
    text = roofline_sentence(roof, gamma=3)
    assert "the step reaches 80% of the roofline" in text and "(100 MB of weights ÷ 10.0 GB/s) is 10.0 ms" in text
    assert ("a window of γ+1 = 4 rows cost 1.04 of the lane's one-row forwards, measured at load: verifying a window "
            "is nearly free") in text
    assert "crosses the memory line at the ridge, 5.0 rows" in text and "stops paying more per extra row" in text
    assert "A window of γ+1 = 8 rows is past the ridge" in roofline_sentence(roof, gamma=7)
    cheap = with_(roof, peak_gflops=500.0)                                        # the ridge at 50 rows: off the chart
    assert not roofline_figure(cheap).layout.shapes
    assert "stays under the memory line for all 8 rows" in roofline_sentence(cheap)
    assert [t.name for t in roofline_figure(with_(roof, read_gbs=0.0, peak_gflops=0.0)).data] == ["measured at load"]
    assert "the ridge is unknown" in roofline_sentence(with_(roof, peak_gflops=0.0))
    assert {"roofline step", "read bandwidth", "weight bytes per token", "compute limit", "ridge",
            "share of the roofline", "window cost"} <= {term for term, _ in GLOSSARY}  # each figure defined on the page
    run = mirror_run()
    run.start = with_(run.start, settings=with_(run.start.settings, roofline=roof))
    session = Session()
    session.history.append(run)
    shown, note = roofline_view(session)
    assert len(shown.data) == 4 and html.escape(roofline_sentence(roof, gamma=2)) in note  # the run's γ = 2


def test_the_roofline_view_says_it_appears_after_a_run_before_any_run():
    from ui.learn.roofline import roofline_view

    figure, note = roofline_view(Session())
    assert figure is None and "The roofline appears after a run" in note and "error" not in note.lower()
    session = Session()
    session.history.append(mirror_run())                                           # a run whose target recorded none
    figure, note = roofline_view(session)
    assert figure is None and "recorded no roofline" in note and "FastLlamaRunner" in note


def test_at_t_above_zero_the_numbers_say_whether_texts_match_ar_and_why():
    from dataclasses import replace as with_

    from mirror_core import SamplingConfig
    from ui.numbers import sampling_line

    def sampled(run, rule):
        request = with_(run.start.settings.request, sampling=SamplingConfig(temperature=0.8, rule=rule))
        return with_(run, start=with_(run.start, settings=with_(run.start.settings, request=request)))

    ar, mirror = ar_run(), mirror_run()  # different token ids
    assert sampling_line([ar, mirror]) == ""  # greedy: nothing to explain
    page = html.unescape(sampling_line([sampled(ar, "rejection"), sampled(mirror, "rejection")]))
    assert "Rule R" in page and "Mirror-SD wrote a different text: different text, same distribution." in page
    page = html.unescape(sampling_line([sampled(ar, "exact"), sampled(ar, "exact")]))
    assert "Rule E" in page and "every decoder's text is AR's." in page
    assert "Rule R" in html.unescape(numbers_html({"ar": sampled(ar, "rejection"), "mirror": sampled(mirror, "rejection")}))


def test_a_special_token_shows_in_the_stream_but_not_in_the_copyable_text():
    class ChatTokenizer(ByteTokenizer):
        all_special_ids = [ord("!")]  # as <|im_end|> ends a chat turn

    run = mirror_run(ChatTokenizer())
    assert plain_text(run) == "éxyz" and plain_text(run, upto=len(run.pieces)) == "éxyz"
    stream = stream_html(run)
    assert stream.count("mirror-special") == 1 and "not part of the text" in stream and ">!</span>" in stream
