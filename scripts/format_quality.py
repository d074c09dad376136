"""How far a GGUF target's int8 function is from its float32 one, on a fixed English text, teacher-forced.

    PYTHONPATH=. python scripts/format_quality.py [--target smollm2-135m-instruct]
        [--text assets/texts/format_quality.txt] [--out assets/smollm2_pair/format_quality.json]

Both formats run on the exact kernel (the same bits on every CPU), on the target's own GGUF blocks: float32 is the
dequantised model exactly, int8 rounds the activations per row and block of 32 as llama.cpp does. The text is read as
one sequence (no chat template) and fed in chunks of 128 tokens; at every position both formats' next-token logits
are kept. Reported: each format's perplexity on the text (exp of the mean negative log-likelihood of the next token),
int8's relative change of it, and the top-1 agreement (the share of positions where int8's most likely next token is
float32's). The record is what the CLI's "the function that wrote this" line quotes for the default pair.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from mirror_core.kernels import native
from mirror_core.machine import cpu_flags, cpu_model
from mirror_core.models.gguf_blocks import read_blocks
from mirror_core.models.loading import ModelSpec, load_model
from mirror_core.models.pairs import FORMAT_QUALITY, REAL_TARGET
from mirror_core.models.prepared import find_gguf, resolve_source
from mirror_core.runners.fast import FastLlamaRunner
from mirror_core.runners.protocol import KernelChoice

CHUNK = 128  # tokens per forward


def teacher_forced(runner: FastLlamaRunner, ids: list[int]) -> torch.Tensor:
    """The next-token logits [T, V] at every position of ids, fed CHUNK tokens at a time."""
    cache, out = runner.new_cache(), []
    for a in range(0, len(ids), CHUNK):
        out.append(runner.forward(cache, ids[a: a + CHUNK]))
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=REAL_TARGET)
    p.add_argument("--text", default="assets/texts/format_quality.txt")
    p.add_argument("--out", default=FORMAT_QUALITY)
    args = p.parse_args()
    folder = resolve_source(args.target)
    model = load_model(ModelSpec(folder, "cpu"))
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(open(args.text, encoding="utf-8").read())["input_ids"]
    lib = native.library()
    if lib is None:
        raise SystemExit(f"no kernel here: {native.unavailable()}")
    runner = FastLlamaRunner(model, kernel=KernelChoice(lib), blocks=read_blocks(find_gguf(folder), model.config))
    logits = {}
    for fmt, dtype in (("float32", torch.float32), ("int8", torch.int8)):
        runner.set_dtypes(dtype)
        logits[fmt] = teacher_forced(runner, ids)[:-1]                                      # [T−1, V]
    target = torch.tensor(ids[1:])                                                         # [T−1]
    ppl = {fmt: math.exp(torch.nn.functional.cross_entropy(lg, target).item()) for fmt, lg in logits.items()}
    agree = (logits["int8"].argmax(-1) == logits["float32"].argmax(-1)).float().mean().item()
    record = {"target": args.target, "text": args.text, "tokens": len(ids), "kernel": lib.variant,
              "perplexity": {k: round(v, 3) for k, v in ppl.items()},
              "int8_perplexity_change": round(ppl["int8"] / ppl["float32"] - 1, 5), "top1_agreement": round(agree, 4),
              "cpu": cpu_model(), "flags": " ".join(f for f in cpu_flags() if f.startswith(("avx", "amx"))),
              "command": "PYTHONPATH=. python scripts/format_quality.py"}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
