"""MirrorEngine: load a target/draft pair onto two lanes once, then stream events per request.

    engine = MirrorEngine.load("path/or/hub-id/target", "path/or/hub-id/draft")
    for event in engine.stream(Request(prompt_ids=(1, 2, 3), decoder="mirror")):
        ...
    engine.close()

The target runs on the engine's target-lane thread (pinned to its cores); the draft on its own
lane (a process by default). No global state: two engines are independent. What a loaded pair is, and the
phases that load it: pair.py.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import queue
import threading
from dataclasses import replace
from typing import Iterator

from .config import (DTYPE_CHOICES, SERIAL_DECODERS, LaneConfig, MirrorError, Request, SpecConfig, check_prompt_text,
                     parse_token_ids)
from .decode import decode_events
from .decode_state import DecodeState
from .events import STAGE_TARGET_STEP, Event, RunEnd, SpanEvent, StepRecord
from .latency import StepOverheads
from .latency import per_step_totals
from .phases import step_phases
from .runners.exactness import probe_ids
from .lanes import make_draft_lane, pinned, prefill_cpus
from .metrics import RunSummary
from .models.loading import encode_text
from .kernels.formats import NEEDS
from .pair import (PairInfo, draft_lane_spec, lane_plan, load_target, pair_info, read_pair, with_overheads,
                   with_target_timing)
from .target_timing import TargetTiming, time_target, time_whole_machine


OVERHEAD_PROMPT, OVERHEAD_TOKENS = 32, 24  # the probe prompt's tokens and each decoder's new tokens (_time_overheads)


class MirrorEngine:
    """A loaded target/draft pair on two lanes; `stream(request)` yields the run's typed events.

    The target runs on this engine's own thread (the target lane, pinned to its cores); the draft
    runs on its lane (lanes/: a process, a thread or inline). Requests are served one at a time, in
    order; `close()` ends both lanes. The engine sees token ids only: `encode` is the one prompt encoder
    for front-ends that have text (the CLI and the page).
    """

    def __init__(self, target_runner, draft_lane, info: PairInfo, tokenizer, eos_ids: frozenset[int], config=None):
        """`config`: the target's model config (the calibration cache's key when set_target_format re-times it)."""
        self.target, self.lane, self.info = target_runner, draft_lane, info
        self.tokenizer, self.eos_ids, self._config = tokenizer, eos_ids, config
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._target_lane, name="mirror-target-lane", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, target: str, draft: str | None, lanes: LaneConfig | None = None,
             trust_remote_code: bool = False) -> "MirrorEngine":
        """Load a pair onto its lanes, phase by phase: the lane plan; both models' configs checked together (no
        weights yet); the target and its early-exit readout; its dtype and call-shape check timed where it runs
        (and the whole-machine baseline); the draft's lane started; γ, κ chosen for this machine."""
        lanes = lane_plan(lanes, os.environ)
        pair = read_pair(target, draft, lanes, trust_remote_code)
        loaded = load_target(target, draft, lanes, trust_remote_code, pair.vocab)
        timed = time_target(loaded.runner, pair.vocab, lanes, loaded.config)
        lane = None if draft is None else make_draft_lane(lanes, draft_lane_spec(draft, lanes, pair, trust_remote_code))
        info = pair_info(target, draft, lanes, pair, loaded, timed, lane)
        engine = cls(loaded.runner, lane, info, pair.tokenizer, loaded.eos_ids, loaded.config)
        if info.spec_choice is not None:  # the latency model chose γ, κ: it gets the overheads, and chooses again
            engine._time_overheads()
        return engine

    def _time_overheads(self) -> None:
        """A short run of ar, sd and mirror on a probe prompt, every speculative step a draft-model window (no windows
        of zero, no context draft), split by phase (phases.py): ar's step (the baseline, timed in the same minute),
        each decoder's window where it runs, and what a step costs beyond the target's passes and the draft's work
        (the readout; acceptance, bookkeeping, messages) go into the latency model that chose γ, κ, which chooses
        again (pair.with_overheads). Left out, the model as it was, where a run does not finish cleanly."""
        prompt = tuple(probe_ids(self.info.vocab_size, OVERHEAD_PROMPT, 7, 3))
        spec = self.info.resolve(SpecConfig())
        spec = replace(spec, context=replace(spec.context, enabled=False), zero_windows=False)
        phases = {}
        for decoder in ("ar", "sd", "mirror"):
            events = list(self.stream(Request(prompt, decoder, OVERHEAD_TOKENS, spec=spec, stop_at_eos=False)))
            end = events[-1]
            if not isinstance(end, RunEnd) or end.error or end.fallback or end.summary is None:
                return
            spans = [e for e in events if isinstance(e, SpanEvent)]
            phases[decoder] = step_phases(decoder, spans, [e for e in events if isinstance(e, StepRecord)],
                                          end.summary.tau)
            if decoder == "ar":  # the median step: the first steps on a pool's cores pay its threads' start
                ar_step = 1e3 * statistics.median(per_step_totals(spans, (STAGE_TARGET_STEP,)).values() or [0.0])
            if phases[decoder] is None:
                return
        mirror, sd = dict(phases["mirror"].parts), dict(phases["sd"].parts)
        self.info = with_overheads(self.info, StepOverheads(
            round(mirror.get("readout", 0.0), 3), round(phases["sd"].overhead_ms, 3),
            round(phases["mirror"].overhead_ms, 3), round(sd.get("verify", 0.0), 3), spec.gamma,
            round(mirror.get("prefix", 0.0) + mirror.get("suffix", 0.0), 3), round(ar_step, 3),
            round(phases["sd"].draft_in_wait_ms, 3)))

    @staticmethod
    def check_pair(target: str, draft: str | None, lanes: LaneConfig | None = None,
                   trust_remote_code: bool = False) -> None:
        """load's first checks alone (both configs and tokenizers found, supported and fitting together; no
        weights, no lanes): MirrorError when the pair cannot load, so a caller can keep the pair it has until then."""
        read_pair(target, draft, lanes or LaneConfig(), trust_remote_code)

    # -- the target's format ------------------------------------------------------------------
    def format_change(self, fmt: str) -> bool:
        """Whether `fmt` (DTYPE_CHOICES; auto: the pair's own) is another function than the target computes now;
        MirrorError for a format its runner does not offer."""
        if fmt not in DTYPE_CHOICES:
            raise MirrorError(f"format must be one of {', '.join(DTYPE_CHOICES)}, got {fmt!r}")
        offered = self.info.target_formats
        if fmt != "auto" and fmt not in offered:
            blocks = f" ({NEEDS[fmt]})" if fmt in NEEDS else ""
            raise MirrorError(f"this target offers the formats {', '.join(offered)}, not {fmt}{blocks}")
        now = self.info.target_dtype
        return now is None or (self.info.pair_format if fmt == "auto" else fmt) != now.sequence

    @property
    def switches_formats(self) -> bool:
        """Whether set_target_format can change the format on this loaded pair: a runner that changes only its linear
        maps, and kept its loaded weights (LaneConfig.keep_formats); else the pair loads again in the format."""
        return self.info.lanes.keep_formats and not self.target.formats.whole_model and self._config is not None

    def set_target_format(self, fmt: str) -> None:
        """The target in format `fmt` on the loaded pair (auto: the pair's own), timed and checked as a load does it
        (its row plan, whole-machine step, roofline, γ and κ); the draft lane stays as it is. Between requests."""
        if not self.format_change(fmt):
            return
        if not self.switches_formats:
            raise MirrorError("this pair's target cannot change its format once loaded (a whole-model runner, or its "
                              "loaded weights were freed: LaneConfig.keep_formats); load it again in that format")
        with self._lock:  # no request runs meanwhile
            timed = time_target(self.target, self.info.vocab_size, replace(self.info.lanes, dtype=fmt), self._config)
            self.info = with_target_timing(self.info, self.target, timed, self.lane)

    def recheck_whole_machine(self, stop: threading.Event | None = None) -> None:
        """The whole machine's step beside the lane's timed again (another process may have come or gone since the
        load; target_timing.time_whole_machine, bounded): where ar and sd run, the baseline and γ, κ follow it.
        Between requests; nothing to do where the load timed no whole machine (the lane has every core); `stop` set
        meanwhile ends it between two timings, the load's figures kept."""
        if self.info.whole_machine is None:
            return
        with self._lock:
            info = self.info
            whole = time_whole_machine(self.target, info.lanes, stop)
            if whole is not None:
                timed = TargetTiming(info.target_dtype, info.target_rows, whole)
                self.info = with_target_timing(info, self.target, timed, self.lane)

    # -- requests --------------------------------------------------------------------------
    def validate(self, request: Request) -> Request:
        """Check a request against the loaded pair; returns it with what it left out decided by the pair
        (PairInfo.resolve: γ, κ, ℓ_e), the request a run then decodes and records."""
        request = replace(request, spec=self.info.resolve(request.spec))
        n, spec = self.info.num_layers, request.spec
        exit_layer = spec.exit_layer
        if not 1 <= exit_layer <= n - 1:
            raise MirrorError(f"exit layer must be in 1..{n - 1} for this {n}-layer target, got {exit_layer}")
        reads = self.info.draft_features
        if reads is not None and request.decoder != "ar" and exit_layer != reads:
            raise MirrorError(f"this draft reads the target's hidden states after layer {reads}, so the exit layer is "
                              f"{reads} (got {exit_layer}); load a token-only draft to vary it")
        if request.decoder != "ar" and self.lane is None:
            raise MirrorError(f"decoder {request.decoder!r} needs a draft model; load one or use 'ar'")
        bad = [t for t in request.prompt_ids if t >= self.info.vocab_size]
        if bad:
            raise MirrorError(f"prompt id {bad[0]} is outside the vocabulary (0..{self.info.vocab_size - 1})")
        need = len(request.prompt_ids) + request.max_new_tokens + spec.gamma + 2
        if self.info.max_context and need > self.info.max_context:
            raise MirrorError(f"prompt ({len(request.prompt_ids)} tokens) + max new tokens ({request.max_new_tokens}) "
                              f"+ window ({spec.gamma + 2}) exceeds the models' context of "
                              f"{self.info.max_context} tokens; refused (prompts are never truncated): "
                              "shorten the prompt or lower max new tokens"
                              + (f" (at most {room} with this prompt and γ)" if (room := self.info.max_context
                                 - len(request.prompt_ids) - spec.gamma - 2) > 0 else ""))
        return request

    def encode(self, text: str, chat: bool = True) -> tuple[int, ...]:
        """Prompt text → token ids, after the text checks (MirrorError): the one encoder of the CLI and the page.
        With the target's tokenizer (with chat, in its chat template when it has one: loading.encode_text); a
        target without one takes the ids written out (config.parse_token_ids: commas, spaces or both)."""
        check_prompt_text(text)
        if self.tokenizer is None:
            return parse_token_ids(text, "the prompt (this target has no tokenizer)")
        ids = encode_text(self.tokenizer, text, chat)
        if not ids:
            raise MirrorError("the prompt encodes to no tokens")
        return ids

    def stream(self, request: Request, stop: threading.Event | None = None) -> Iterator[Event]:
        """Validate now (raising MirrorError), then return an iterator of events ending in RunEnd."""
        return self._stream(self.validate(request), stop or threading.Event())

    def warm_prefill(self, request: Request, stop: threading.Event | None = None) -> None:
        """The same request for one token, untimed: both lanes' prefill paths warm before a timed run of it (the
        CLI's generate and each of the page's runs do it alike, so that neither's first run pays one-off costs and
        their timings compare: AR was always first on the page and its TTFT was always higher)."""
        for _ in self.stream(replace(request, max_new_tokens=1), stop):
            pass

    def generate(self, request: Request, stop: threading.Event | None = None) -> RunEnd:
        """The non-streaming call: the last event of stream()."""
        return list(self.stream(request, stop))[-1]

    def _stream(self, request: Request, stop: threading.Event) -> Iterator[Event]:
        out: queue.Queue = queue.Queue()
        with self._lock:
            self._jobs.put((request, stop, out))
            finished = False
            try:
                while (batch := out.get()) is not None:
                    yield from batch
                finished = True
            finally:  # closed early: stop the run within one step and wait until no lane is busy
                if not finished:
                    stop.set()
                    while out.get() is not None:
                        pass

    def _target_lane(self) -> None:
        """The target lane's thread: pinned once, then runs one request after another (ar and sd on the cores
        PairInfo.serial_cpus names, when it names any: read per request, as the machine's last timing left it)."""
        lanes, kernel = self.info.lanes, self.target.kernel.library is not None
        with pinned(lanes.target_cpus if lanes.target_device == "cpu" else (), lanes.target_threads, kernel):
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                request, stop, out = job
                serial = self.info.serial_cpus  # recheck_whole_machine may have moved it since the load
                cores = serial if serial and request.decoder in SERIAL_DECODERS else ()
                try:
                    with pinned(cores, len(cores), kernel) if cores else contextlib.nullcontext():
                        self._run(request, stop, out)
                except Exception as exc:  # never leave a consumer without a RunEnd
                    out.put([RunEnd((), RunSummary(request.spec.gamma), None, error=f"{type(exc).__name__}: {exc}")])
                finally:
                    if self.lane is not None:
                        self.lane.drain()
                    out.put(None)

    def _run(self, request: Request, stop: threading.Event, out: queue.Queue) -> None:
        serial, lanes = self.info.serial_cpus, self.info.lanes
        features = self.info.draft_features is not None and request.decoder != "ar"
        # the steps that run on cores the draft lane holds: sd's on ar's; Mirror-SD's plain ones, and every one
        # where the draft lane lends its cores for the layers before the early exit (PairInfo.lend_cpus)
        on_ar, lent = (bool(set(cpus) & set(lanes.draft_cpus)) for cpus in (serial, self.info.lend_cpus))
        shared = {"sd": "all" if on_ar else "",
                  "mirror": "all" if lent else "plain" if on_ar else ""}.get(request.decoder, "")
        run = DecodeState(request, self.target, request.spec.exit_layer, self.eos_ids, stop,
                          self.info.run_settings(request), features=features,
                          window_steps=self.info.window_steps(), step_s=self.info.step_s(),
                          plain_s=self.info.plain_step_s(),
                          plain_cpus=serial if request.decoder == "mirror" else (), shared=shared,
                          prefill_cpus=prefill_cpus(lanes, features, self.target.kernel.library is not None))
        for batch in decode_events(run, self.lane):
            out.put(batch)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)
        if self.lane is not None:
            self.lane.close()

    def __enter__(self) -> "MirrorEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
