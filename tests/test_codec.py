"""The process lane's wire format: every frame type round-trips exactly, layouts follow the dataclasses, and
the shared-memory channel works with plain stores (x86) and with locks (the mode for other hosts)."""
from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, fields

import numpy as np
import pytest
import torch

from mirror_core import SamplingConfig
from mirror_core.lanes import channel
from mirror_core.lanes.channel import Channel, ChannelClosed, Message, echo
from mirror_core.lanes.codec import (
    FRAMES,
    Codec,
    LaneFailed,
    LaneReady,
    LaneRest,
    LaneShutdown,
    decode,
    encode,
)
from mirror_core.context_draft import ContextPlan, ContextProposal
from mirror_core.draft_choice import Candidate, ChoicePlan, WindowChoice
from mirror_core.messages import BranchRequest, DraftStart, DraftWindow, ResolveRequest

_GEN = torch.Generator().manual_seed(0)
WINDOW = DraftWindow((1, 2, 3, 4), torch.rand(4, 7, generator=_GEN), 0, ((1, 2, 3, 4),) * 3 + ((9,),),
                     [("draft_branches", 1.5, 2.25), ("select_branch", 2.25, 2.5), ("draft_rollout", 3.0, 4.0)], 12, 13)
PLAN = ChoicePlan(True, 64, (1.0, 1.13, 1.33), 0.006, ContextPlan(2, 16))
CHOICE = WindowChoice(Candidate("zero", 0, 1.0, 5.1), Candidate("context", 3, 2.4375, 7.2), promised=True)
SAMPLES = [
    DraftStart((5,), 1, SamplingConfig(), ChoicePlan(False, 1, ())),
    DraftStart(tuple(range(300)), 16, SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, seed=2**63 - 1,
                                                     rule="rejection"), PLAN),
    BranchRequest(0, ()),
    BranchRequest(2, ((1, 2), (3, -1), (-1, -1), (4,), ())),   # -1 candidates, ragged and empty rows
    ResolveRequest(5, 2, 17, True),
    ResolveRequest(6, 0, 3, False),
    DraftWindow((1, 2), None, None, ()),                                             # greedy, no branches, no spans
    DraftWindow((), None, None, (), source="zero", choice=CHOICE, then_plain_unless=(3, 9)),  # a window of zero
    DraftWindow((4, 5), None, None, (), source="context", context=ContextProposal((4, 5), 6, 9, 0.8, 2.44),
                choice=WindowChoice(Candidate("context", 2, 2.44, 6.7), None, probe=False, measured=True)),
    WINDOW,                                                                          # p_draft, 3 spans
    DraftWindow((7,), torch.rand(1, 3, generator=_GEN, dtype=torch.float64), 9, ((7, 8),),  # float64 → float32
                [("prefill", 0.0, 1e-9)], 1, 1),
    LaneFailed.of(ValueError("bad token 'é' at step 3")),
    LaneReady('{"lane": "draft", "sequence": "float32", "rows": "bfloat16"}', "FastSSRunner"),
    LaneShutdown(),
    LaneRest(),
]


def _same(a, b) -> bool:
    """b is a decoded a, field by field: tensors by value as float32 (their wire type), the rest by == and type."""
    if type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and y.dtype == torch.float32 and torch.equal(x.float(), y)):
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


def test_every_frame_type_has_a_sample():
    assert {type(s) for s in SAMPLES} == set(FRAMES.values())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_frame_round_trips_exactly(msg):
    frame = encode(msg)
    assert frame.i64.dtype == np.int64 and frame.f64.dtype == np.float64 and frame.f32.dtype == np.float32
    assert _same(msg, decode(frame))


def test_decoded_values_have_their_hinted_types():
    back = decode(encode(WINDOW))
    assert type(back.tokens) is tuple and all(type(t) is int for t in back.tokens)
    assert type(back.branches) is tuple and all(type(row) is tuple for row in back.branches)
    assert type(back.spans) is list and all(type(s) is tuple and type(s[1]) is float for s in back.spans)
    assert back.p_draft.shape == (4, 7) and type(decode(encode(ResolveRequest(1, 0, 2, True))).hit) is bool


def test_an_error_frame_carries_the_text_cut_to_its_limit():
    assert decode(encode(LaneFailed.of(RuntimeError("lane died")))) == LaneFailed("RuntimeError: lane died")
    long = LaneFailed.of(RuntimeError("a" + "é" * 5000))  # the cut at 4000 bytes splits an é
    assert long.text.endswith("é\ufffd") and len(long.text.encode()) == 3999 + 3 and decode(encode(long)) == long


def test_a_message_too_large_for_the_channel_is_refused_with_a_clear_error():
    ch = Channel(cap_i64=32, cap_f32=4)
    try:
        too_large = r"too large for the channel: frame kind 1 has \d+ int64 words, the mailbox holds 32"
        with pytest.raises(ValueError, match=too_large):
            ch.to_worker.send(encode(DraftStart(tuple(range(60)), 4, SamplingConfig(), PLAN)), lambda: True, 1)
        with pytest.raises(ValueError, match="float32 words"):
            ch.to_worker.send(encode(DraftWindow((1, 2), torch.rand(2, 3, generator=_GEN), None, ())), lambda: True, 1)
        assert ch.to_worker.drained()  # nothing was published
    finally:
        ch.close()


