"""Lane messages <-> channel frames: the process lane's wire format, derived from the message dataclasses.

A frame is a channel.Message (kind, int64[], float64[], float32[]). FRAMES is the one table of
kinds; the payload is the dataclass's fields in declaration order, each laid out by its type hint:

    int, bool                one int64 word
    float                    one float64 word
    str                      int64 byte count, then one int64 word per UTF-8 byte
    X | None                 int64 0 (None) or 1 (then X)
    tuple[X, ...], list[X]   int64 length, then the items; for rows of ints (ragged or not), the
                             row count, every row's length, then the rows back to back
    tuple[X, Y, Z]           X, Y, Z
    torch.Tensor             int64 ndim and shape; float32 values, row-major, in the float32 array
    a dataclass              its fields, in order (DraftStart.sampling)

Nothing sits at a hand-chosen position, so a field added to a message travels without touching
this file. A hint with no rule above raises TypeError when this module is imported, a value that
does not fit its hint raises when it is encoded, and decode checks that the frame is used up.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping

import numpy as np
import torch

from ..messages import BranchRequest, DraftStart, DraftWindow, ResolveRequest
from .channel import Message

MAX_ERROR_BYTES = 4000  # a failure's text is cut to this many UTF-8 bytes


class LaneError(RuntimeError):
    """The draft lane failed (exception, dead process, timeout); the run continues on the target."""


# -- control frames (the process lane's own, besides the token-channel messages) ------------------
@dataclasses.dataclass(frozen=True)
class LaneFailed:
    """The draft lane's process could not start or its worker raised; the target lane raises LaneError(text)."""
    text: str   # "ExceptionType: message", at most MAX_ERROR_BYTES of UTF-8

    @classmethod
    def of(cls, exc: BaseException) -> LaneFailed:
        text = f"{type(exc).__name__}: {exc}".encode()[:MAX_ERROR_BYTES]
        return cls(text.decode("utf-8", "replace"))


@dataclasses.dataclass(frozen=True)
class LaneReady:
    """The draft lane's process loaded its model, chose its dtypes, and serves commands."""
    calibration: str   # records.Calibration as JSON
    runner: str        # the draft's runner class (FastLlamaRunner, FastSSRunner, HFRunner, SSRunner)


@dataclasses.dataclass(frozen=True)
class LaneRest:
    """The request is over: the draft lane's process waits for the next command asleep (the target may run on every
    core meanwhile, ar included), not spinning, and not waking in short ticks."""


@dataclasses.dataclass(frozen=True)
class LaneShutdown:
    """The target lane asks the draft lane's process to exit."""


# -- field layouts (one class per row of the table above; put appends, get reads at the cursors) ---
class _Writer:
    """The three payload streams of a frame being built."""
    __slots__ = ("f32", "f64", "i64")

    def __init__(self):
        self.i64: list[int] = []
        self.f64: list[float] = []
        self.f32: list[np.ndarray] = []


class _Reader:
    """The payload streams of a frame being read, with a cursor into each."""
    __slots__ = ("f", "f32", "f64", "i", "i64", "q")

    def __init__(self, msg: Message):
        self.i64, self.f64, self.f32 = msg.i64.tolist(), msg.f64.tolist(), msg.f32
        self.i = self.f = self.q = 0


class _Word:
    """One word: an int or a bool in the int64 stream, a float in the float64 stream."""

    def __init__(self, kind: type):
        self.kind = kind

    def put(self, w: _Writer, v) -> None:
        if self.kind is float:
            w.f64.append(v)
        else:
            w.i64.append((1 if v else 0) if self.kind is bool else v)

    def get(self, r: _Reader):
        if self.kind is float:
            r.f += 1
            return r.f64[r.f - 1]
        r.i += 1
        return bool(r.i64[r.i - 1]) if self.kind is bool else r.i64[r.i - 1]


class _Str:
    def put(self, w: _Writer, v) -> None:
        data = v.encode()
        w.i64.append(len(data))
        w.i64.extend(data)

    def get(self, r: _Reader):
        n, start = r.i64[r.i], r.i + 1
        r.i = start + n
        return bytes(r.i64[start:r.i]).decode()


class _Optional:
    def __init__(self, inner):
        self.inner = inner

    def put(self, w: _Writer, v) -> None:
        w.i64.append(0 if v is None else 1)
        if v is not None:
            self.inner.put(w, v)

    def get(self, r: _Reader):
        r.i += 1
        return self.inner.get(r) if r.i64[r.i - 1] else None


class _Seq:
    def __init__(self, item, container: type):
        self.item, self.container = item, container
        self.put_item, self.get_item = item.put, item.get

    def put(self, w: _Writer, v) -> None:
        w.i64.append(len(v))
        for x in v:
            self.put_item(w, x)

    def get(self, r: _Reader):
        n = r.i64[r.i]
        r.i += 1
        get = self.get_item
        return self.container([get(r) for _ in range(n)])


class _Ints(_Seq):
    """A sequence of ints: length, then the run, copied as one slice."""

    def put(self, w: _Writer, v) -> None:
        w.i64.append(len(v))
        w.i64.extend(v)

    def get(self, r: _Reader):
        n, start = r.i64[r.i], r.i + 1
        r.i = start + n
        return self.container(r.i64[start:r.i])


