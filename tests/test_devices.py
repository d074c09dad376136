"""The device layer (mirror_core/machine.py) and the lane plan (lanes/placement.py) on fake accelerators, and the
CPU+CPU lanes on simulated macOS and Windows (no core pinning, no sched_yield)."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request, SpecConfig, machine
from mirror_core.cli import main
from mirror_core.lanes import channel, placement
from mirror_core.lanes.placement import plan_lanes
from testing.toy_models import prompts


class FakeBackend:
    """What machine.py asks of torch.cuda / torch.xpu / torch.mps, for n devices; records synchronisations."""

    def __init__(self, n: int):
        self.n, self.synced, self.streams = n, [], []

    def is_available(self):
        return self.n > 0

    def device_count(self):
        return self.n

    def get_device_name(self, dev):
        return f"Fake accelerator {dev}"

    def current_stream(self, dev):
        return SimpleNamespace(synchronize=lambda: self.synced.append(str(dev)))

    def synchronize(self, dev=None):
        self.synced.append("queue")

    def Stream(self, dev):  # noqa: N802 (torch's name)
        self.streams.append(str(dev))
        return str(dev)

    def stream(self, s):
        import contextlib

        return contextlib.nullcontext(s)


@pytest.fixture
def fake(monkeypatch):
    """fake(cuda=2) or fake(mps=1): this machine's accelerators, as far as the device layer can tell."""
    def install(**counts):
        backends = {kind: FakeBackend(n) for kind, n in counts.items()}
        monkeypatch.setattr(machine, "_backend", lambda kind: backends.get(kind))
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: counts.get("mps", 0) > 0)
        return backends
    return install


@pytest.mark.parametrize("n, target, draft, kind", [
    (0, "cpu", "cpu", "process"),
    (1, "cuda:0", "cpu", "process"),
    (2, "cuda:0", "cuda:1", "process"),
    (3, "cuda:0", "cuda:1", "process"),
])
def test_the_plan_for_zero_to_three_gpus(fake, n, target, draft, kind):
    fake(cuda=n)
    plan = plan_lanes()
    assert (plan.lanes.target_device, plan.lanes.draft_device, plan.lanes.kind) == (target, draft, kind)
    assert plan.reasons and all(isinstance(r, str) and r for r in plan.reasons)
    if n == 1:  # the CPU cores run the draft; one core is left to launch the target's kernels
        assert plan.lanes.draft_threads == len(plan.lanes.draft_cpus) >= 1 and "CPU cores the draft" in plan.reasons[1]
    assert machine.available() == ["cpu"] + [f"cuda:{i}" for i in range(n)]


def test_apple_silicon_puts_the_target_on_mps_and_the_draft_on_the_cpu(fake):
    backends = fake(mps=1)
    plan = plan_lanes()
    assert (plan.lanes.target_device, plan.lanes.draft_device, plan.lanes.kind) == ("mps", "cpu", "process")
    assert machine.check("mps") == torch.device("mps") and machine.describe("mps") == "Apple GPU (Metal)"
    machine.synchronize(torch.device("mps"))
    assert backends["mps"].synced == ["queue"]  # one queue per process on Metal


def test_one_gpu_two_streams_is_an_option(fake):
    backends = fake(cuda=1)
    plan = plan_lanes(kind="thread")
    assert (plan.lanes.target_device, plan.lanes.draft_device, plan.lanes.kind) == ("cuda:0", "cuda:0", "thread")
    with machine.own_stream(torch.device("cuda:0")):
        pass
    machine.synchronize(torch.device("cuda:0"))
    assert backends["cuda"].streams == ["cuda:0"] and backends["cuda"].synced == ["cuda:0"]  # its own stream only


def test_device_names_are_checked_against_this_machine(fake):
    fake(cuda=2, xpu=1)
    assert machine.available() == ["cpu", "cuda:0", "cuda:1", "xpu:0"]
    assert machine.canonical("cuda") == "cuda:0" and machine.canonical("xpu") == "xpu:0"
    with pytest.raises(MirrorError, match=r"device 'cuda:3' is not available on this machine; it has: cpu, cuda:0, "
                                          r"cuda:1, xpu:0"):
        machine.check("cuda:3")
    with pytest.raises(MirrorError, match="Ascend NPUs need the torch_npu package"):
        machine.check("npu:0")
    with pytest.raises(MirrorError, match=r"device must be cpu, cuda\[:N\], mps"):
        machine.check("gpu0")
    with pytest.raises(MirrorError, match="target device must be cpu, cuda"):
        LaneConfig(target_device="tpu")
    assert LaneConfig(target_device="mps", draft_device="xpu:1").draft_device == "xpu:1"  # names are well formed


