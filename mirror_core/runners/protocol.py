"""The runner interface: everything the engine asks of a model, in token ids and positions, and what each runner
declares it can do.

A runner owns its KV layout. The engine only moves positions: it appends windows, truncates
after a rejection, forks a cache into branch rows that each see their own prefix of it, advances
those rows one token at a time, and adopts one row. Nothing here knows about transformers; the
Hugging Face implementation is `runners/hf.py: HFRunner`.

Every runner declares its capabilities as fields, never left for a caller to probe: its kernel (KernelChoice: the
exact small-row kernel, or none and why), the weight formats it offers (WeightFormats), what a forward streams
(weight_stream), whether it takes a row plan and the one it runs under, its context, whether it reads the target's
features, and its readout at ℓ_e (exit_head). FastLlamaRunner, FastSSRunner, HFRunner, SSRunner and FeatureRunner
implement it; MappedRunner passes a wrapped runner's through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from ..kernels.native import FORMATS

if TYPE_CHECKING:
    from ..models.exit_head import ExitHead, ExitLogits
    from ..records import RowPlan


@dataclass
class ExitPass:
    """A target forward stopped after layer ℓ_e (Runner.forward_to_exit); Runner.finish_pass runs the rest."""
    h: torch.Tensor  # h^(ℓ_e) [T, H] (float32): the exit layer's hidden state at every new position
    layer: int       # ℓ_e
    rest: Any        # the runner's own state for layers ℓ_e+1..N (hidden state, masks, cache, positions)


@dataclass(frozen=True)
class KernelChoice:
    """The exact small-row kernel a runner computes with (kernels/native.py), or none and why."""

    library: object | None      # native.Library (None: torch's matmul)
    reason: str = ""            # why there is none, in a few words ("" when there is one)

    @property
    def name(self) -> str:
        """The kernel's variant ("avx512_vnni"), or "torch" where there is none."""
        return "torch" if self.library is None else self.library.variant


NO_KERNEL = KernelChoice(None, "built without one")  # a runner made directly, not by build_runner (tests, scripts)


@dataclass(frozen=True)
class WeightFormats:
    """The weight formats a runner offers, as the torch dtypes that stand for them (torch.int8 stands for int8: the
    kernel's GGUF blocks against int8 activations), and what Runner.set_dtypes changes when it takes one."""

    offered: tuple[torch.dtype, ...]  # what set_dtypes takes, the loaded format first
    whole_model: bool = False         # True: set_dtypes moves the whole model (weights, activations, KV cache) to
    #                                   one dtype (the generic runners: the loaded one unless forced, not timed);
    #                                   False: only the linear maps' weights, one format for one-sequence forwards
    #                                   and one for branch rows (timed at load: runners/calibrate.py)
    blocks: tuple[str, ...] = ()      # the linear maps the kernel streams as the model's own GGUF blocks
    #                                   (models/gguf_blocks.py); int8 is offered on them


def lower_formats(loaded: torch.dtype) -> tuple[torch.dtype, ...]:
    """The formats a runner that keeps its loaded weights as the master copy offers: every format when it loaded
    float32 (float32 first), else only the loaded one (no format of higher precision than the master)."""
    return tuple(FORMATS.values()) if loaded == torch.float32 else (loaded,)


class WholeModelFormats:
    """The formats of a runner over a model's own forward (HFRunner, SSRunner: `self.model`), which cannot split the
    linear maps out: every format, the whole model (weights, activations, cache) moved to it; not timed at load."""

    model: torch.nn.Module

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def formats(self) -> WeightFormats:
        loaded = self.dtype
        return WeightFormats((loaded,) + tuple(d for d in FORMATS.values() if d != loaded), whole_model=True)

    def set_dtypes(self, sequence: torch.dtype, rows: torch.dtype | None = None) -> None:
        """The whole model in `sequence`: one dtype for every shape."""
        if rows not in (None, sequence):
            raise ValueError(f"{type(self).__name__} runs the whole model in one dtype")
        self.model.to(sequence)


@dataclass(frozen=True)
class WeightStream:
    """What one one-token forward streams, in the one-sequence forwards' current format (records.Roofline)."""

    nbytes: int      # bytes of every layer's linear maps and the LM head (the embedding row, norms, cache not counted)
    params: int      # multiply-adds per row of those maps (a row costs 2 × this in flops)
    storage: str     # the format, or the GGUF block formats it is stored in ("float32 as q4_1+q8_0")


