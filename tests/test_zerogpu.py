"""ZeroGPU mode (ui/zerogpu.py) without ZeroGPU: a fake `spaces` package whose GPU decorator does what ZeroGPU's
does to a call (fork a worker, pickle the arguments and every result across), fake CUDA devices for the plan."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import sys
import threading
import types
from types import SimpleNamespace

import pytest
import torch

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request, SamplingConfig, SpecConfig, machine
from testing.toy_models import hf_greedy
from ui import zerogpu
from ui.loader import ModelPolicy

ON = {zerogpu.ENV: "true"}


class FakeSpaces(types.ModuleType):
    """`spaces` as ZeroGPU Spaces have it: GPU(duration=...)(fn) runs each call in a forked process, with the
    arguments and the results pickled (a generator's values one by one), like spaces.zero.wrappers."""

    def __init__(self, fork: bool = True):
        super().__init__("spaces")
        self.durations: list = []
        self.calls = 0
        self.fork = fork

    def GPU(self, task=None, *, duration=None, size=None):  # noqa: N802 (the package's name)
        self.durations.append(duration)

        def wrap(fn):
            import inspect

            if inspect.isgeneratorfunction(fn):
                def generator(*args, **kwargs):
                    self.calls += 1
                    yield from self._run(fn, args, kwargs, True)
                return generator

            def regular(*args, **kwargs):
                self.calls += 1
                return next(self._run(fn, args, kwargs, False))
            return regular
        return wrap(task) if callable(task) else wrap

    def _run(self, fn, args, kwargs, generator: bool):
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))  # what ZeroGPU's queue does to them
        if not self.fork:
            results = fn(*args, **kwargs) if generator else iter([fn(*args, **kwargs)])
            yield from (pickle.loads(pickle.dumps(r)) for r in results)
            return
        ctx = multiprocessing.get_context("fork")
        queue = ctx.SimpleQueue()

        def worker():
            try:
                for r in (fn(*args, **kwargs) if generator else [fn(*args, **kwargs)]):
                    queue.put(("value", r))
                queue.put(("end", None))
            except BaseException as exc:  # noqa: BLE001 - ZeroGPU reports it as "ZeroGPU worker error"
                queue.put(("error", type(exc).__name__))

        proc = ctx.Process(target=worker, daemon=True)
        proc.start()
        try:
            while True:
                kind, value = queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise RuntimeError(f"ZeroGPU worker error: {value}")
                yield value
        finally:
            if proc.is_alive():
                proc.terminate()  # the page closed the call
            proc.join(timeout=30)