def test_the_devices_command_prints_the_plan_and_refuses_an_absent_device(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("devices:\n  cpu") and "plan: target on cpu" in out and "  - " in out
    assert main(["devices", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["devices"][0]["device"] == "cpu" and plan["lanes"]["target_device"] == "cpu" and plan["reasons"]
    assert main(["devices", "--target-device", "mps"]) == 2
    assert capsys.readouterr().err.startswith("error: device 'mps' is not available on this machine; it has: cpu")


@pytest.fixture(params=["darwin", "win32"])
def foreign_os(request, monkeypatch):
    """Linux-only calls removed and sys.platform faked, as on macOS or Windows."""
    for name in ("sched_getaffinity", "sched_setaffinity", "sched_yield"):
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.setattr(sys, "platform", request.param)
    return request.param


def test_lanes_plan_and_pin_without_linux_calls(foreign_os):
    plan = plan_lanes()
    assert plan.lanes.target_threads >= 1 and plan.lanes.draft_threads >= 1  # cores split by count
    assert any("cannot pin threads to cores" in r for r in plan.reasons)
    before = torch.get_num_threads()
    with placement.pinned((0,), 1):
        assert torch.get_num_threads() == 1  # threads only: nothing to pin
    assert torch.get_num_threads() == before
    calls = iter([False] * 300 + [True])
    channel.wait_until(lambda: next(calls), lambda: True, 5.0)  # spins with sleep(0) instead of sched_yield


@pytest.mark.parametrize("kind", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_a_full_cpu_cpu_generation_without_linux_calls(pairs, foreign_os, kind, monkeypatch):
    if kind == "process" and foreign_os == "win32":  # multiprocessing reads sys.platform itself to pass Windows
        monkeypatch.setattr(sys, "platform", "linux")  # handles, which this host cannot; the calls stay removed
    target, draft = pairs["llama"]
    lanes = placement.auto_lanes(kind=kind, dtype="float32")
    with MirrorEngine.load(target, draft, lanes) as engine:
        for prompt in prompts(2, seed=3):
            ar = engine.generate(Request(prompt, "ar", 16)).token_ids
            for decoder in ("sd", "mirror"):
                end = engine.generate(Request(prompt, decoder, 16, spec=SpecConfig(3, 2)))
                assert end.error is None and end.fallback is None and end.token_ids == ar


def test_a_target_spread_over_a_device_map_runs_on_the_generic_runner_and_stays_lossless(pairs, capsys):
    """On a CPU the map's two entries are both 'cpu': the path (config, device map, generic runner, per-device
    sync) is the one a target over cuda:0,cuda:1 takes."""
    from mirror_core.models.loading import device_map_for
    from mirror_core.runners.hf import HFRunner
    from testing.toy_models import hf_greedy
    from transformers import AutoConfig

    target, draft = pairs["llama"]
    split = device_map_for(AutoConfig.from_pretrained(target), ("cpu", "cpu"))
    assert [split[f"model.layers.{i}"] for i in range(4)] == ["cpu"] * 4 and split["lm_head"] == "cpu"
    lanes = plan_lanes("cpu,cpu", "cpu", "inline", dtype="float32").lanes
    assert lanes.target_devices == ("cpu", "cpu") and lanes.target_device == "cpu"
    with MirrorEngine.load(target, draft, lanes) as engine:
        assert isinstance(engine.target, HFRunner) and engine.info.describe()["target"]["devices"] == ["cpu", "cpu"]
        for prompt in prompts(2, seed=11):
            ref = hf_greedy(target, prompt, 16)
            for decoder in ("ar", "sd", "mirror"):
                assert list(engine.generate(Request(prompt, decoder, 16, spec=SpecConfig(3, 2))).token_ids) == ref
    with pytest.raises(MirrorError, match="fast runner keeps a model on one device"):
        MirrorEngine.load(target, None, LaneConfig("cpu", "cpu", "inline", runner="fast", target_devices=("cpu", "cpu")))
    assert main(["generate", "--target", target, "--prompt-ids", "1,2", "--decoder", "ar", "--target-device", "auto"]) == 2
    assert "spreads the target over two or more accelerators" in capsys.readouterr().err
    with pytest.raises(MirrorError, match="target devices must list two or more devices"):
        LaneConfig(target_devices=("cpu",))
