"""The draft's training data (train/chat_data.py, train/chat_sources.py) on a tiny Llama target with a word-level
tokenizer and a chat template: every source writes well-formed records, multi-turn records say where the target's
own tokens lie, a second run skips finished shards, and the held-out guard keeps the held-out topics out."""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from training.draft import chat_data as CD
from training.draft import chat_prompts as P
from training.draft import chat_sources as S
from testing.toy_models import VOCAB, build_pair

WORDS = ["[UNK]", "<eos>", "user", "assistant", ":", "?", "what", "is", "how", "do", "bees", "work"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> str:
    """A 2-layer toy target (eos = id 1) with a word-level tokenizer and a chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    target, _ = build_pair(str(tmp_path_factory.mktemp("pair")), "llama", target_layers=2, eos=1)
    words = WORDS + [f"w{i}" for i in range(VOCAB - len(WORDS))]
    inner = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    inner.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", eos_token="<eos>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(target)
    return target


def _cfg(target: str, out, **over) -> S.DataConfig:
    return S.DataConfig(**{"out": str(out), "target": target, "batch": 4, "new_tokens": 5, "limit": 6,
                           "threads": 1, "dtype": "float32", "feature_layer": 1, "topk": 4, **over})


def _same(a: list[dict], b: list[dict]) -> bool:
    """Two shards' records are equal, tensors (the recorded teacher figures) included."""
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k]
                                     for k in x) for x, y in zip(a, b))


def _records(folder: str, stage: int | None = None) -> list[dict]:
    pattern = f"answers_s{stage}_*.pt" if stage else "answers_*.pt"
    return [r for p in sorted(glob.glob(os.path.join(folder, pattern))) for r in torch.load(p)]


def test_every_source_writes_well_formed_records_and_the_manifest_counts_them(chat_target, tmp_path):
    cfg = _cfg(chat_target, tmp_path / "data", sources=S.SOURCES)
    CD.generate(cfg)
    manifest = json.load(open(tmp_path / "data" / "manifest.json"))
    assert set(manifest["sources"]) == set(S.SOURCES) and manifest["cpu"]
    for source in S.SOURCES:
        rows = _records(str(tmp_path / "data" / source))
        assert rows and manifest["sources"][source]["answer_tokens"] == sum(len(r["answer"]) for r in rows)
        for r in rows:
            ids = r["prompt"] + r["answer"]
            assert r["source"] == source and all(0 <= i < VOCAB for i in ids) and 1 <= len(r["answer"]) <= 5
            assert r["answer_spans"][-1] == [len(r["prompt"]), len(ids)]
            assert (r["temperature"] in cfg.temperatures) == (source == "sampled" or r["stage"] == 1 and
                                                              source == "self_questions")
    assert manifest["answer_tokens"] == sum(p["answer_tokens"] for p in manifest["sources"].values())


def test_a_follow_up_chat_says_where_the_targets_first_answer_lies(chat_target, tmp_path):
    CD.generate(_cfg(chat_target, tmp_path, sources=("multi_turn",)))
    first = {r["user"][0]: r["answer"] for r in _records(str(tmp_path / "multi_turn"), 1)}
    second = _records(str(tmp_path / "multi_turn"), 2)
    assert len(second) == len(first) == 6
    for r in second:
        (s0, e0), (s1, e1) = r["answer_spans"]
        answer = first[r["user"][0]]
        assert r["prompt"][s0:e0] == (answer[:-1] if answer[-1] == 1 else answer)  # the ids as generated, eos apart
        assert r["user"][1] in P.FOLLOW_UPS and e0 < s1 == len(r["prompt"])