@pytest.fixture
def fake_spaces(monkeypatch):
    def install(fork: bool = True) -> FakeSpaces:
        module = FakeSpaces(fork)
        monkeypatch.setitem(sys.modules, "spaces", module)
        return module
    return install


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine has one CUDA device, as far as the device layer can tell (as `spaces` makes torch say)."""
    backend = SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                              get_device_name=lambda dev: "ZeroGPU slice")
    monkeypatch.setattr(machine, "_backend", lambda kind: backend if kind == "cuda" else None)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_the_mode_is_off_without_the_variable_and_changes_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    for env in ({}, {zerogpu.ENV: ""}, {zerogpu.ENV: "false"}, {zerogpu.ENV: "0"}):
        mode = zerogpu.detect(env)
        assert not mode.zero_gpu

        def fn():
            yield 1
        assert mode.gpu(fn) is fn
    assert "spaces" not in sys.modules  # imported only on ZeroGPU
    lanes = LaneConfig("cpu", "cpu", "inline")
    assert mode.loader(lanes)._load == MirrorEngine.load  # as before
    assert mode.plan(kind="inline").lanes.kind == "inline"


def test_a_missing_spaces_package_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` raises ImportError
    with pytest.raises(MirrorError) as err:
        zerogpu.detect(ON)
    assert "'spaces' package is not installed" in str(err.value) and zerogpu.REQUIREMENTS in str(err.value)
    assert "\n" not in str(err.value)
    import app

    monkeypatch.setenv(zerogpu.ENV, "1")
    assert app.main(["--port", "7999"]) == 2  # before any model is prepared or a server starts
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("error: this is a ZeroGPU Space")


def test_zerogpu_wraps_with_spaces_gpu_and_a_generator_still_yields(fake_spaces):
    fake = fake_spaces(fork=False)
    mode = zerogpu.detect(ON)
    assert mode.zero_gpu

    def count(n):
        yield from range(n)
    wrapped = mode.gpu(count)
    assert fake.durations == [zerogpu.DURATION_S] and list(wrapped(3)) == [0, 1, 2] and fake.calls == 1
    assert zerogpu.detect(ON, duration_s=30).gpu(lambda: 7)() == 7 and fake.durations[-1] == 30


def test_zerogpu_plans_one_gpu_with_the_draft_on_a_second_stream(fake_spaces, one_gpu):
    fake_spaces()
    mode = zerogpu.detect(ON)
    plan = mode.plan()
    assert (plan.lanes.target_device, plan.lanes.draft_device, plan.lanes.kind) == ("cuda:0", "cuda:0", "thread")
    assert plan.reasons[0] == zerogpu.REASON == "ZeroGPU: one GPU per call, draft on a second stream"
    assert any("stream of its own" in r for r in plan.reasons[1:])
    assert machine.check(plan.lanes.draft_device) == torch.device("cuda:0")
    assert mode.plan("cuda", "cuda:0", "inline").lanes.kind == "inline"
    for asked in ({"kind": "process"}, {"target_device": "cpu"}, {"draft_device": "cuda:1"}):
        with pytest.raises(MirrorError, match="a ZeroGPU call has one GPU and no other process"):
            mode.plan(**asked)


def test_a_comparison_runs_in_forked_gpu_calls_and_stays_lossless(fake_spaces, pairs):
    """The page's process loads nothing: every load and run is a call in a fresh fork (the worker's threads and the
    pair exist only there), and the Run tab's generator gets the same tokens as the target alone."""
    from ui.session import Session
    from ui.settings import ComparisonSettings
    from ui.streaming import DONE, run_comparison

    fake = fake_spaces(fork=True)
    target, draft = pairs["llama"]
    lanes = LaneConfig("cpu", "cpu", "thread", dtype="float32")  # the plan's shape, on this machine's CPU
    loader = zerogpu.detect(ON).loader(lanes, ModelPolicy())
    engine = loader.get(target, draft)
    assert isinstance(engine, zerogpu.WorkerEngine) and engine.info.draft == draft and fake.calls == 1
    assert zerogpu._worker_loader is None  # nothing was loaded in this process
    prompt = (1, 2, 3, 4)
    ref = hf_greedy(target, prompt, 12)
    for decoder in ("ar", "sd", "mirror"):
        end = engine.generate(Request(prompt, decoder, 12, spec=SpecConfig(3, 2)))
        assert end.error is None and list(end.token_ids) == ref, decoder
    with pytest.raises(MirrorError, match="exit layer must be in"):  # checked here, before any GPU call
        engine.stream(Request(prompt, "mirror", 4, spec=SpecConfig(3, 2, exit_layer=99)))
    calls = fake.calls

    session = Session()
    settings = ComparisonSettings(target, draft, "1 2 3 4", ("ar", "mirror"), 8, SamplingConfig(), SpecConfig(3, 2))
    ticks = list(run_comparison(loader, session, settings, settle_s=0.0))
    assert ticks[-1].kind == DONE and session.error is None, session.status
    assert session.runs["ar"].end.token_ids == session.runs["mirror"].end.token_ids
    assert fake.calls == calls + 4  # a one-token warm prefill and the timed run, per decoder


def test_a_worker_error_comes_back_as_its_own_line(fake_spaces, tmp_path):
    fake_spaces(fork=True)
    loader = zerogpu.detect(ON).loader(LaneConfig("cpu", "cpu", "inline"), ModelPolicy())
    with pytest.raises(MirrorError) as err:
        loader.get(str(tmp_path / "no-such-model"), None)
    assert "ZeroGPU worker error" not in str(err.value) and "\n" not in str(err.value)


def test_stop_closes_the_call_and_keeps_what_came_before(fake_spaces, pairs):
    fake_spaces(fork=True)
    target, draft = pairs["llama"]
    loader = zerogpu.detect(ON).loader(LaneConfig("cpu", "cpu", "thread", dtype="float32"), ModelPolicy())
    engine = loader.get(target, draft)
    stop = threading.Event()
    tokens = []
    for event in engine.stream(Request((1, 2, 3), "mirror", 200, spec=SpecConfig(3, 2)), stop):
        if type(event).__name__ == "TokenEvent":
            tokens.append(event.token_id)
            stop.set()
    assert 1 <= len(tokens) < 200 and tokens == hf_greedy(target, (1, 2, 3), len(tokens))


def test_the_zerogpu_requirements_pin_a_torch_zerogpu_supports_and_otherwise_follow_requirements_txt():
    """ZeroGPU's documented PyTorch releases (docs/DEPLOY.md cites them); every other pin as requirements.txt."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def pins(name: str) -> dict[str, str]:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        return {re.split(r"[=<>~!]", ln, maxsplit=1)[0]: ln for ln in lines}

    zero, plain = pins(zerogpu.REQUIREMENTS), pins("requirements.txt")
    assert zero.pop("torch") in {f"torch=={v}" for v in ("2.8.0", "2.9.1", "2.10.0", "2.11.0")}
    assert re.fullmatch(r"spaces==[\d.]+", zero.pop("spaces"))
    plain.pop("torch")
    assert zero == plain
