"""The accelerator paths, on a real accelerator (CUDA, MPS, XPU or NPU): skipped where there is none, run by
scripts/gpu_check.sh when one is lent. Every decoder equals AR on the device, with the draft on the same device
(a thread on its own stream), on the CPU (a process), and on a second device when there is one."""
from __future__ import annotations

import os

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig, machine
from mirror_core.events import SpanEvent
from testing.toy_models import prompts

ACCELERATORS = [d for d in machine.available() if d != "cpu"]
pytestmark = [pytest.mark.accelerator,
              pytest.mark.skipif(not ACCELERATORS, reason="no accelerator on this machine (scripts/gpu_check.sh)")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mappings() -> list[LaneConfig]:
    if not ACCELERATORS:
        return []
    first = ACCELERATORS[0]
    out = [LaneConfig(first, "cpu", "process", draft_threads=1)]
    if not first.startswith("mps"):
        out.append(LaneConfig(first, first, "thread"))
    if len(ACCELERATORS) >= 2:
        out.append(LaneConfig(first, ACCELERATORS[1], "process"))
    return out


@pytest.mark.parametrize("lanes", _mappings(), ids=lambda c: f"{c.target_device}+{c.draft_device}-{c.kind}")
def test_every_decoder_equals_ar_on_the_accelerator(pairs, lanes):
    target, draft = pairs["llama"]
    with MirrorEngine.load(target, draft, lanes) as engine:
        assert str(engine.target.device).startswith(lanes.target_device.split(":")[0])
        for i, prompt in enumerate(prompts(3, seed=5)):
            spec = SpecConfig(gamma=2 + i, kappa=1 + i, exit_layer=1 + i % 2)
            ar = engine.generate(Request(prompt, "ar", 24, spec=spec)).token_ids
            for decoder in ("sd", "mirror"):
                events = list(engine.stream(Request(prompt, decoder, 24, spec=spec)))
                end = events[-1]
                assert end.error is None and end.fallback is None and end.token_ids == ar, (decoder, i)
                spans = [e for e in events if isinstance(e, SpanEvent)]
                assert spans and all(s.t1 >= s.t0 for s in spans)  # synchronised per lane: no negative spans


def test_the_shipped_pair_keeps_its_stored_dtype_and_stays_lossless():
    device = ACCELERATORS[0]
    pair = os.path.join(ROOT, "assets", "default_pair")
    lanes = LaneConfig(device, "cpu", "process", draft_threads=1)
    with MirrorEngine.load(os.path.join(pair, "target"), os.path.join(pair, "draft_ar"), lanes) as engine:
        assert engine.info.target_dtype.sequence in ("float32", "bfloat16", "float16")
        ids = engine.encode("def fibonacci(n):", chat=False)
        ar = engine.generate(Request(ids, "ar", 48)).token_ids
        assert engine.generate(Request(ids, "mirror", 48)).token_ids == ar


def test_stream_sync_and_a_lanes_own_stream():
    dev = torch.device(ACCELERATORS[0])
    x = torch.ones(256, 256, device=dev)
    with machine.own_stream(dev):
        y = x @ x
        machine.synchronize(dev)
    assert float(y[0, 0]) == 256.0