class _IntRows(_Seq):
    """A sequence of int sequences (ragged): row count, every row's length, then the rows back to back."""

    def put(self, w: _Writer, v) -> None:
        w.i64.append(len(v))
        w.i64.extend([len(row) for row in v])
        for row in v:
            w.i64.extend(row)

    def get(self, r: _Reader):
        i64, n, row = r.i64, r.i64[r.i], self.item.container
        start = r.i + 1 + n
        rows = []
        for length in i64[r.i + 1:start]:
            rows.append(row(i64[start:start + length]))
            start += length
        r.i = start
        return self.container(rows)


class _Tuple:
    def __init__(self, items):
        self.n, self.getters, self.putters = len(items), [x.get for x in items], [x.put for x in items]

    def put(self, w: _Writer, v) -> None:
        if len(v) != self.n:
            raise ValueError(f"expected a {self.n}-tuple, got {len(v)} items")
        for put, x in zip(self.putters, v):
            put(w, x)

    def get(self, r: _Reader):
        return tuple([get(r) for get in self.getters])


class _Tensor:
    def put(self, w: _Writer, v) -> None:
        w.i64.append(v.dim())
        w.i64.extend(v.shape)
        w.f32.append(v.numpy().astype(np.float32).ravel())

    def get(self, r: _Reader):
        ndim, start = r.i64[r.i], r.i + 1
        r.i = start + ndim
        shape = r.i64[start:r.i]
        n = math.prod(shape)
        r.q += n
        return torch.from_numpy(r.f32[r.q - n:r.q].reshape(shape))


class _Struct:
    """A dataclass: its fields in declaration order, rebuilt through __init__ (so __post_init__ checks run)."""

    def __init__(self, cls: type):
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"codec: {cls.__name__} is not a dataclass")
        hints = typing.get_type_hints(cls)
        self.cls, self.names, self.layouts = cls, [], []
        for f in dataclasses.fields(cls):
            if not f.init or f.kw_only:
                raise TypeError(f"codec: {cls.__name__}.{f.name} is not a positional __init__ field")
            self.names.append(f.name)
            self.layouts.append(_layout(hints[f.name], f"{cls.__name__}.{f.name}"))
        self.getters = [x.get for x in self.layouts]
        self.putters = [(name, x.put) for name, x in zip(self.names, self.layouts)]

    def put(self, w: _Writer, v) -> None:
        for name, put in self.putters:
            put(w, getattr(v, name))

    def get(self, r: _Reader):
        return self.cls(*[get(r) for get in self.getters])


_SCALARS = {bool: _Word(bool), int: _Word(int), float: _Word(float), str: _Str(), torch.Tensor: _Tensor()}


def _layout(hint, where: str):
    """The layout for one type hint; TypeError (at import, for FRAMES) when there is no rule for it."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return _Optional(_layout(next(a for a in args if a is not type(None)), where))
    if (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or (origin is list and len(args) == 1):
        item = _layout(args[0], where)
        seq = _Ints if item is _SCALARS[int] else _IntRows if type(item) is _Ints else _Seq
        return seq(item, origin)
    if origin is tuple and args and Ellipsis not in args:
        return _Tuple([_layout(a, where) for a in args])
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _Struct(hint)
    raise TypeError(f"codec: no wire layout for {where}: {hint!r} (add a rule to lanes/codec.py:_layout)")


# -- the codec -----------------------------------------------------------------------------------
_EMPTY_F32 = np.zeros(0, np.float32)


class Codec:
    """Maps each registered dataclass to and from frames of its kind (kinds are positive: 0 is never sent)."""

    def __init__(self, frames: Mapping[int, type]):
        if len(set(frames.values())) != len(frames) or min(frames, default=1) < 1:
            raise ValueError("codec: kinds must be positive and name each class once")
        self.by_kind = {kind: _Struct(cls) for kind, cls in frames.items()}
        self.by_class = {layout.cls: (kind, layout) for kind, layout in self.by_kind.items()}

    def encode(self, obj) -> Message:
        try:
            kind, layout = self.by_class[type(obj)]
        except KeyError:
            raise TypeError(f"cannot encode {type(obj).__name__}: not in the codec's frame table") from None
        w = _Writer()
        layout.put(w, obj)
        i64, f64 = np.array(w.i64), np.array(w.f64)
        if (i64.size and i64.dtype.kind not in "ib") or (f64.size and f64.dtype.kind not in "fib"):
            raise TypeError(f"cannot encode this {type(obj).__name__}: a field holds a value its type hint does not "
                            f"allow (int64 words came out {i64.dtype}, float64 words {f64.dtype})")
        f32 = w.f32[0] if len(w.f32) == 1 else np.concatenate(w.f32) if w.f32 else _EMPTY_F32
        return Message(kind, i64.astype(np.int64, copy=False), f64.astype(np.float64, copy=False), f32)

    def decode(self, msg: Message):
        try:
            layout = self.by_kind[msg.kind]
        except KeyError:
            raise ValueError(f"unknown message kind {msg.kind}") from None
        r = _Reader(msg)
        try:
            obj = layout.get(r)
            used_up = (r.i, r.f, r.q) == (len(r.i64), len(r.f64), r.f32.size)
        except IndexError:  # the frame ran out first
            used_up = False
        if not used_up:
            raise ValueError(f"a {layout.cls.__name__} frame does not match its layout: the encoder's and the "
                             "decoder's dataclasses differ")
        return obj


# The process lane's frames: kind number <-> class, the one place either is named.
FRAMES = {
    1: DraftStart,
    2: BranchRequest,
    3: ResolveRequest,
    4: DraftWindow,
    5: LaneFailed,
    6: LaneReady,
    7: LaneShutdown,
    8: LaneRest,
}
CODEC = Codec(FRAMES)
encode = CODEC.encode
decode = CODEC.decode