def test_a_second_run_skips_finished_shards_and_remakes_a_missing_one_identically(chat_target, tmp_path, monkeypatch):
    cfg = _cfg(chat_target, tmp_path, sources=("sampled",), limit=8)
    CD.generate(cfg)
    folder = str(tmp_path / "sampled")
    shards = sorted(glob.glob(os.path.join(folder, "answers_s1_*.pt")))
    assert len(shards) == 2
    kept, lost = torch.load(shards[0]), torch.load(shards[1])
    os.remove(shards[1])  # as if the run had stopped before its last shard
    calls = []
    real = CD.Target.answer
    monkeypatch.setattr(CD.Target, "answer", lambda self, jobs, g: calls.append(len(jobs)) or real(self, jobs, g))
    CD.generate(cfg)
    assert calls == [4] and _same(torch.load(shards[0]), kept) and _same(torch.load(shards[1]), lost)
    record = json.load(open(os.path.join(folder, "generation.json")))
    assert record["records"] == 8 and record["answer_tokens"] == sum(len(r["answer"]) for r in kept + lost)


def test_the_topic_prompt_set_keeps_its_flat_layout(chat_target, tmp_path):
    CD.main(["--target", chat_target, "--out", str(tmp_path), "--held-out", "--limit", "3", "--new-tokens", "4",
             "--dtype", "float32", "--threads", "1", "--feature-layer", "0"])
    rows = _records(str(tmp_path))
    assert len(rows) == 3 and os.path.exists(tmp_path / "answers_0000.pt")
    assert all(P.held_out_mention(r["user"][0]) for r in rows)  # the held-out set is made of exactly those topics
    assert json.load(open(tmp_path / "generation.json"))["answer_tokens"] == sum(len(r["answer"]) for r in rows)
    assert not any("feat" in r for r in rows)  # --feature-layer 0: no teacher figures recorded
    with pytest.raises(SystemExit, match="layers 1..1"):  # the last layer's state is read after the final norm
        CD.Target(_cfg(chat_target, tmp_path, feature_layer=2))


