"""The feature draft's teacher pass: what the target says at every position of every prompt + answer, once.

feat [Σ L_i, H] bfloat16 holds h^(ℓ_e) at every position (the draft's input features) and top_ids / top_logits
[Σ A_i, k] the target's top-k next-token logits at the positions predicting answer tokens. They are copied from
the records where chat_data recorded them while generating; a forward pass of the target (in the dtype precision.py
measures faster here, or the one asked for) computes the rest. The result is cached in the work folder under a name
made from what it holds (teacher_path), so a stale cache is never read.
"""
from __future__ import annotations

import os
import time
import zlib

import torch

from training.draft.answers import Sequences, shard_paths
from training.precision import torch_dtype


@torch.inference_mode()
def teacher_pass(folders: list[str], keep: list[int], seqs: Sequences, target_dir: str, layer: int, topk: int, path: str,
                 dtype: str, batch: int = 16) -> dict:
    """For `seqs`, the records of `folders` at indices `keep` (in shard_paths' order, counted across the folders):
    feat [Σ L_i, H] bf16 (h^(ℓ_e) at every position), fstart[i]; top_ids/top_logits [Σ A_i, k] at the positions
    predicting answer tokens, astart[i]. Copied from the records where chat_data recorded them at this layer with
    ≥ k logits (their last position's feature, never read, stays 0); a pass of the target in `dtype` computes the rest.
    Cached at `path` (teacher_path: named by the sequences, the layer and k)."""
    if os.path.exists(path):
        return torch.load(path)
    from transformers import AutoConfig

    lens = [len(p) + len(a) for p, a in seqs]
    fstart, astart, f_at, a_at = [], [], 0, 0
    for (p, a), n in zip(seqs, lens):
        fstart.append(f_at)
        astart.append(a_at)
        f_at, a_at = f_at + n, a_at + len(a)
    hidden = AutoConfig.from_pretrained(target_dir).hidden_size
    feat = torch.zeros(f_at, hidden, dtype=torch.bfloat16)
    top_ids = torch.empty(a_at, topk, dtype=torch.int32)
    top_logits = torch.empty(a_at, topk, dtype=torch.float16)
    t0 = time.time()
    local, missing, at = {g: i for i, g in enumerate(keep)}, [], 0
    for path_ in [p for folder in folders for p in shard_paths(folder)]:
        for r in torch.load(path_, mmap=True):
            i, at = local.get(at), at + 1
            if i is None:
                continue
            if (r["prompt"], r["answer"]) != seqs[i]:
                raise SystemExit(f"{path_} changed since its sequences were read (is chat_data still writing there?)")
            if r.get("feat_layer") != layer or r["top_ids"].shape[1] < topk:
                missing.append(i)
                continue
            a = len(seqs[i][1])
            feat[fstart[i]: fstart[i] + lens[i] - 1] = r["feat"]
            top_ids[astart[i]: astart[i] + a] = r["top_ids"][:, :topk]
            top_logits[astart[i]: astart[i] + a] = r["top_logits"][:, :topk]
    print(f"teacher pass: {len(seqs) - len(missing)}/{len(seqs)} sequences recorded at generation, "
          f"{time.time() - t0:.0f} s", flush=True)
    result = {"feat": feat, "fstart": fstart, "top_ids": top_ids, "top_logits": top_logits, "astart": astart,
              "recorded": len(seqs) - len(missing)}
    if missing:
        _forward_pass(seqs, missing, target_dir, layer, result, dtype, batch)
    result["seconds"] = round(time.time() - t0, 1)
    torch.save(result, path)
    return result


def _forward_pass(seqs, which: list[int], target_dir: str, layer: int, teacher: dict, dtype: str, batch: int) -> None:
    """The teacher's figures for sequences `which`, by full forwards of the target in `dtype`, written into place in
    `teacher` (teacher_pass's tensors and offsets)."""
    from transformers import AutoModelForCausalLM

    feat, fstart, top_ids, top_logits, astart = (teacher[k] for k in ("feat", "fstart", "top_ids", "top_logits",
                                                                      "astart"))
    topk = top_ids.shape[1]
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype(dtype)).eval()
    lens = [len(p) + len(a) for p, a in seqs]
    order = sorted(which, key=lambda i: lens[i])
    t0 = time.time()
    for b in range(0, len(order), batch):
        chunk = order[b: b + batch]
        width = max(lens[i] for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, i in enumerate(chunk):
            ids[r, : lens[i]] = torch.tensor(seqs[i][0] + seqs[i][1])
            mask[r, : lens[i]] = 1
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        for r, i in enumerate(chunk):
            p, a = seqs[i]
            feat[fstart[i]: fstart[i] + lens[i]] = out.hidden_states[layer][r, : lens[i]]
            top = out.logits[r, len(p) - 1: lens[i] - 1].float().topk(topk, dim=-1)            # [A, k]
            top_ids[astart[i]: astart[i] + len(a)] = top.indices.int()
            top_logits[astart[i]: astart[i] + len(a)] = top.values.half()
        if b // batch % 40 == 0:
            print(f"teacher pass: {b + len(chunk)}/{len(order)} sequences computed, {time.time() - t0:.0f} s",
                  flush=True)


def teacher_path(work: str, name: str, seqs: Sequences, layer: int, topk: int, target: str, dtype: str) -> str:
    """The teacher cache's file, named by what it holds: a stale cache (other data, layer, k, target or the dtype its
    forward passes ran in) is never read."""
    key = zlib.crc32(f"{os.path.abspath(target)}/{layer}/{topk}/{len(seqs)}/{dtype}".encode())
    for p, a in seqs:
        key = zlib.crc32(torch.tensor(p + [-1] + a, dtype=torch.int32).numpy().tobytes(), key)
    return os.path.join(work, f"{name}_{key:08x}.pt")
