"""The context draft (mirror_core/context_draft.py): its index against a brute-force search, the latency model's
choice, Rule R's law with a point-mass draft, and every decoder's greedy tokens with it on and off, on prompts that
copy and prompts that do not, up to the token budget and EOS."""
from __future__ import annotations

import random

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
from mirror_core.config import CONTEXT_NGRAM, ContextConfig, MirrorError, SamplingConfig
from mirror_core.context_draft import MATCH_CAP, ContextIndex, ContextPlan
from mirror_core.draft_choice import ChoicePlan, WindowChooser
from mirror_core.draft_worker import point_mass
from mirror_core.metrics import SOURCES
from mirror_core.verify import accept
from testing.toy_models import build_pair, hf_greedy

CONTEXT = SOURCES.index("context")
OFF = ContextConfig(enabled=False)


def brute_match(tokens: list[int]) -> tuple[int, int]:
    """The longest suffix of 1..CONTEXT_NGRAM tokens seen before (its latest occurrence with a token after it),
    then measured backwards up to MATCH_CAP."""
    size = len(tokens)
    for n in range(min(CONTEXT_NGRAM, size - 1), 0, -1):
        for s in range(size - n - 1, -1, -1):
            if tokens[s:s + n] == tokens[size - n:]:
                m = n
                while m < MATCH_CAP and s + n - m - 1 >= 0 and tokens[s + n - m - 1] == tokens[size - m - 1]:
                    m += 1
                return m, s + n
    return 0, -1


@pytest.mark.parametrize("vocab", [2, 5, 40])
def test_the_index_finds_what_a_brute_force_search_finds(vocab):
    rng = random.Random(vocab)
    tokens = [rng.randrange(vocab) for _ in range(300)]
    tokens += tokens[40:140]  # a long copy: matches longer than the n-grams, capped at MATCH_CAP
    index = ContextIndex()
    for i, t in enumerate(tokens):
        index.extend([t])
        assert index.match() == brute_match(tokens[: i + 1]), i
    assert vocab < 40 or index.match()[0] == MATCH_CAP  # (in a small vocabulary the latest 8-gram is elsewhere)


def test_the_cost_by_rows_extends_along_the_last_timed_slope():
    plan = ChoicePlan(True, 64, (1.0, 1.1, 1.2, 1.4))
    assert plan.steps(3) == 1.2 and plan.steps(6) == pytest.approx(1.4 + 2 * 0.15)
    assert ChoicePlan(True, 64, ()).steps(5) == pytest.approx(2.0)  # not timed: the stated assumption


def chooser(prompt, max_new=64, zero_windows=False, gamma=4) -> WindowChooser:
    plan = ChoicePlan(zero_windows, max_new, tuple(1 + 0.1 * r for r in range(8)), 0.005, ContextPlan(2, 16))
    return WindowChooser(plan, gamma, prompt)


def test_the_drafter_copies_long_matches_and_learns_from_misses():
    text = list(range(100, 140))
    long = chooser(text)
    long.learn(0, 0.0, 0.0, text[:20])              # the output so far repeats the first 20 tokens of the prompt
    choice = long.choose(False, 1)
    proposal = long.proposal
    assert choice.chosen.source == "context" and proposal.match == 20
    assert proposal.tokens == tuple(text[20:20 + len(proposal.tokens)]) == tuple(text[20:20 + choice.chosen.size])
    assert len(proposal.tokens) > 4 and proposal.expected > 1 + 4 * 0.5   # longer than γ: the evidence pays for it
    long.learn(len(proposal.tokens), 0.0, 0.0, [7])  # nothing matches a fresh token: the model drafts
    assert long.choose(False, 1).chosen.source == "model"
    short = chooser([1, 2, 3, 9, 1, 2])
    first = short.choose(False, 1)
    assert first.chosen.source == "context" and short.proposal.match == 2
    for _ in range(60):                            # its proposals at this match length keep failing
        short.context.learn(short.proposal, 0)
    assert short.choose(False, 1).chosen.source == "model"
    near_end = chooser(text, max_new=3)
    near_end.learn(0, 0.0, 0.0, text[:2])          # 1 token left in the budget: a 1-token window (then c) at most
    assert near_end.choose(False, 1).chosen.source == "context" and near_end.proposal.tokens == (text[2],)


def test_rule_r_with_a_point_mass_draft_gives_the_targets_law():
    """A context token d is a point mass: accepted with probability p_target(d), else c ~ p_target without d; the
    token emitted at the slot is distributed as p_target."""
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0], [0.0] * 5])           # [2, V]: slot 1, then the bonus slot
    p_target = torch.softmax(logits[0], -1)
    cfg = SamplingConfig(temperature=1.0, rule="rejection")
    gen = torch.Generator().manual_seed(0)
    n, counts = 5000, torch.zeros(5)
    for _ in range(n):
        r = accept(logits, [0], cfg, 0, point_mass((0,), 5), gen)
        counts[0 if r.accepted else r.token] += 1
    assert torch.allclose(counts / n, p_target, atol=0.025)  # ≈ 3.5 σ at p = 0.5, (counts / n, p_target)