def test_generation_records_the_teacher_pass_a_full_forward_would_compute(chat_target, tmp_path):
    """Every record's feat (h after layer 1 at positions 0..L−2) and top-k (before each answer token) equal an unpadded
    full forward of its prompt + answer: greedy rows, sampled rows (the label is the target's argmax, not the drawn
    token) and left-padded short prompts alike."""
    from transformers import AutoModelForCausalLM

    CD.generate(_cfg(chat_target, tmp_path, sources=("templated", "sampled"), limit=5, batch=5, new_tokens=6))
    model = AutoModelForCausalLM.from_pretrained(chat_target, dtype=torch.float32).eval()
    rows = _records(str(tmp_path / "templated")) + _records(str(tmp_path / "sampled"))
    assert len({len(r["prompt"]) for r in rows}) > 1  # some rows were left-padded
    for r in rows:
        ids = torch.tensor([r["prompt"] + r["answer"]])
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        p, n = len(r["prompt"]), ids.shape[1]
        assert r["feat_layer"] == 1 and r["feat"].dtype == torch.bfloat16 and r["feat"].shape == (n - 1, 64)
        torch.testing.assert_close(r["feat"].float(), out.hidden_states[1][0, : n - 1], atol=2e-2, rtol=2e-2)
        top = out.logits[0, p - 1: n - 1].topk(4, dim=-1)                              # [A, 4]
        assert torch.equal(r["top_ids"].long(), top.indices), r["source"]
        torch.testing.assert_close(r["top_logits"].float(), top.values, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("speedup, chosen", [(2.0, "bfloat16"), (0.12, "float32")])  # bf16 units; AVX2 only
def test_auto_dtype_is_resolved_by_measurement_and_the_records_name_what_ran(chat_target, tmp_path, monkeypatch,
                                                                             speedup, chosen):
    from training import precision

    monkeypatch.setattr(precision, "bf16_speedup", lambda: speedup)
    CD.generate(_cfg(chat_target, tmp_path, sources=("code",), limit=2, batch=2, dtype="auto", feature_layer=0))
    shard = json.load(open(tmp_path / "code" / "generation.json"))["shards"]["answers_s1_0000.pt"]
    assert json.load(open(tmp_path / "manifest.json"))["dtype"] == chosen and shard["dtype"] == chosen


def test_the_guard_refuses_every_held_out_topic_and_passes_every_training_prompt():
    with open(os.path.join(os.path.dirname(__file__), "..", "assets", "chat_prompts.jsonl"), encoding="utf-8") as f:
        bench = [json.loads(line)["turns"][0] for line in f if line.strip()]
    held = list(P.HELD_OUT_TOPICS + P.HELD_OUT_CODE) + P.topic_prompts(held_out=True, more=True) + bench
    for text in held:
        with pytest.raises(P.HeldOutTopic):
            P.check_prompt(text)
    requests = [r.format(n=5, t=t) for t in P.TOPICS + P.NEW_TOPICS for r in P.QUESTION_REQUESTS]
    training = S.wide_prompts() + S.code_prompts() + requests + list(P.FOLLOW_UPS) + P.topic_prompts(more=True)
    assert [t for t in training if P.held_out_mention(t)] == []
    assert P.held_out_mention("How do comets form?") == "comets" and P.held_out_mention("Honeybees dance.") is None


def test_a_question_the_target_writes_on_a_held_out_topic_is_dropped_and_counted(chat_target):
    from transformers import AutoTokenizer

    chat = S.ChatTokens(AutoTokenizer.from_pretrained(chat_target))
    stage1 = [{"answer": chat.tok("what is bees ? how do w5 w6 work ? w7").input_ids + [1], "topic": "w3"}]
    plan = S.STAGES["self_questions"][1](chat, _cfg(chat_target, "unused"), stage1)
    assert plan.notes == {"refused": 1, "unparsed": 0, "questions": 1}
    assert [j.meta["user"] for j in plan.jobs] == [["how do w5 w6 work ?"]]


def test_a_fixed_table_that_names_a_held_out_topic_fails_loudly(chat_target, monkeypatch):
    from transformers import AutoTokenizer

    chat = S.ChatTokens(AutoTokenizer.from_pretrained(chat_target))
    monkeypatch.setattr(P, "NEW_TOPICS", P.NEW_TOPICS + ("penguins",))
    with pytest.raises(P.HeldOutTopic, match="penguins"):
        S.STAGES["templated"][0](chat, _cfg(chat_target, "unused"), [])


def test_questions_are_parsed_from_lists_and_run_on_text():
    text = ("Here are some questions:\n1. What is rain?\n2) **Why is the sky blue?**\n- What is rain?\n"
            "* How do clouds form? What makes snow white?\nQ5: Short?\nThis line is not a question.")
    assert S.parse_questions(text, 10) == ["What is rain?", "Why is the sky blue?", "How do clouds form?",
                                           "What makes snow white?"]
    assert S.parse_questions(text, 2) == ["What is rain?", "Why is the sky blue?"]


def test_the_row_sampler_keeps_greedy_rows_and_samples_the_others_reproducibly():
    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    temps = torch.tensor([0.0, 1.0, 0.7])
    first = CD.RowSampler(temps, torch.Generator().manual_seed(7))(None, scores)
    again = CD.RowSampler(temps, torch.Generator().manual_seed(7))(None, scores)
    assert torch.equal(first[0], scores[0]) and torch.equal(first, again)
    assert (torch.isfinite(first[1:]).sum(dim=1) == 1).all()
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).expand(40_000, 5)   # 40,000 draws of one row at T 0.7
    drawn = CD.RowSampler(torch.full((40_000,), 0.7), torch.Generator().manual_seed(3))(None, z).argmax(-1)
    freq = torch.bincount(drawn, minlength=5) / 40_000
    torch.testing.assert_close(freq, torch.softmax(z[0] / 0.7, -1), atol=0.01, rtol=0)  # σ ≤ 0.0025 per token
    assert freq[4] == 0  # a token of probability ~1e-19 is never drawn


