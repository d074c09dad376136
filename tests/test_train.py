"""CPU tests for the training pipeline: corpus split, tokenizer, batches, losses and the CLI end to end."""
import dataclasses
import json
import math
import os
import shutil
import sysconfig

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from mirror_core.models.ss_draft import SSDraftForCausalLM
from training.toy_pair import build, cli, data, evaluate, losses, trainer
from training.toy_pair.config import TrainConfig

pytestmark = pytest.mark.slow  # training runs (the slow tier)

STDLIB = sysconfig.get_paths()["stdlib"]
TINY_FLAGS = ["--budget-minutes", "0.05", "--max-steps", "15", "--vocab-size", "320", "--context", "32",
              "--hidden-size", "32", "--intermediate-size", "64", "--num-heads", "4", "--num-kv-heads", "2",
              "--target-layers", "4", "--draft-layers", "1", "--ss-layers", "2", "--batch-size", "4",
              "--warmup-steps", "5", "--eval-chunks", "4", "--n-prompts", "4", "--sample-tokens", "10",
              "--ss-init", "target"]  # a 2-layer SS draft from the target's first layers (the drafts-only run: from AR)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> str:
    """A toy corpus: six small stdlib modules (code) and four pydoc topics as .txt files (prose)."""
    root = tmp_path_factory.mktemp("toy")
    for name in ("bisect", "colorsys", "heapq", "textwrap", "keyword", "fnmatch"):
        shutil.copy(os.path.join(STDLIB, f"{name}.py"), root / f"{name}.py")
    topics = data._pydoc_topics(STDLIB)
    for key in sorted(topics)[:4]:
        (root / f"{key}.txt").write_text(topics[key][:6000])
    return str(root)


@pytest.fixture(scope="module")
def toy_tokenizer(toy_dir):
    return data.train_tokenizer(data.load_corpus(toy_dir), 320)


def test_split_is_by_document_name_and_deterministic(toy_dir, tmp_path):
    first, second = data.load_corpus(toy_dir), data.load_corpus(toy_dir)
    assert [(d.name, d.split) for d in first.documents] == [(d.name, d.split) for d in second.documents]
    assert first.manifest["sha256"] == second.manifest["sha256"]
    assert data.stable_hash("os.py") % 1000 == 892  # sha256-based: the same on every machine and process
    assert data.split_of("asyncio/futures.py", 30) == "val" and data.split_of("os.py", 30) == "train"
    for kind in ("code", "prose"):
        assert first.select("val", kind) and first.select("train", kind)
    shutil.copytree(toy_dir, tmp_path / "more")
    (tmp_path / "more" / "extra.py").write_text("x = 1\n")
    grown = {d.name: d.split for d in data.load_corpus(str(tmp_path / "more")).documents}
    assert all(grown[d.name] == d.split for d in first.documents)


def test_default_corpus_is_the_filtered_stdlib():
    corpus = data.load_corpus()
    names = [d.name for d in corpus.documents]
    assert names == sorted(names)
    assert not any(n.split("/")[0] in data.EXCLUDED_DIRS for n in names if "::" not in n)
    assert sum(n.startswith(data.TOPICS_PATH + "::") for n in names) > 50
    counts = corpus.manifest["documents"]
    assert counts["train"]["code"] + counts["val"]["code"] > 500
    assert 0 < counts["val"]["code"] < counts["train"]["code"] / 10