@runtime_checkable
class Runner(Protocol):
    """What the engine asks of any model, draft or target, and what the runner declares it can do."""

    num_layers: int   # N: decoder layers
    num_streams: int  # lookahead streams of a speculative-streaming draft (0: one token per forward)
    vocab_size: int   # V: logits are sliced to this width
    device: torch.device               # where inputs go (the embedding's device)
    devices: tuple[torch.device, ...]  # every device the model's weights are on (several: a spread target)
    dtype: torch.dtype                 # what its activations and KV cache are in
    max_positions: int | None          # the positions its model can attend over (None: the runner sets no bound)
    kernel: KernelChoice               # the exact small-row kernel it computes with, or none and why
    formats: WeightFormats             # the weight formats it offers (set_dtypes)
    plans_rows: bool                   # it takes a row plan (row_ops, row_plan: runners/exactness.py); False: its
    #                                    calls are measured as they are (check_rows)
    row_plan: RowPlan | None           # the plan its calls of up to EXACT_ROWS rows run under (None: plain calls)
    reads_features: bool               # a feature-reading draft (runners/feature.py): forwards take h^(ℓ_e) too
    exit_head: ExitHead | None         # its readout at ℓ_e: a target's trained exit head, given when the runner is
    #                                    built (runners.build_runner); None: the logit lens (a draft: none at all)

    @property
    def weight_stream(self) -> WeightStream | None:
        """What a one-token forward streams now (None: a runner that cannot split its weights out, the generic ones)."""

    def set_dtypes(self, sequence: torch.dtype, rows: torch.dtype | None = None) -> None:
        """Take formats from `formats.offered`: one for one-sequence forwards, one for branch rows (default: the
        same). A runner whose formats are per shape (not whole_model) also frees the unused ones
        (drop_unused_dtypes)."""

    def new_cache(self) -> Any:
        """An empty sequence cache (batch of one)."""

    def cache_len(self, cache: Any) -> int:
        """Tokens held; the next appended token gets this position."""

    def forward(self, cache: Any, ids: list[int], rows: int | None = None) -> torch.Tensor:
        """Append ids at positions cache_len.. and return logits [T, V] (float32); with `rows`, only the last rows'
        [rows, V] (the same values; a prefill reads one, and a runner may skip the others' LM head)."""

    def truncate(self, cache: Any, length: int) -> None:
        """Keep the first `length` tokens."""

    def fork(self, cache: Any, valid_lengths: list[int]) -> Any:
        """Branch rows over a shared cache: row r sees only its first valid_lengths[r] tokens and
        its next token gets position valid_lengths[r]."""

    def forward_rows(self, branches: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ids [R, T] at each row's next positions; returns logits [R, T, V] and, for a
        speculative-streaming draft, lookahead-stream states [R, T, n_str, H] (else None)."""

    # Speculative-streaming drafts (num_streams > 0) also provide:
    #   forward_streams(cache, ids) -> (logits [T, V], stream states [T, n_str, H])
    #   stream_proposals(states [..., n_str, H]) -> greedy lookahead ids [..., n_str]
    #   rewind_rows(branches, drop: list[int]) hides each row's newest drop[r] entries.
    # A feature-reading draft (reads_features) takes features [T, H] beside the ids in forward and forward_rows, and
    # returns logits over its own vocabulary: target_ids and over_target_vocab map what is drawn from them.

    def select_row(self, branches: Any, row: int) -> Any:
        """A sequence cache holding row `row`'s visible prefix followed by that row's own tokens."""


@runtime_checkable
class TargetRunner(Runner, Protocol):
    """A target's runner (FastLlamaRunner, HFRunner) also splits its forward at the early exit, so that the draft
    lane can start on h^(ℓ_e) while layers ℓ_e+1..N run, and reads candidates out at ℓ_e."""

    def forward_to_exit(self, cache: Any, ids: list[int], layer: int) -> ExitPass:
        """Layers 1..ℓ_e of forward(cache, ids), the same arithmetic; the cache is not used again before
        finish_pass."""

    def finish_pass(self, exit_pass: ExitPass, rows: int | None = None) -> torch.Tensor:
        """Layers ℓ_e+1..N and the head of that pass: logits [T, V] (with `rows`, the last rows' [rows, V]), equal to
        what forward(cache, ids) returns."""

    def exit_readout(self, h: torch.Tensor, layer: int) -> ExitLogits:
        """The layer-ℓ_e readout of h [T, H]: the trained exit head when it reads this layer (its products run
        like the runner's own linear maps; logits over its own ids only, every other token's being -inf), else the
        logit lens final_norm(h) · W_LM → logits [T, V] (float32)."""
