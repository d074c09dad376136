"""A reduced-vocabulary draft's runner (models/vocab.py) in the target's token ids: ids mapped in, logits
scattered out."""
from __future__ import annotations

import torch

from ..config import MirrorError
from ..models.vocab import VocabMap


class MappedRunner:
    """A reduced-vocabulary draft's runner in the target's token ids: ids are mapped in, logits scattered out.
    Everything else (caches, forks, dtypes) is the wrapped runner's."""

    def __init__(self, inner, vmap: VocabMap):
        if inner.num_streams:
            raise MirrorError("a reduced-vocabulary draft cannot be a speculative-streaming draft")
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "vmap", vmap)
        object.__setattr__(self, "_to_draft", vmap.to_draft.to(inner.device))
        object.__setattr__(self, "_ids", vmap.target_ids.to(inner.device))

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    @property
    def vocab_size(self) -> int:
        return self.vmap.target_vocab_size

    def _out(self, logits: torch.Tensor) -> torch.Tensor:
        full = logits.new_full(logits.shape[:-1] + (self.vmap.target_vocab_size,), float("-inf"))  # [..., V]
        full[..., self._ids] = logits[..., : self.vmap.size]                                        # "other" dropped
        return full

    def forward(self, cache, ids: list[int], rows: int | None = None) -> torch.Tensor:
        mapped = self._to_draft[torch.tensor(ids, dtype=torch.long, device=self._to_draft.device)].tolist()
        return self._out(self.inner.forward(cache, mapped, rows))

    def forward_rows(self, branches, ids: torch.Tensor):
        logits, states = self.inner.forward_rows(branches, self._to_draft[ids.to(self._to_draft.device)])
        return self._out(logits), states


def runner_name(runner) -> str:
    """The runner's class name as the pair description shows it (a reduced-vocabulary draft's says so)."""
    if isinstance(runner, MappedRunner):
        return f"{type(runner.inner).__name__} (vocabulary {runner.vmap.size} of {runner.vmap.target_vocab_size})"
    return type(runner).__name__