def test_tokenizer_saves_loads_and_round_trips(toy_tokenizer, tmp_path):
    toy_tokenizer.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    eot = tok.convert_tokens_to_ids(data.EOT)
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == tok.unk_token_id == eot
    for text in ["def f(x):\n\treturn x  # ünïcødé ✓ 日本\n", "  leading and trailing  \n\n", "a<|endoftext|>b"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert len(tok) == 320


def test_batches_are_reproducible_and_shifted(toy_dir, toy_tokenizer):
    corpus = data.load_corpus(toy_dir)
    stream = data.token_stream(toy_tokenizer, corpus.select("train"), upsample_prose=3)
    assert stream[0] == toy_tokenizer.convert_tokens_to_ids(data.EOT)
    x1, y1 = data.sample_batch(stream, 4, 16, torch.Generator().manual_seed(5))
    x2, y2 = data.sample_batch(stream, 4, 16, torch.Generator().manual_seed(5))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    chunks = data.eval_chunks(stream, 16, 3)  # [3, 17]
    assert chunks.shape == (3, 17) and torch.equal(chunks[1, 0], chunks[0, 16])
    prompts = data.heldout_prompts(toy_tokenizer, corpus, 4, prompt_tokens=12)
    assert {p.kind for p in prompts} == {"code", "prose"} and all(len(p.ids) <= 12 for p in prompts)
    assert len(prompts) == 4 and all(p.following == () for p in prompts)
    spread = data.heldout_prompts(toy_tokenizer, corpus, 6, prompt_tokens=12, following_tokens=5, stride=16)
    docs = {p.kind: {d.name: d for d in corpus.select("val", p.kind)} for p in spread}
    assert any(not p.source.endswith("@0") for p in spread)  # not only file heads
    for p in spread:  # prompt + following are the document's own consecutive tokens
        name, off = p.source.rsplit("@", 1)
        ids = toy_tokenizer.encode(docs[p.kind][name].text, add_special_tokens=False)
        head = [toy_tokenizer.convert_tokens_to_ids(data.EOT)] if off == "0" else []
        assert list(p.ids + p.following) == (head + ids[int(off):])[:17] and len(p.following) <= 5


def test_ss_loss_labels_streams_with_later_tokens():
    vocab, t = 7, 6
    targets = torch.arange(t)[None] % vocab  # [1, T]: token t+1 at index t
    sharp = lambda ids: torch.nn.functional.one_hot(ids, vocab).float() * 50  # noqa: E731
    main = sharp(targets)  # [1, T, V]
    streams = torch.stack([sharp(targets.roll(-j, 1)) for j in (1, 2)], dim=2)  # [1, T, 2, V]: token t+1+j
    assert losses.speculative_streaming_loss(main, streams, targets) < 1e-6
    shifted = torch.stack([sharp(targets) for _ in (1, 2)], dim=2)  # streams wrongly predicting token t+1
    assert losses.speculative_streaming_loss(main, shifted, targets) > 1.0
    assert losses.distill_loss(main, main) < 1e-6
    assert losses.early_exit_loss(main, main, targets) < 1e-6


def test_repeated_ngram_mask_marks_the_tokens_of_repeated_4grams_in_the_continuation():
    seq = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 5], [7, 7, 7, 7, 7, 7, 8, 9, 1]])
    assert trainer.repeated_ngram_mask(seq, 4).int().tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 0],
                                                                  [0, 0, 0, 0, 1, 1, 0, 0, 0]]
    assert trainer.repeated_ngram_mask(seq, 6)[0].int().tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 0]  # prompt unmarked
    row = seq[0].tolist()  # the model card's share counts each repeated 4-gram's last token
    assert evaluate.repeated_4gram_fraction(row, 5) == 1 / 5


def test_unlikelihood_loss_pushes_the_repeated_token_down_and_ignores_the_rest():
    logits = torch.zeros(1, 3, 5, requires_grad=True)  # [B, T, V] uniform
    targets, penalize = torch.tensor([[1, 2, 3]]), torch.tensor([[False, True, False]])
    loss = losses.unlikelihood_loss(logits, targets, penalize)
    assert loss.item() == pytest.approx(-math.log(1 - 0.2))
    loss.backward()
    assert logits.grad[0, 1, 2] > 0 and logits.grad[0, 0].abs().sum() == 0 and logits.grad[0, 2].abs().sum() == 0
    assert losses.unlikelihood_loss(logits, targets, torch.zeros(1, 3, dtype=torch.bool)).item() == 0.0


def test_config_reads_back_from_a_model_card_record():
    """reevaluate rebuilds the run's config from model_card.json: tuples come back as lists, old fields are dropped."""
    cfg = TrainConfig(out_dir="x", budget_split=(0.4, 0.3, 0.3), betas=(0.9, 0.99))
    record = json.loads(json.dumps(dataclasses.asdict(cfg))) | {"a_field_this_version_lacks": 1}
    assert TrainConfig.from_record(record) == cfg