@pytest.mark.parametrize("over, message", [
    ({"sources": ("templated", "poems")}, "unknown source"), ({"dtype": "int8"}, "dtype"),
    ({"temperatures": (0.0,)}, "temperatures"), ({"sources": ("code",), "more": True}, "topic-prompt set"),
    ({"batch": 0}, "batch"), ({"feature_layer": -1}, "feature_layer"), ({"topk": 0}, "topk")])
def test_bad_settings_are_refused_with_a_reason(over, message):
    with pytest.raises(ValueError, match=message):
        S.DataConfig(out="x", **over)


def test_the_cli_turns_a_bad_flag_into_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        CD.main(["--out", "x", "--sources", "templated,nope"])
    assert "unknown source" in capsys.readouterr().err


def test_the_teacher_pass_reads_what_generation_recorded_and_computes_the_rest(chat_target, tmp_path):
    """feature_distill's teacher pass over a chosen subset of two folders: records with figures at its layer are
    copied exactly, records without (made with --feature-layer 0) are computed by a forward pass; the cache is named
    by its content, and the data-volume probe's subsets are seeded and hold what they were asked for."""
    from transformers import AutoModelForCausalLM

    from training.draft.answers import data_subset, load_sequences
    from training.draft.teacher import teacher_pass, teacher_path

    CD.generate(_cfg(chat_target, tmp_path / "rec", sources=("templated",), limit=6, batch=3))
    CD.generate(_cfg(chat_target, tmp_path / "old", sources=("code",), limit=3, batch=3, feature_layer=0))
    folders = [str(tmp_path / "rec" / "templated"), str(tmp_path / "old" / "code")]
    pool = [s for f in folders for s in load_sequences(f)]
    keep = [1, 4, 5, 6, 8]  # three recorded records, then two of the code folder's (no figures)
    seqs = [pool[i] for i in keep]
    path = teacher_path(str(tmp_path), "t", seqs, 1, 4, chat_target, "bfloat16")
    t = teacher_pass(folders, keep, seqs, chat_target, 1, 4, path, "bfloat16")
    assert t["recorded"] == 3 and os.path.exists(path)
    assert path not in (teacher_path(str(tmp_path), "t", seqs, 2, 4, chat_target, "bfloat16"),
                        teacher_path(str(tmp_path), "t", seqs, 1, 4, str(tmp_path), "bfloat16"),
                        teacher_path(str(tmp_path), "t", seqs, 1, 4, chat_target, "float32"))
    records = _records(folders[0])
    model = AutoModelForCausalLM.from_pretrained(chat_target, dtype=torch.float32).eval()
    for i, (p, a) in enumerate(seqs):
        f0, a0, n = t["fstart"][i], t["astart"][i], len(p) + len(a)
        if i < 3:
            r = records[keep[i]]
            assert (r["prompt"], r["answer"]) == (p, a) and torch.equal(t["feat"][f0: f0 + n - 1], r["feat"])
            assert torch.equal(t["top_ids"][a0: a0 + len(a)], r["top_ids"])
            continue
        with torch.no_grad():
            out = model(input_ids=torch.tensor([p + a]), output_hidden_states=True)
        torch.testing.assert_close(t["feat"][f0: f0 + n].float(), out.hidden_states[1][0], atol=5e-2, rtol=5e-2)
        agree = t["top_ids"][a0: a0 + len(a), 0].long() == out.logits[0, len(p) - 1: n - 1].argmax(-1)
        assert agree.float().mean() >= 0.8  # a bfloat16 pass against float32: near-ties may differ
    assert torch.equal(teacher_pass(folders, keep, seqs, chat_target, 1, 4, path, "bfloat16")["feat"], t["feat"])  # cached
    tokens = sum(len(a) for _, a in pool) // 2
    half = data_subset(pool, tokens, torch.Generator().manual_seed(0))
    assert half == sorted(half) and sum(len(pool[i][1]) for i in half) >= tokens and len(half) < len(pool)
    assert half == data_subset(pool, tokens, torch.Generator().manual_seed(0))
    assert data_subset(pool, 0, torch.Generator()) == list(range(len(pool)))
