"""A Llama GGUF file's linear maps as the blocks it stores them in (BlockWeights, which the exact kernel packs:
kernels/native.py), keyed by the Hugging Face parameter they dequantise to.

Why: the default target is a GGUF (Q4_1 layers, a Q8_0 tied embedding / LM head, about 96 MB), and its prepared
float32 folder is gguf's dequantisation of exactly these blocks. Streamed as blocks and dequantised in registers, the
target computes what the float32 folder computes, bit for bit, while reading 2.8x fewer bytes than float16 and 5.6x
fewer than float32 (kernels/src/gguf_kernels.h says why the arithmetic is the same). Every map is checked against the
loaded float32 weight when it is packed; a map that does not match stays float32. The toy target is a Q8_0 GGUF kept
as its folder's weights (WEIGHTS_FILE, no safetensors); loading dequantises it the same way (`read_weights`), so the
torch path and the kernel compute one function there too.

Rows: transformers' GGUF loader reverses llama.cpp's interleaving of the query and key heads (rotary halves); that
moves whole output rows, so the blocks move with them (`_unpermute`).
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from ..kernels.blocks import QK, BlockWeights

WEIGHTS_FILE = "model.gguf"  # a folder's weights kept as a GGUF instead of safetensors (the toy target's)


# GGUF tensor names → Hugging Face Llama parameter names (a layer's {i})
_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_BYTES = {"Q4_1": 4 + QK // 2, "Q8_0": 2 + QK}  # one block's bytes


def own_gguf(folder: str | None) -> str | None:
    """The GGUF a local folder keeps its weights in instead of safetensors (WEIGHTS_FILE, no .safetensors beside it),
    or None."""
    if not folder or not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        return None
    return None if any(f.endswith(".safetensors") for f in os.listdir(folder)) else os.path.join(folder, WEIGHTS_FILE)


def read_blocks(path: str, config) -> dict[str, BlockWeights]:
    """{HF parameter name: its blocks} for every Q4_1 / Q8_0 linear map of a Llama GGUF (other types are left out:
    those maps stay float32). config: the model's (heads, KV heads) for the query/key rows. The file is memory-mapped
    at the offsets of its tensor index (`tensor_index`)."""
    out: dict[str, BlockWeights] = {}
    for entry in tensor_index(path):
        name, kind, rows, offset, nbytes = entry["name"], entry["type"], entry["rows"], entry["offset"], entry["bytes"]
        if kind not in _BYTES or not name.endswith(".weight") or (hf := _hf_name(name[: -len(".weight")])) is None:
            continue
        raw = np.memmap(path, np.uint8, "r", offset, (nbytes,)).reshape(rows, -1, _BYTES[kind])  # [N, K/QK, bytes]
        blocks = _blocks(kind, raw)
        order = _hf_rows(hf, rows, config)
        out[hf + ".weight"] = blocks if order is None else blocks.rows(order)
    return _tied(out, config)


def read_weights(path: str, config) -> dict[str, torch.Tensor]:
    """{HF parameter name: float32 weight} for every tensor of a Llama GGUF, each dequantised by gguf (the blocks'
    `dequantize` gives the same bits), the query/key rows in HF's order and a tied LM head named too; shapes are the
    file's ([rows, -1]; a norm [N, 1]) for the caller to fit to its parameters."""
    from gguf import GGMLQuantizationType, quants

    out: dict[str, torch.Tensor] = {}
    for entry in tensor_index(path):
        name, rows = entry["name"], entry["rows"]
        hf = _hf_name(name[: -len(".weight")]) if name.endswith(".weight") else None
        if hf is None:
            raise ValueError(f"{os.path.basename(path)}: tensor {name!r} is not a Llama parameter read here")
        raw = np.memmap(path, np.uint8, "r", entry["offset"], (entry["bytes"],)).reshape(rows, -1)  # [N, bytes/row]
        w = torch.from_numpy(np.array(quants.dequantize(raw, GGMLQuantizationType[entry["type"]])))  # [N, K]
        order = _hf_rows(hf, rows, config)
        out[hf + ".weight"] = w if order is None else w[order]
    return _tied(out, config)


def _tied(out: dict, config) -> dict:
    """`out` with the LM head named as the embedding where the model ties them (the GGUF then has no `output`)."""
    if "model.embed_tokens.weight" in out and "lm_head.weight" not in out and getattr(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def tensor_index(path: str) -> list[dict]:
    """Each tensor's name, type, rows, byte offset and size in a GGUF file. gguf's reader parses every metadata
    field to find them (the 49k-token vocabulary: seconds), so the index is kept beside the file (`<file>.index.json`,
    keyed by its size and modification time) and made on first use."""
    stat = os.stat(path)
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cached = path + ".index.json"
    try:
        with open(cached, encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("file") == key:
            return saved["tensors"]
    except (OSError, ValueError, AttributeError):
        pass
    from gguf import GGUFReader

    tensors = [{"name": t.name, "type": t.tensor_type.name, "rows": int(t.data.shape[0]) if t.data.ndim else 1,
                "offset": int(t.data_offset), "bytes": int(t.n_bytes)} for t in GGUFReader(path).tensors]
    try:
        tmp = cached + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"file": key, "tensors": tensors}, f)
        os.replace(tmp, cached)
    except OSError:
        pass  # a read-only folder: parse again next time
    return tensors


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd":
        return "model.embed_tokens"
    if gguf_name == "output":
        return "lm_head"
    if gguf_name == "output_norm":
        return "model.norm"
    parts = gguf_name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _NAMES:
        return f"model.layers.{int(parts[1])}.{_NAMES[parts[2]]}"
    return None


def _blocks(kind: str, raw: np.ndarray) -> BlockWeights:
    """GGUF's block bytes [N, K/QK, bytes] → BlockWeights. Q4_1: d, m float16, then 16 bytes whose low nibbles are
    k 0..15 and high nibbles k 16..31. Q8_0: d float16, then 32 int8."""
    d = torch.from_numpy(np.ascontiguousarray(raw[..., 0:2]).view(np.float16)[..., 0])     # [N, K/QK]
    if kind == "Q8_0":
        q = torch.from_numpy(np.ascontiguousarray(raw[..., 2:]).view(np.int8))             # [N, K/QK, 32]
        return BlockWeights("q8_0", d, q)
    m = torch.from_numpy(np.ascontiguousarray(raw[..., 2:4]).view(np.float16)[..., 0])     # [N, K/QK]
    qs = torch.from_numpy(np.ascontiguousarray(raw[..., 4:]))                              # [N, K/QK, 16]
    return BlockWeights("q4_1", d, torch.cat([qs & 15, qs >> 4], -1), m)                  # q [N, K/QK, 32]


def _hf_rows(hf: str, rows: int, config) -> torch.Tensor | None:
    """Which file row each HF row is for a query or key map (llama.cpp permutes theirs); None for any other map."""
    if not hf.endswith(("q_proj", "k_proj")):
        return None
    return _unpermute(rows, config.num_attention_heads if hf.endswith("q_proj") else config.num_key_value_heads)


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """Which GGUF row each HF row is: transformers' reverse of llama.cpp's query/key permutation, as an index."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)      # [N]
