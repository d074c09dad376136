"""A draft with a reduced vocabulary (FR-Spec style): it reads and predicts only a subset of the target's tokens.

A folder holding `draft_vocab.json` ({"target_vocab_size": V, "target_ids": [...]}) is such a draft: its model
has len(target_ids) + 1 embeddings, row i standing for target token target_ids[i] and the last row ("other") for
every target token outside the subset. Its head is that much smaller, which is most of a small draft's cost.
runners/mapped.py's `MappedRunner` wraps the draft's runner so the engine sees target ids in and
target-vocabulary logits out ([..., V], -inf outside the subset). The draft can then only propose subset tokens; the output is still the
target's (a draft never changes it), only the acceptance can be lower where the target picks another token.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from ..config import MirrorError

FILE = "draft_vocab.json"


@dataclass(frozen=True)
class VocabMap:
    target_ids: torch.Tensor   # [V_d] long: draft id i ↔ target id target_ids[i]
    to_draft: torch.Tensor     # [V] long: target id → draft id (V_d, "other", outside the subset)
    target_vocab_size: int     # V

    @classmethod
    def from_ids(cls, target_ids: list[int], target_vocab_size: int) -> "VocabMap":
        ids = torch.tensor(target_ids, dtype=torch.long)                                  # [V_d]
        if ids.numel() == 0 or len(set(target_ids)) != len(target_ids) or int(ids.min()) < 0 \
                or int(ids.max()) >= target_vocab_size:
            raise MirrorError(f"{FILE}: target_ids must be distinct ids in 0..{target_vocab_size - 1}")
        to_draft = torch.full((target_vocab_size,), len(target_ids), dtype=torch.long)  # [V]
        to_draft[ids] = torch.arange(len(target_ids))
        return cls(ids, to_draft, target_vocab_size)

    @property
    def size(self) -> int:
        """V_d: subset tokens (the draft model has one more embedding, "other")."""
        return int(self.target_ids.numel())

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, FILE), "w", encoding="utf-8") as f:
            json.dump({"target_vocab_size": self.target_vocab_size, "target_ids": self.target_ids.tolist()}, f)


def load_vocab_map(folder: str) -> VocabMap | None:
    """The folder's VocabMap, or None when the draft reads the target's whole vocabulary (no draft_vocab.json)."""
    path = os.path.join(folder, FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return VocabMap.from_ids([int(t) for t in record["target_ids"]], int(record["target_vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MirrorError(f"cannot read {path}: {exc}") from None


def full_vocab_copy(model, vmap: VocabMap):
    """The reduced draft as a plain Hugging Face model over the target's whole vocabulary, for peers that drive a
    draft themselves (transformers' assisted generation): every target id outside the subset reads the "other"
    embedding, and its head row is zero (logit 0, below the subset's top logit whenever that is positive, which
    is how a trained LM's top logit is), so its greedy proposals are the reduced draft's."""
    import copy

    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    cfg.vocab_size, cfg.tie_word_embeddings = vmap.target_vocab_size, False
    full = AutoModelForCausalLM.from_config(cfg).to(model.dtype).eval()
    state = {k: v for k, v in model.state_dict().items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    full.load_state_dict(state, strict=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight                                          # [V_d + 1, H]
        full.get_input_embeddings().weight.copy_(emb[vmap.to_draft])                       # [V, H]
        head = full.get_output_embeddings().weight                                          # [V, H]
        head.zero_()
        head[vmap.target_ids] = model.get_output_embeddings().weight[: vmap.size]
    full.generation_config = model.generation_config
    return full.to(next(model.parameters()).device)
