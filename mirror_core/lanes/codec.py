"""Lane messages <-> channel frames (the process lane's wire format)."""
from __future__ import annotations

import numpy as np
import torch

from ..config import RULES, SamplingConfig
from ..events import STAGE_DRAFT_BRANCHES, STAGE_DRAFT_ROLLOUT, STAGE_PREFILL, STAGE_SELECT_BRANCH
from ..messages import BranchRequest, DraftStart, DraftWindow, ResolveRequest
from .channel import Message

_STAGES = (STAGE_PREFILL, STAGE_DRAFT_ROLLOUT, STAGE_DRAFT_BRANCHES, STAGE_SELECT_BRANCH)
_START, _BRANCH, _RESOLVE, _WINDOW, _ERROR, _READY, _SHUTDOWN = range(1, 8)


class LaneError(RuntimeError):
    """The draft lane failed (exception, dead process, timeout); the run continues on the target."""


def _msg(kind: int, i64=(), f64=(), f32=None) -> Message:
    return Message(kind, np.asarray(i64, np.int64), np.asarray(f64, np.float64),
                   np.zeros(0, np.float32) if f32 is None else f32)


def encode(cmd) -> Message:
    if isinstance(cmd, DraftStart):
        s = cmd.sampling
        head = [cmd.gamma, s.seed, s.top_k, RULES.index(s.rule)]
        return _msg(_START, head + list(cmd.prompt_ids), [s.temperature, s.top_p])
    if isinstance(cmd, BranchRequest):
        kappa = max(len(r) for r in cmd.topk_ids)
        flat = [v for r in cmd.topk_ids for v in list(r) + [-1] * (kappa - len(r))]
        return _msg(_BRANCH, [cmd.step, len(cmd.topk_ids), kappa] + flat)
    if isinstance(cmd, ResolveRequest):
        return _msg(_RESOLVE, [cmd.step, cmd.accepted, cmd.token, int(cmd.hit)])
    if isinstance(cmd, DraftWindow):
        rows = len(cmd.branches)
        width = len(cmd.branches[0]) if rows else 0
        vocab = 0 if cmd.p_draft is None else cmd.p_draft.shape[-1]
        head = [-1 if cmd.branch_row is None else cmd.branch_row, len(cmd.tokens), cmd.forwards, rows, width, vocab,
                cmd.produced]
        i64 = head + list(cmd.tokens) + [t for b in cmd.branches for t in b]
        f64 = [x for stage, t0, t1 in cmd.spans for x in (_STAGES.index(stage), t0, t1)]
        f32 = None if cmd.p_draft is None else cmd.p_draft.numpy().astype(np.float32).ravel()
        return _msg(_WINDOW, i64, f64, f32)
    raise TypeError(f"cannot encode {type(cmd).__name__}")


def decode(msg: Message):
    i = msg.i64.tolist()
    if msg.kind == _START:
        sampling = SamplingConfig(temperature=float(msg.f64[0]), top_k=i[2], top_p=float(msg.f64[1]), seed=i[1],
                                  rule=RULES[i[3]])
        return DraftStart(tuple(i[4:]), i[0], sampling)
    if msg.kind == _BRANCH:
        slots, kappa = i[1], i[2]
        return BranchRequest(i[0], tuple(tuple(i[3 + s * kappa: 3 + (s + 1) * kappa]) for s in range(slots)))
    if msg.kind == _RESOLVE:
        return ResolveRequest(i[0], i[1], i[2], bool(i[3]))
    if msg.kind == _WINDOW:
        row, n, forwards, rows, width, vocab, produced = i[:7]
        tokens = tuple(i[7: 7 + n])
        flat = i[7 + n:]
        branches = tuple(tuple(flat[r * width:(r + 1) * width]) for r in range(rows))
        spans = [(_STAGES[int(msg.f64[k])], float(msg.f64[k + 1]), float(msg.f64[k + 2])) for k in range(0, msg.f64.size, 3)]
        p_draft = torch.from_numpy(msg.f32.reshape(n, vocab)) if vocab else None
        return DraftWindow(tokens, p_draft, None if row < 0 else row, branches, spans, forwards, produced)
    if msg.kind == _ERROR:
        return LaneError(bytes(msg.i64.astype(np.uint8)).decode("utf-8", "replace"))
    raise ValueError(f"unknown message kind {msg.kind}")


def _error_msg(exc: BaseException) -> Message:
    text = f"{type(exc).__name__}: {exc}".encode("utf-8")[:4000]
    return _msg(_ERROR, list(text))
