"""Sequence-level distillation data: the target's own greedy chat answers to chat_prompts, generated in batches.

`python -m mirror_core.train.chat_data --target smollm2-135m-instruct --out DIR` writes DIR/answers_*.pt shards,
each a list of {"prompt": [ids], "answer": [ids]} (the answer ends with the eos token unless it hit the limit).
Generation runs the target in bfloat16 with left padding (Hugging Face generate): the labels are the bf16 model's
greedy tokens, a close stand-in for the float32 model's, which is all a draft's training text needs to be.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def generate(target: str, out: str, batch: int = 128, new_tokens: int = 160, threads: int = 0,
             limit: int = 0, held_out: bool = False, more: bool = False, only_more: bool = False,
             temperature: float = 0.0, seed: int = 0) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mirror_core.models.prepared import resolve_source
    if threads:
        torch.set_num_threads(threads)
    folder = resolve_source(target)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    eos = tok.eos_token_id
    items = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in _chosen(held_out, more, only_more)]
    items = items[:limit] if limit else items
    items.sort(key=len)  # similar lengths share a batch: less padding
    os.makedirs(out, exist_ok=True)
    start, done = time.time(), 0
    for b in range(0, len(items), batch):
        path = os.path.join(out, f"answers_{b // batch:04d}.pt")
        if os.path.exists(path):
            continue
        enc = tok(items[b: b + batch], return_tensors="pt", padding=True)
        with torch.inference_mode():
            if temperature > 0:  # sampled answers: other texts on the same prompts (the labels stay the target's own)
                torch.manual_seed(seed + b)
                gen = model.generate(**enc, max_new_tokens=new_tokens, do_sample=True, temperature=temperature,
                                     top_k=0, top_p=1.0, pad_token_id=eos)
            else:
                gen = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=eos)
        rows = []
        width = enc.input_ids.shape[1]
        for r in range(gen.shape[0]):
            prompt = enc.input_ids[r][enc.attention_mask[r].bool()].tolist()
            answer = gen[r, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            rows.append({"prompt": prompt, "answer": answer})
        torch.save(rows, path)
        done += sum(len(r["answer"]) for r in rows)
        print(f"{path}: {len(rows)} answers, {done} answer tokens, {done / (time.time() - start):.0f} tok/s", flush=True)
    if done:  # this run's cost (shards made by an earlier run are not counted)
        with open(os.path.join(out, "generation.json"), "w", encoding="utf-8") as f:
            json.dump({"answer_tokens": done, "seconds": round(time.time() - start, 1), "batch": batch,
                       "threads": torch.get_num_threads()}, f)


def _chosen(held_out: bool, more: bool, only_more: bool) -> list[str]:
    """The prompts to answer: chat_prompts' train (or held-out) set, with MORE_FORMS if asked; `only_more` keeps
    just the prompts that MORE_FORMS adds (to extend an earlier run's answers without repeating them)."""
    from mirror_core.train.chat_prompts import prompts

    chosen = prompts(held_out, more=more or only_more)
    if only_more:
        before = set(prompts(held_out))
        chosen = [p for p in chosen if p not in before]
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mirror_core.train.chat_data", description=__doc__)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    parser.add_argument("--held-out", action="store_true", help="the held-out topics' prompts (for evaluation)")
    parser.add_argument("--more", action="store_true", help="add chat_prompts.MORE_FORMS")
    parser.add_argument("--only-more", action="store_true", help="only the prompts MORE_FORMS adds")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample the answers at this temperature "
                        "(0: greedy); the teacher pass still labels every position with the target's own top-k")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    generate(a.target, a.out, a.batch, a.new_tokens, a.threads, a.limit, a.held_out, a.more, a.only_more,
             a.temperature, a.seed)


if __name__ == "__main__":
    main()
