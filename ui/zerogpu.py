"""ZeroGPU mode: on a Hugging Face ZeroGPU Space (SPACES_ZERO_GPU set) the page's process has no GPU; each
`spaces.GPU` call gets one GPU in a worker process forked from it, with the call's arguments and every value it
yields pickled across. So the lanes run there, never in the page's process:

- the plan is one GPU: the target on `cuda`, the draft beside it as a thread lane on a stream of its own (or
  inline); a draft process could not use the call's GPU;
- the engine the page holds is a WorkerEngine: the tokenizer and the pair's PairInfo (to check requests and
  encode prompts), while each `stream` is one GPU call that runs the real MirrorEngine in the worker and yields
  its events back. The worker loads the pair on its first call and keeps it while ZeroGPU reuses the worker (a
  MirrorEngine's lane threads would not survive the fork, and calibration and warm-up run on the GPU: loading
  in the page's process is not possible);
- Stop closes the call: the worker's run stops within one step, and the events before it are kept.

Elsewhere the mode is off and changes nothing. `spaces` is imported only when the variable is set.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request
from mirror_core.lanes.placement import LanePlan, plan_lanes
from mirror_core.models.loading import load_tokenizer

from .loader import EngineLoader, ModelPolicy

ENV = "SPACES_ZERO_GPU"  # set ("true") by Hugging Face on ZeroGPU Spaces; the `spaces` package reads the same one
REASON = "ZeroGPU: one GPU per call, draft on a second stream"
DURATION_S = 120  # spaces.GPU(duration=...): a call's longest run (ZeroGPU's default is 60 s); shorter queues sooner
REQUIREMENTS = "requirements-zerogpu.txt"


@dataclass(frozen=True)
class GpuMode:
    """Whether this is a ZeroGPU Space, and what follows: the lane plan, the engine loader, the GPU wrapper."""

    zero_gpu: bool = False
    duration_s: int = DURATION_S

    def gpu(self, fn: Callable) -> Callable:
        """`spaces.GPU(duration=...)(fn)` on ZeroGPU (generator functions stay generators), else fn itself."""
        if not self.zero_gpu:
            return fn
        return _spaces().GPU(duration=self.duration_s)(fn)

    def plan(self, target_device: str | None = None, draft_device: str | None = None, kind: str | None = None,
             dtype: str = "auto") -> LanePlan:
        """plan_lanes; on ZeroGPU both lanes on the call's one GPU (MirrorError for flags that ask otherwise)."""
        if not self.zero_gpu:
            return plan_lanes(target_device, draft_device, kind, dtype=dtype)
        for flag, value, allowed in (("--target-device", target_device, ("cuda", "cuda:0")),
                                     ("--draft-device", draft_device, ("cuda", "cuda:0")),
                                     ("--lane", kind, ("thread", "inline"))):
            if value is not None and value not in allowed:
                raise MirrorError(f"{flag} {value}: a ZeroGPU call has one GPU and no other process, so the lanes run "
                                  "on cuda (the draft as a thread or inline lane)")
        kind = kind or "thread"
        plan = plan_lanes("cuda", None if kind == "thread" else "cuda", kind, dtype=dtype)
        return replace(plan, reasons=(REASON, *plan.reasons))

    def loader(self, lanes: LaneConfig, policy: ModelPolicy = ModelPolicy()) -> EngineLoader:
        """The page's EngineLoader; on ZeroGPU its engines are WorkerEngines (nothing loads in this process)."""
        if not self.zero_gpu:
            return EngineLoader(lanes, policy=policy)
        return EngineLoader(lanes, load=WorkerPair(self.gpu(_worker_info), self.gpu(_worker_stream)).load,
                            warmup=False, policy=policy)  # the worker's own loader warms the pair up where it runs


def detect(env: Mapping[str, str], duration_s: int = DURATION_S) -> GpuMode:
    """The mode for this environment (app.py passes os.environ). On ZeroGPU `spaces` is imported now: it must be
    imported before anything initialises CUDA, and a missing package is one clear line here, not a failed call."""
    mode = GpuMode(env.get(ENV, "").strip().lower() in ("1", "t", "true"), duration_s)  # spaces' own reading
    if mode.zero_gpu:
        _spaces()
    return mode