@pytest.fixture(scope="module")
def pair(llama_with_drafts):
    return llama_with_drafts


COPYING = [tuple(range(10, 40)) + tuple(range(10, 16)),   # the prompt already repeats: the answer can copy it
           (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5) * 3]
OPEN = [(5, 17, 42, 8)]
SETTINGS = [ContextConfig(), OFF, ContextConfig(min_match=1, max_window=3)]


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_every_decoder_equals_ar_with_the_context_draft_on_and_off(pair, draft_kind):
    target, draft, fdraft = pair
    context_steps = 0
    with MirrorEngine.load(target, draft if draft_kind == "token" else fdraft,
                           LaneConfig(kind="inline", dtype="float32")) as engine:
        for prompt in COPYING + OPEN:
            want = hf_greedy(target, prompt, 40)
            for decoder in ("ar", "sd", "mirror"):
                for context in SETTINGS if decoder != "ar" else SETTINGS[:1]:
                    end = engine.generate(Request(prompt, decoder, 40, spec=SpecConfig(gamma=3, kappa=2,
                                                                                       context=context)))
                    assert end.error is None and end.fallback is None
                    assert list(end.token_ids) == want, (prompt, decoder, context)
                    context_steps += end.summary.source_steps[CONTEXT]
                    assert context.enabled or end.summary.source_steps[CONTEXT] == 0
    assert context_steps > 20  # context windows ran, not only the model's


def test_context_tokens_are_marked_and_counted(pair):
    target, draft, _ = pair
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        events = list(engine.stream(Request(COPYING[1], "sd", 40, spec=SpecConfig(gamma=2, kappa=1))))
    marked = [e for e in events if type(e).__name__ == "TokenEvent" and e.from_context]
    records = [e for e in events if type(e).__name__ == "StepRecord" and e.source == "context"]
    summary = events[-1].summary
    assert marked and records and all(r.context is not None and len(r.context.tokens) == r.drafted for r in records)
    assert summary.source_accepted[CONTEXT] == sum(r.accepted for r in records)
    assert len(marked) == sum(min(r.accepted, r.committed) for r in records)  # the budget may cut the last step
    by = summary.to_dict()["by_source"]["context"]
    assert by["steps"] == len(records) and by["acceptance"] == by["accepted"] / by["proposed"]


@pytest.mark.parametrize("max_new", [1, 3, 7])
def test_a_match_past_the_budget_stops_at_the_budget(pair, max_new):
    target, draft, _ = pair
    want = hf_greedy(target, COPYING[1], max_new)
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        for decoder in ("sd", "mirror"):
            end = engine.generate(Request(COPYING[1], decoder, max_new, spec=SpecConfig(gamma=2, kappa=1)))
            assert list(end.token_ids) == want


def test_a_match_that_runs_into_eos_stops_there(tmp_path):
    base, _ = build_pair(str(tmp_path), "llama", seed=7)
    prompt = COPYING[1]
    eos = hf_greedy(base, prompt, 30)[9]  # a token the target emits, and the prompt may hold: the run ends there
    target, draft = build_pair(str(tmp_path / "eos"), "llama", seed=7, eos=eos)
    want = hf_greedy(target, prompt, 30)
    assert want[-1] == eos and len(want) <= 10
    with MirrorEngine.load(target, draft, LaneConfig(kind="inline", dtype="float32")) as engine:
        for decoder in ("sd", "mirror"):
            assert list(engine.generate(Request(prompt, decoder, 30)).token_ids) == want


def test_bad_context_settings_are_refused():
    for bad in (dict(min_match=0), dict(max_window=17), dict(enabled="yes")):
        with pytest.raises(MirrorError, match="context"):
            ContextConfig(**bad)


def test_costs_become_what_the_run_measured():
    """Once the target lane has timed a verification, costs are the run's own (s): the window's pass at its row count,
    or the load's figure rescaled, plus the mean wait for a window from that source beyond the draft's work."""
    costs = chooser([1, 2, 3]).costs
    assert costs.verify(3) == pytest.approx(1.2 * 0.005)                  # nothing timed yet: the load's
    costs.learn(3, 0.006, "model", 0.003)                                 # a model window of 3 rows
    per_step = 0.006 / 1.2
    assert costs.verify(3) == pytest.approx(0.006) and costs.wait("model") == pytest.approx(0.003)
    assert costs.verify(5) == pytest.approx(1.4 * per_step)               # rescaled load figure
    assert costs.wait("context") == pytest.approx(0.003)                  # no context wait yet: any source's mean