def test_config_rejects_impossible_shapes():
    with pytest.raises(ValueError):
        TrainConfig(out_dir="x", target_layers=4, exit_layer=4)
    with pytest.raises(ValueError):
        TrainConfig(out_dir="x", target_layers=4, ss_layers=2, ss_msa_layers=3)
    with pytest.raises(ValueError):
        TrainConfig(out_dir="x", precision="fp16")
    with pytest.raises(ValueError):  # prompt + unlikelihood continuation must fit the context
        TrainConfig(out_dir="x", context=64, unlikelihood_share=0.2, unlikelihood_new_tokens=40)
    with pytest.raises(ValueError):  # the SS draft copies the AR draft's layers only when they have as many
        TrainConfig(out_dir="x", target_layers=4, ss_layers=2, draft_layers=1, ss_init="ar_draft")
    assert cli.parse_args(["--out", "x"]) == TrainConfig(out_dir="x")
    flags = cli.parse_args(["--out", "x", "--compile", "--precision", "fp32"])
    assert flags.compile is True and flags.precision == "fp32"
    assert cli.parse_args(["--out", "x", "--no-compile"]).compile is False
    assert cli.parse_args(["--out", "x", "--budget-split", "0.5,0.2,0.3"]).budget_split == (0.5, 0.2, 0.3)
    for bad in (["--budget-split", "0.5,0.5"], ["--budget-split", "half"], ["--precision", "fp16"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.parse_args(["--out", "x"] + bad)
        assert exit_info.value.code == 2


def test_cli_trains_saves_and_writes_the_model_card(toy_dir, tmp_path):
    out = str(tmp_path / "pair")
    cli.main(["--out", out, "--corpus-dir", toy_dir] + TINY_FLAGS)
    for name in ("target", "draft_ar", "draft_ss"):
        path = os.path.join(out, name)
        with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        ids = torch.tensor([tok.encode("def f(x):\n", add_special_tokens=False)])
        assert model(ids).logits.shape == (1, ids.shape[1], 320)
    assert isinstance(AutoModelForCausalLM.from_pretrained(os.path.join(out, "draft_ss")), SSDraftForCausalLM)
    with open(os.path.join(out, "model_card.json")) as f:
        card = json.load(f)
    assert set(card["val_loss"]["target"]) == {"code", "prose"}
    assert set(card["exit_overlap"]["code"][str(card["exit_layer"])]) == {"1", "4", "8"}
    assert card["training"]["target"]["steps"] >= 1
    assert card["config"]["precision"] in ("bf16", "fp32")  # "auto" resolved where it ran, and recorded so
    for key in ("draft_ar/sd", "draft_ar/mirror", "draft_ss/sd", "draft_ss/mirror"):  # measured by the engine
        assert card["speculation"][key]["output_equals_ar"] is True and card["speculation"][key]["tau"] >= 1.0
        assert card["speculation"][key]["runs_that_fell_back_to_the_target"] == 0
    assert card["corpus"]["sha256"] == data.load_corpus(toy_dir).manifest["sha256"]
    markdown = open(os.path.join(out, "MODEL_CARD.md")).read()
    assert "Early exit" in markdown and "Greedy samples" in markdown and "Speculative decoding (engine" in markdown
    gen = card["generation"]
    assert set(gen["target"]["repeated_4gram_fraction"]) == set(gen["reference_repetition"]) == {"code", "prose"}
    assert all(0.0 <= v <= 1.0 for v in gen["reference_repetition"].values())
    again = evaluate.reevaluate(out)  # the whole card re-measured from the files: same numbers, records kept
    for key in ("val_loss", "exit_overlap", "speculation"):
        assert again[key] == card[key]
    assert again["generation"]["target"]["samples"] == gen["target"]["samples"]
    assert again["training"] == card["training"] and again["config"] == card["config"]

    # a second run continues that target (same tokenizer), distils the drafts half on its continuations,
    # and says both in the card
    more = str(tmp_path / "more")
    cli.main(["--out", more, "--corpus-dir", toy_dir, "--init-target", os.path.join(out, "target"),
              "--continuation-share", "0.5", "--continuation-sequences", "3", "--unlikelihood-share", "0.5",
              "--unlikelihood-new-tokens", "8"] + TINY_FLAGS)
    with open(os.path.join(more, "model_card.json")) as f:
        training = json.load(f)["training"]
    assert training["target"]["earlier"]["steps"] == card["training"]["target"]["steps"]
    assert training["continuations"]["sequences"] == 3
    assert training["target_unlikelihood"]["steps"] >= 1
    markdown = open(os.path.join(more, "MODEL_CARD.md")).read()
    assert "continued training" in markdown and "50% the target's own continuations" in markdown
    assert "sequence-level unlikelihood updates" in markdown
    assert AutoTokenizer.from_pretrained(os.path.join(more, "target")).get_vocab() == tok.get_vocab()

    # a drafts-only run keeps the --init-target as it is; its SS draft starts from its AR draft
    drafts = str(tmp_path / "drafts")
    cli.main(["--out", drafts, "--corpus-dir", toy_dir, "--init-target", os.path.join(out, "target"),
              "--budget-split", "0,0.5,0.5"] + TINY_FLAGS + ["--ss-init", "ar_draft", "--ss-layers", "1"])
    kept = AutoModelForCausalLM.from_pretrained(os.path.join(drafts, "target"), dtype=torch.float32)
    first = AutoModelForCausalLM.from_pretrained(os.path.join(out, "target"), dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(), first.state_dict().values()))
    markdown = open(os.path.join(drafts, "MODEL_CARD.md")).read()
    assert "unchanged" in markdown and "started from the AR draft" in markdown


def test_the_target_converts_to_the_q8_0_gguf_the_engine_streams_and_the_card_records(toy_dir, tmp_path):
    """`python -m training.toy_pair.to_gguf` on a trained pair's target: the same bytes from the same float16 file,
    the card records it, the re-measured card reads the GGUF (close to the float16 target's figures, every decoder
    still equal to ar), and a drafts-only run from it keeps the file bit for bit."""
    from mirror_core.models.gguf_blocks import WEIGHTS_FILE, own_gguf
    from mirror_core.models.loading import ModelSpec, load_model
    from training.toy_pair import to_gguf

    out = str(tmp_path / "pair")
    first = cli.main(["--out", out, "--corpus-dir", toy_dir] + TINY_FLAGS)
    target = os.path.join(out, "target")
    shutil.copytree(target, str(tmp_path / "again"))
    record = to_gguf.main([target])
    assert to_gguf.convert(str(tmp_path / "again"))["sha256"] == record["sha256"]  # deterministic
    assert own_gguf(target) and not os.path.exists(os.path.join(target, "model.safetensors"))
    assert record["formats"] == {"Q8_0": 4 * 7 + 1, "F32": 4 * 2 + 1} and record["bytes"] < record["source_bytes"]
    assert load_model(ModelSpec(target)).config.dtype == torch.float32
    card = evaluate.reevaluate(out)
    assert card["target_gguf"] == record and card["sizes"]["target"]["format"] == "GGUF Q8_0+F32"
    assert card["sizes"]["target"]["file"] == WEIGHTS_FILE and card["sizes"]["draft_ar"]["format"] == "safetensors F16"
    for kind, loss in first["val_loss"]["target"].items():
        assert abs(card["val_loss"]["target"][kind] - loss) < 0.05 * loss  # Q8_0's rounding moves it little
    assert all(card["speculation"][k]["output_equals_ar"] for k in card["speculation"] if k != "settings")
    markdown = open(os.path.join(out, "MODEL_CARD.md")).read()
    assert "The target is `model.gguf`" in markdown and "converted to Q8_0" in markdown

    drafts = str(tmp_path / "drafts")
    cli.main(["--out", drafts, "--corpus-dir", toy_dir, "--init-target", target, "--budget-split", "0,0.5,0.5"]
             + TINY_FLAGS)
    kept = os.path.join(drafts, "target", WEIGHTS_FILE)
    assert open(kept, "rb").read() == open(own_gguf(target), "rb").read()


def test_target_continuations_are_the_targets_own_decoding(toy_dir, toy_tokenizer):
    cfg = TrainConfig(out_dir="unused", context=20, prompt_tokens=6, continuation_sequences=5,
                      continuation_share=0.5, batch_size=4, precision="fp32")
    stream = data.token_stream(toy_tokenizer, data.load_corpus(toy_dir).select("train"))
    config = build.llama_config(320, 0, 32, 64, 2, 4, 2, max_positions=64)
    model = build.make_target(config, torch.Generator().manual_seed(0)).eval()
    rows = trainer.target_continuations(model, stream, cfg, torch.Generator().manual_seed(3), batch_size=2)
    assert rows.shape == (5, 21)
    again = trainer.target_continuations(model, stream, cfg, torch.Generator().manual_seed(3), batch_size=2)
    assert torch.equal(rows, again)  # the explicit generator makes them reproducible
    for i, row in enumerate(rows.tolist()):
        if i % 2 == 0:  # greedy rows: exactly plain KV-cached greedy decoding of the prompt
            assert row[6:] == evaluate.llama_greedy(model, row[:6], 15)
    assert not torch.equal(rows[1, 6:], torch.tensor(evaluate.llama_greedy(model, rows[1, :6].tolist(), 15)))
    batches = trainer.batches_from(stream, rows, cfg, torch.Generator().manual_seed(4))
    x, y = batches()
    assert x.shape == y.shape == (4, 20) and torch.equal(x[:, 1:], y[:, :-1])
    assert all(any(torch.equal(x[r], c[:-1]) for c in rows) for r in (2, 3))  # round(0.5 · 4) = 2 rows


def test_init_and_training_steps_are_reproducible(toy_dir, toy_tokenizer):
    cfg = TrainConfig(out_dir="unused", target_layers=2, hidden_size=32, intermediate_size=64, num_heads=4,
                      num_kv_heads=2, context=16, batch_size=2, max_steps=3, warmup_steps=2)
    stream = data.token_stream(toy_tokenizer, data.load_corpus(toy_dir).select("train"))
    weights = []
    for _ in range(2):
        config = build.llama_config(320, 0, 32, 64, 2, 4, 2, max_positions=64)
        model = build.make_target(config, torch.Generator().manual_seed(0))
        trainer.run_phase("t", model, trainer.target_loss_fn(model, cfg),
                          trainer.batches_from(stream, None, cfg, torch.Generator().manual_seed(1)), cfg, 1e-3, 60.0)
        weights.append(torch.cat([p.flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