def _spaces():
    try:
        import spaces
    except ImportError:
        raise MirrorError(f"this is a ZeroGPU Space ({ENV} is set) but the 'spaces' package is not installed: "
                          f"deploy {REQUIREMENTS} as requirements.txt (docs/DEPLOY.md)") from None
    return spaces


# -- the page's side ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failed:
    """An error raised in the GPU worker, carried back as a value (ZeroGPU would replace its message)."""

    message: str
    user_error: bool  # a MirrorError: a problem the user can fix

    def exception(self) -> Exception:
        return MirrorError(self.message) if self.user_error else RuntimeError(self.message)

    @classmethod
    def of(cls, exc: Exception) -> "Failed":
        if isinstance(exc, MirrorError):
            return cls(str(exc), True)
        return cls(f"{type(exc).__name__}: {exc}", False)


@dataclass(frozen=True)
class WorkerPair:
    """The two GPU calls, wrapped once at start-up (ZeroGPU registers its functions before the server starts)."""

    info: Callable     # (target, draft, lanes, trust_remote_code) → PairInfo | Failed: loads the pair in a worker
    stream: Callable   # (target, draft, lanes, trust_remote_code, request) → its events (then a Failed, if any)

    def load(self, target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool = False) -> "WorkerEngine":
        """EngineLoader's `load`: the pair loaded in a GPU worker; here only its tokenizer."""
        key = (target, draft, lanes, trust_remote_code)
        info = self.info(*key)
        if isinstance(info, Failed):
            raise info.exception()
        return WorkerEngine(self, key, info, load_tokenizer(target))


class WorkerEngine(MirrorEngine):
    """A MirrorEngine whose lanes run in ZeroGPU's GPU worker. This process keeps what checks a request and encodes
    a prompt (validate, encode, generate and info are MirrorEngine's own); every stream is one GPU call."""

    switches_formats = False  # the pair lives in the GPU worker: another format loads it again there

    def __init__(self, calls: WorkerPair, key: tuple, info, tokenizer) -> None:  # no lanes here: nothing to start
        self.calls, self.key = calls, key
        self.target, self.info, self.tokenizer, self.eos_ids = None, info, tokenizer, frozenset()
        self.lane = None if info.draft is None else "in the GPU worker"  # MirrorEngine.validate: a draft is loaded

    def _stream(self, request: Request, stop) -> Iterator:  # `request`: resolved by validate (the worker checks again)
        remote = self.calls.stream(*self.key, request)
        try:
            for item in remote:
                if isinstance(item, Failed):
                    raise item.exception()
                yield item
                if stop.is_set():
                    return  # closing the call (below) stops the worker's run within one step
        finally:
            remote.close()

    def close(self) -> None:
        """Nothing to end here: the pair lives (and ends) with the GPU worker."""


# -- the GPU worker's side (a fork of the page's process; arguments and results are pickled) --------------------
_worker_loader: EngineLoader | None = None  # the pair this worker has loaded, kept while ZeroGPU reuses the worker


def _worker_engine(target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool) -> MirrorEngine:
    global _worker_loader
    if _worker_loader is None:
        # A fork of a process that has run CPU kernels on several threads (the page's process prepares the model)
        # hangs in its first multi-threaded CPU kernel (OpenMP's pool does not survive a fork: measured with this
        # torch, tests/test_zerogpu.py). The lanes run on the GPU; the worker's CPU side needs one thread.
        torch.set_num_threads(1)
    if _worker_loader is None or _worker_loader.lanes != lanes:
        # the page's loader has applied its ModelPolicy already; this one only loads and warms up
        _worker_loader = EngineLoader(lanes, policy=ModelPolicy(trust_remote_code=trust_remote_code))
    return _worker_loader.get(target, draft)


def _worker_info(target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool):
    try:
        return _worker_engine(target, draft, lanes, trust_remote_code).info
    except Exception as exc:  # noqa: BLE001 - carried back as a value: ZeroGPU would hide its message
        return Failed.of(exc)


def _worker_stream(target: str, draft: str | None, lanes: LaneConfig, trust_remote_code: bool, request: Request):
    try:
        engine = _worker_engine(target, draft, lanes, trust_remote_code)
        yield from engine.stream(request)  # closed by ZeroGPU when the page closes the call: stops within a step
    except Exception as exc:  # noqa: BLE001 - carried back as a value: ZeroGPU would hide its message
        yield Failed.of(exc)
