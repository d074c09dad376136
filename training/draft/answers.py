"""The target's answers as both distillations read them: chat_data's shards, the draft's vocabulary over them, the
teacher's top-k in draft ids, and AnswerSet, the one record a stage hands the next.
"""
from __future__ import annotations

import glob
import json
import os
from collections import Counter
from dataclasses import dataclass

import torch

Sequences = list[tuple[list[int], list[int]]]  # (prompt ids, answer ids) per record, target ids


@dataclass(frozen=True, eq=False)
class AnswerSet:
    """Answers with the teacher's figures on them, in the draft's ids: what the batches, the loss, the replay and
    the candidate pass read."""

    seqs: Sequences
    teacher: dict                                 # the teacher pass's tensors and row offsets (teacher.py, distill.py)
    soft: tuple[torch.Tensor, torch.Tensor]       # soft_targets: ids [N, k] in draft ids, probabilities [N, k]
    to_draft: torch.Tensor                        # [V] long: target id → draft id (`other` outside the subset)
    other: int                                    # V_d: the draft's "other" id, never proposed

    @classmethod
    def of(cls, seqs: Sequences, teacher: dict, vmap) -> "AnswerSet":
        """The set over a VocabMap (models/vocab.py), its soft targets computed from the teacher's top-k."""
        return cls(seqs, teacher, soft_targets(teacher["top_ids"], teacher["top_logits"], vmap.to_draft, vmap.size),
                   vmap.to_draft, vmap.size)

    def prompt_lens(self, chunk: list[int]) -> list[int]:
        return [len(self.seqs[i][0]) for i in chunk]


def shard_paths(folder: str) -> list[str]:
    """chat_data's shards in a folder, in the one order every reader uses."""
    paths = sorted(glob.glob(os.path.join(folder, "answers_*.pt")))
    if not paths:
        raise SystemExit(f"no answers_*.pt in {folder}: run python -m training.draft.chat_data first")
    return paths


def load_sequences(folder: str) -> Sequences:
    """(prompt, answer) of every record, in shard_paths' order (memory-mapped: recorded features are not read)."""
    return [(r["prompt"], r["answer"]) for path in shard_paths(folder) for r in torch.load(path, mmap=True)]


def read_json(path: str) -> dict | None:
    """A small JSON record (chat_data's generation.json, a run's record), or None when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def data_subset(seqs: Sequences, answer_tokens: int, g: torch.Generator) -> list[int]:
    """A seeded random choice of records holding at least `answer_tokens` answer tokens (all: 0), in their order:
    the data-volume probe trains on 1×, 2×, 4× of a volume from one pool."""
    if not answer_tokens:
        return list(range(len(seqs)))
    keep, total = [], 0
    for i in torch.randperm(len(seqs), generator=g).tolist():
        if total >= answer_tokens:
            break
        keep.append(i)
        total += len(seqs[i][1])
    return sorted(keep)


def length_chunks(seqs: Sequences, idx: list[int], batch: int, g: torch.Generator) -> list[list[int]]:
    """One epoch's batches of sequence indices: similar lengths together (less padding), batches in random order."""
    perm = torch.randperm(len(idx), generator=g).tolist()
    order = sorted([idx[i] for i in perm], key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    chunks = [order[b: b + batch] for b in range(0, len(order), batch)]
    return [chunks[i] for i in torch.randperm(len(chunks), generator=g).tolist()]


def epochs(seqs: Sequences, idx: list[int], batch: int, g: torch.Generator):
    """length_chunks, epoch after epoch, drawn lazily: the loop's endless batches of sequence indices."""
    while True:
        yield from length_chunks(seqs, idx, batch, g)


def draft_vocabulary(seqs: Sequences, size: int, always: list[int]) -> list[int]:
    """The `size` most frequent target ids in prompts and answers (ties by id), `always` included (FR-Spec: a small
    draft's cost is mostly its head)."""
    counts = Counter(t for p, a in seqs for t in p + a)
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return list(dict.fromkeys(always + ranked))[:size]


def coverage(seqs: Sequences, vmap) -> float:
    """The share of the answers' tokens the draft vocabulary holds."""
    toks = [t for _, a in seqs for t in a]
    return sum(1 for t in toks if int(vmap.to_draft[t]) < vmap.size) / len(toks)


def soft_targets(top_ids: torch.Tensor, top_logits: torch.Tensor, to_draft: torch.Tensor, other: int):
    """The teacher's top-k distribution in draft ids: (ids [N, k], probs [N, k]); ids outside the subset get
    probability 0 (the rest renormalised), their id set to `other` (masked out of the draft's softmax anyway)."""
    ids = to_draft[top_ids.long()]                                                          # [N, k]
    probs = torch.softmax(top_logits.float(), -1) * (ids != other)                          # [N, k]
    return ids, probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
