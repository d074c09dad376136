"""A trained early-exit head: a better top-κ readout at layer ℓ_e than the target's own final norm and LM head.

The paper reads the candidates at ℓ_e through the final norm and LM head (the logit lens). For a pretrained target
that readout can be poor (SmolLM2-135M at layer 15: the final token is in its top-4 17 % of the time, measured in
docs/TRAINING.md), because middle layers do not yet speak the head's language. The head here is

    logits_exit = rms_norm(h · A + b, g) · W_LM[:, ids]                                  # [T, V_e]

with h the hidden state after layer ℓ_e [T, H], A [H, H] identity-initialised, b [H], g [H] (initialised from the
final norm), and W_LM the target's own LM head restricted to `ids` (a subset of its vocabulary, or all of it).
Only A, b, g and ids are stored (`exit_head.safetensors` + `exit_head.json`); W_LM is taken from the target when
the head is attached. It changes which candidates the draft lane receives, never the target's logits or output.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import MirrorError
from .ops import rms_norm

FILES = ("exit_head.json", "exit_head.safetensors")


@dataclass(frozen=True)
class ExitHeadWeights:
    """What is stored: the layer it reads, the target shape it was trained for, and its parameters."""
    layer: int                 # ℓ_e
    hidden_size: int
    num_layers: int
    vocab_size: int            # the target's V
    adapter: torch.Tensor      # A [H, H]
    bias: torch.Tensor         # b [H]
    gain: torch.Tensor         # g [H]
    ids: torch.Tensor          # [V_e] long: the target ids it reads out

    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, FILES[0]), "w", encoding="utf-8") as f:
            json.dump({"layer": self.layer, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
                       "vocab_size": self.vocab_size, "readout_tokens": int(self.ids.numel())}, f, indent=1)
        save_file({"adapter": self.adapter.contiguous(), "bias": self.bias.contiguous(), "gain": self.gain.contiguous(),
                   "ids": self.ids.contiguous()}, os.path.join(folder, FILES[1]))

    def matches(self, config) -> str:
        """'' when this head fits the target config, else why not."""
        mine = (self.hidden_size, self.num_layers, self.vocab_size)
        theirs = (int(config.hidden_size), int(config.num_hidden_layers), int(config.vocab_size))
        return "" if mine == theirs else (f"it was trained for a target with hidden size, layers, vocabulary {mine}, "
                                          f"not {theirs}")


def find_exit_head(folder: str | None) -> ExitHeadWeights | None:
    """The exit head stored in `folder` (a draft's folder), or None when there is none."""
    if not folder or not all(os.path.isfile(os.path.join(folder, f)) for f in FILES):
        return None
    from safetensors.torch import load_file

    try:
        with open(os.path.join(folder, FILES[0]), encoding="utf-8") as f:
            meta = json.load(f)
        t = load_file(os.path.join(folder, FILES[1]))
        return ExitHeadWeights(int(meta["layer"]), int(meta["hidden_size"]), int(meta["num_layers"]),
                               int(meta["vocab_size"]), t["adapter"].float(), t["bias"].float(), t["gain"].float(),
                               t["ids"].long())
    except (OSError, ValueError, KeyError) as exc:
        raise MirrorError(f"cannot read the exit head in {folder}: {exc}") from None


@dataclass(frozen=True)
class ExitProducts:
    """How a runner computes the head's two products (runners/fast.py: packed for the exact kernel, in its weights'
    format); None: torch's matmul. The readout picks candidates only, so its rounding never changes the output."""
    adapter: Callable[[torch.Tensor], torch.Tensor] | None = None  # h [..., H] → h · A [..., H]
    head: Callable[[torch.Tensor], torch.Tensor] | None = None     # z [..., H] → z · W_LM[:, ids] [..., V_e]


TORCH_PRODUCTS = ExitProducts()


@dataclass(frozen=True)
class ExitLogits:
    """An early-exit readout's logits over the tokens it can name: a trained head's own ids (every other token's
    logit is -inf, so it is left out and never computed on), or the whole vocabulary (the logit lens)."""
    logits: torch.Tensor               # [T, V'] float32: column c is token ids[c] (ids None: token c)
    ids: torch.Tensor | None = None    # [V'] the token id of each column; None: V' = V, column = token id
    vocab_size: int = 0                # V: the target's vocabulary
    at: torch.Tensor | None = None     # [V] the column of each token id, -1 outside ids (None with ids None)

    def columns(self, tokens: list[int]) -> list[int]:
        """The column of each token (-1 for a token outside the readout's ids: its logit is -inf)."""
        if self.at is None:
            return list(tokens)
        return self.at[torch.tensor(tokens, dtype=torch.long, device=self.at.device)].tolist() if tokens else []

    def token_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Columns [..] → their token ids [..]."""
        return cols if self.ids is None else self.ids[cols]


class ExitHead:
    """The head bound to a target's LM head, on the target's device: `readout(h [..., T, H]) → logits [..., T, V]`
    (float32, -inf outside its ids)."""

    def __init__(self, weights: ExitHeadWeights, lm_head: torch.Tensor, eps: float):
        device = lm_head.device
        self.weights = weights
        self.layer = weights.layer
        self.eps = eps
        self.vocab_size = weights.vocab_size
        self.adapter = weights.adapter.to(device, torch.float32)                        # [H, H]
        self.bias = weights.bias.to(device, torch.float32)                              # [H]
        self.gain = weights.gain.to(device, torch.float32)                              # [H]
        self.ids = weights.ids.to(device)                                               # [V_e]
        self.w = lm_head.detach()[self.ids].t().contiguous().float()                    # [H, V_e] (lm_head is [V, H])
        self.full = self.ids.numel() == weights.vocab_size and bool((self.ids == torch.arange(
            weights.vocab_size, device=device)).all())
        self.at = torch.full((weights.vocab_size,), -1, dtype=torch.long, device=device)  # [V] token → its column
        self.at[self.ids] = torch.arange(self.ids.numel(), device=device)

    def readout(self, h: torch.Tensor, products: ExitProducts = TORCH_PRODUCTS) -> torch.Tensor:
        """Logits [..., T, V] of h [..., T, H], its two products computed as the calling runner computes them."""
        sub = self.columns(h, products).logits                                          # [..., T, V_e]
        if self.full:
            return sub
        out = sub.new_full(sub.shape[:-1] + (self.vocab_size,), float("-inf"))          # [..., T, V]
        out[..., self.ids] = sub
        return out

    def columns(self, h: torch.Tensor, products: ExitProducts = TORCH_PRODUCTS) -> ExitLogits:
        """The logits of h [T, H] over the head's own ids only (readout's finite columns, the same values)."""
        a = h.float() @ self.adapter if products.adapter is None else products.adapter(h.float())  # [..., T, H]
        z = rms_norm(a + self.bias, self.gain, self.eps)                                # [..., T, H]
        sub = z @ self.w if products.head is None else products.head(z)                 # [..., T, V_e]
        return ExitLogits(sub, None, self.vocab_size) if self.full else ExitLogits(sub, self.ids, self.vocab_size, self.at)


def choose_exit_head(choice: str, draft_folder: str | None, target_model) -> ExitHead | None:
    """The target's early-exit head for LaneConfig.exit_head: "none"; a folder (it must fit the target); "auto",
    the draft folder's head when there is one and it fits (else the logit lens)."""
    if choice == "none":
        return None
    folder = draft_folder if choice == "auto" else choice
    if choice != "auto" and not os.path.isdir(choice):
        raise MirrorError(f"exit head folder {choice!r} does not exist")
    weights = find_exit_head(folder)
    if weights is None:
        if choice != "auto":
            raise MirrorError(f"{choice!r} holds no exit head (exit_head.json and exit_head.safetensors)")
        return None
    why = weights.matches(target_model.config)
    if why:
        if choice != "auto":
            raise MirrorError(f"the exit head in {choice!r} does not fit this target: {why}")
        return None
    lm_head = target_model.get_output_embeddings().weight                                # [V, H]
    return ExitHead(weights, lm_head, float(target_model.config.rms_norm_eps))
