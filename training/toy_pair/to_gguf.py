"""A toy target folder's float16 safetensors → the Q8_0 GGUF the repository ships:
`python -m training.toy_pair.to_gguf FOLDER`.

Why: Q8_0 (blocks of 32 weights, each block a float16 scale and 32 int8) stores the target in about half its float16
bytes, and it is a format the exact kernel streams as it is ("float32 as q8_0": mirror_core/models/gguf_blocks.py),
as it streams the default target's GGUF. Loading dequantises the file with gguf's own dequantisation, so the torch
path and the kernel compute one function. Every linear map and the tied embedding / LM head are Q8_0 (as the default
target's tied embedding is); the norms stay float32. The file is laid out as llama.cpp's converter writes a Llama
model (tensor names, the query and key rows permuted as it permutes them, the hyperparameters and the byte-level BPE
vocabulary in its metadata), so transformers' GGUF loader reads it too (tests/test_default_pair.py: the same weights,
bit for bit, as the engine's loader).

The folder keeps config.json (its dtype now float32: what the dequantised weights are), the generation config and
the tokenizer files; model.safetensors is replaced by model.gguf, and a pair's model_card.json records the conversion
(`python -m training.toy_pair.evaluate DIR` then re-measures the card on the GGUF). The shipped file is reproduced
from the float16 weights in git history with `--from-git COMMIT` (assets/default_pair/MODEL_CARD.md names the
commit): quantisation is deterministic (gguf.quants, bit-exact with ggml's reference), so the same input gives the
same bytes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from mirror_core.models.gguf_blocks import WEIGHTS_FILE
from mirror_core.models.prepared import file_sha256

# Hugging Face parameter (a layer's part after "model.layers.{i}.") → GGUF tensor (after "blk.{i}.")
_LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def convert(folder: str, rev: str | None = None) -> dict:
    """Write FOLDER/model.gguf from FOLDER/model.safetensors (removed then) or, with rev, from that git revision's
    float16 file; set config.json's dtype to float32; record the conversion in the pair's model_card.json when the
    folder is a pair's target. Returns the record (source and file sha256, bytes, tensor formats)."""
    from safetensors.numpy import load_file

    source = os.path.join(folder, "model.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        if rev is not None:
            source, rev = _from_git(folder, rev, tmp), _git(folder, "rev-parse", rev).decode().strip()
        if not os.path.isfile(source):
            raise SystemExit(f"{source} does not exist (--from-git COMMIT reads it from the history)")
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        weights = {name: w.astype(np.float32) for name, w in load_file(source).items()}
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tokenizer = json.load(f)
        out = os.path.join(folder, WEIGHTS_FILE)
        formats = write_gguf(out, config, weights, tokenizer)
        record = {"source": "model.safetensors" + (f" at git commit {rev}" if rev else ""),
                  "source_sha256": file_sha256(source), "source_bytes": os.path.getsize(source), "file": WEIGHTS_FILE,
                  "sha256": file_sha256(out), "bytes": os.path.getsize(out), "formats": formats,
                  "tool": "python -m training.toy_pair.to_gguf"}
        os.remove(source)
    config["dtype"] = "float32"
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    _record_in_card(folder, record)
    return record


def _from_git(folder: str, rev: str, into: str) -> str:
    """The folder's model.safetensors as git revision `rev` holds it, written into `into`."""
    path = os.path.join(into, "model.safetensors")
    with open(path, "wb") as f:
        f.write(_git(folder, "show", f"{rev}:./model.safetensors"))
    return path


def _git(folder: str, *args: str) -> bytes:
    """`git -C folder ARGS`'s output; its error, one line, as the exit message."""
    done = subprocess.run(["git", "-C", folder, *args], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def _record_in_card(folder: str, record: dict) -> None:
    """The record as `target_gguf` in the pair's model_card.json, where FOLDER is a pair's target/ (the card's
    figures are the float16 target's until `python -m training.toy_pair.evaluate DIR` re-measures and renders it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), "model_card.json")
    if os.path.basename(os.path.abspath(folder)) != "target" or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        card_data = json.load(f)
    card_data["target_gguf"] = record
    with open(path, "w", encoding="utf-8") as f:
        json.dump(card_data, f, indent=2, ensure_ascii=False)
    print(f"recorded in {path}; re-measure the card: python -m training.toy_pair.evaluate "
          f"{os.path.dirname(os.path.abspath(folder))}", file=sys.stderr)


def write_gguf(path: str, config: dict, weights: dict[str, np.ndarray], tokenizer: dict) -> dict[str, int]:
    """A llama.cpp-layout GGUF of a tied-embedding Llama model; returns {format: tensors} written."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    if not config.get("tie_word_embeddings") or not np.array_equal(head, weights["model.embed_tokens.weight"]):
        raise ValueError("only a tied embedding / LM head is converted (the toy target's)")
    writer = gguf.GGUFWriter(path, "llama")
    _add_metadata(writer, config, tokenizer)
    formats: dict[str, int] = {}
    for name, w in weights.items():
        if name == "lm_head.weight":
            continue
        gguf_name, w = _gguf_tensor(name, w, config)
        kind = Q.Q8_0 if w.ndim == 2 else Q.F32  # linear maps and the embedding; norms stay float32
        writer.add_tensor(gguf_name, gguf.quants.quantize(w, kind), raw_dtype=kind)
        formats[kind.name] = formats.get(kind.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return formats


def _gguf_tensor(name: str, w: np.ndarray, config: dict) -> tuple[str, np.ndarray]:
    """The GGUF name of a Hugging Face parameter, and its rows in llama.cpp's order (query and key permuted)."""
    if name == "model.embed_tokens.weight":
        return "token_embd.weight", w
    if name == "model.norm.weight":
        return "output_norm.weight", w
    parts = name.split(".")
    if parts[:2] != ["model", "layers"] or ".".join(parts[3:-1]) not in _LAYER_NAMES:
        raise ValueError(f"{name}: not a parameter of a Llama layer")
    part = ".".join(parts[3:-1])
    if part in ("self_attn.q_proj", "self_attn.k_proj"):
        w = _permute(w, config["num_attention_heads"] if part.endswith("q_proj") else config["num_key_value_heads"])
    return f"blk.{int(parts[2])}.{_LAYER_NAMES[part]}.weight", w


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's query/key row order (rotary halves interleaved), which its loaders undo."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_metadata(writer, config: dict, tokenizer: dict) -> None:
    """The hyperparameters and the byte-level BPE vocabulary, as llama.cpp's converter writes them for Llama."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0)}
    writer.add_name("mirror-sd toy target")
    writer.add_file_type(7)  # llama.cpp's MOSTLY_Q8_0
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(config["vocab_size"])):
        raise ValueError("the tokenizer's ids are not 0..vocab_size-1")
    special = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config.get("pad_token_id", config["eos_token_id"]))


def main(argv: list[str] | None = None) -> dict:
    """`python -m training.toy_pair.to_gguf FOLDER [--from-git REV]`: convert; print the record."""
    parser = argparse.ArgumentParser(prog="python -m training.toy_pair.to_gguf", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a target folder with config.json, tokenizer.json and float16 model.safetensors")
    parser.add_argument("--from-git", metavar="REV", help="read the folder's model.safetensors as git revision REV "
                        "holds it (the shipped target's float16 weights are in the history; the card names the commit)")
    args = parser.parse_args(argv)
    record = convert(args.folder, args.from_git)
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