def test_values_that_do_not_fit_their_hints_fail_when_encoded():
    with pytest.raises(TypeError, match="does not allow"):
        encode(ResolveRequest(1, 2.5, 3, True))
    with pytest.raises(TypeError, match="does not allow"):
        encode(BranchRequest(1, ((1, None),)))
    with pytest.raises(TypeError, match="not in the codec's frame table"):
        encode(SamplingConfig())
    with pytest.raises(ValueError, match="unknown message kind 99"):
        decode(Message(99, np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.float32)))


# -- layouts follow the dataclasses (throwaway frames in a local codec) ------------------------------------
@dataclass(frozen=True)
class _Probe:
    step: int
    ids: tuple[int, ...]


@dataclass(frozen=True)
class _ProbeWithAField:
    step: int
    scale: float | None            # the new field, in the middle: nothing after it moves by hand
    tag: str
    ids: tuple[int, ...]
    inner: _Probe


@dataclass(frozen=True)
class _ProbeWithASet:
    ids: set[int]


def test_a_field_added_to_a_dataclass_travels_without_touching_the_codec():
    codec = Codec({1: _Probe, 2: _ProbeWithAField})
    for msg in (_ProbeWithAField(3, 0.5, "x", (1, 2), _Probe(4, (5,))),
                _ProbeWithAField(3, None, "", (), _Probe(0, ()))):
        assert codec.decode(codec.encode(msg)) == msg


def test_a_layout_mismatch_or_an_unsupported_hint_fails_loudly():
    old, new = Codec({1: _Probe}), Codec({1: _ProbeWithAField})
    with pytest.raises(ValueError, match="does not match its layout"):
        old.decode(new.encode(_ProbeWithAField(3, 0.5, "x", (1, 2), _Probe(4, (5,)))))
    with pytest.raises(ValueError, match="does not match its layout"):
        new.decode(old.encode(_Probe(3, (1, 2))))
    with pytest.raises(TypeError, match=r"no wire layout for _ProbeWithASet.ids"):
        Codec({1: _ProbeWithASet})
    with pytest.raises(ValueError, match="name each class once"):
        Codec({1: _Probe, 2: _Probe})


# -- the channel: named header slots, busy/idle, both store-ordering modes --------------------------------
@pytest.mark.parametrize("ordered_stores", [True, False], ids=["plain-stores", "locked"])
def test_mailbox_busy_and_idle(ordered_stores):
    ch = Channel(cap_i64=64, cap_f32=64, ordered_stores=ordered_stores)
    peer = Channel.attach(ch.handle)
    try:
        box, far = ch.to_worker, peer.to_worker
        assert box.idle() and not box.busy and ch.ordered_stores is ordered_stores
        box.send(encode(ResolveRequest(1, 0, 3, False)), lambda: True, 1)
        assert not box.drained() and not box.idle()
        assert decode(far.recv(lambda: True, 1, busy=True)) == ResolveRequest(1, 0, 3, False)
        assert box.drained() and box.busy and not box.idle()   # taken but not finished
        far.mark_idle()
        assert box.idle()
        far.mark_busy()
        assert box.busy and not box.idle()
    finally:
        peer.close()
        ch.close()


def test_an_unordered_channel_cannot_be_attached_without_its_locks():
    ch = Channel(cap_i64=16, cap_f32=4, ordered_stores=False)
    try:
        with pytest.raises(ValueError, match="needs its creator's locks"):
            Channel(16, 4, name=ch.name, ordered_stores=False)
    finally:
        ch.close()


def test_a_lock_held_by_a_dead_peer_closes_the_channel(monkeypatch):
    monkeypatch.setattr(channel, "LOCK_TIMEOUT_S", 0.05)
    ch = Channel(cap_i64=16, cap_f32=4, ordered_stores=False)
    try:
        ch.handle.locks[0].acquire()  # as if the peer died while it published
        with pytest.raises(ChannelClosed, match="lock was held"):
            ch.to_worker.idle()
        assert ch.to_target.idle()    # the other direction has its own lock
    finally:
        ch.close()


@pytest.mark.parametrize("ordered_stores", [True, False], ids=["plain-stores", "locked"])
def test_frames_round_trip_through_a_spawned_process(ordered_stores):
    """The process lane's path: shared memory to another process and back, in both publication modes."""
    ch = Channel(cap_i64=1024, cap_f32=64, ordered_stores=ordered_stores)
    proc = mp.get_context("spawn").Process(target=echo, args=(ch.handle, len(SAMPLES) * 3), daemon=True)
    proc.start()
    try:
        for _ in range(3):
            for msg in SAMPLES:
                ch.to_worker.send(encode(msg), proc.is_alive, 60)
                assert _same(msg, decode(ch.to_target.recv(proc.is_alive, 60)))
        proc.join(timeout=30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        ch.close()
