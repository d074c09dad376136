"""The Learn tab's recorded example (assets/learn_example/example.json, written by scripts/record_learn_example.py):
one real run of AR, vanilla SD and Mirror-SD on the default pair, read back into DecoderRuns, so the step player,
the branch tree and the what-if open on something before a visitor's first run. It says where it was recorded: on
another machine its timings are that machine's, and the page says so.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache

from mirror_core import LaneConfig, Request, SamplingConfig, SpecConfig, machine
from mirror_core.events import RunEnd, RunSettings, RunStart, SpanEvent, StepRecord
from mirror_core.metrics import RunSummary

from ..session import DecoderRun, Session, TokenNamer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
EXAMPLE = os.path.join("assets", "learn_example", "example.json")  # relative to the repository (shown on the page)
FORMAT = "mirror-sd-learn-example/1"


class RecordedNamer(TokenNamer):
    """Token ids → the texts the recording kept (the page needs no tokenizer to show the example)."""

    def __init__(self, texts: dict[int, str]):
        super().__init__(None)
        self.texts = texts

    def text(self, token_id: int) -> str:
        return self.texts.get(token_id, f"{token_id} ")

    def show(self, token_id: int) -> str:
        if token_id < 0:
            return "—"
        return json.dumps(self.text(token_id), ensure_ascii=False)[1:-1].replace(" ", "␣") or "∅"


@dataclass(frozen=True)
class Example:
    """A recorded comparison: its runs by decoder, what the pair's load timed (ms), and where it was recorded."""

    path: str                 # the file, relative to the repository
    prompt: str
    cpu: str                  # the recording machine's CPU model (machine.cpu_model there)
    cores: int
    date: str
    target: str
    draft: str
    gamma: int
    kappa: int
    exit_layer: int
    num_layers: int
    load: dict                # t_ar_ms, verify_ratio, draft_step_ms, draft_rows_ms, rows_ms, chosen (γ, κ, why)
    runs: dict                # decoder → DecoderRun (ar, sd, mirror)

    @property
    def here(self) -> bool:
        """Recorded on a CPU of this machine's model with as many cores (its timings stand for this machine's)."""
        return self.cpu == machine.cpu_model() and self.cores == len(machine.usable_cpus())

    @property
    def where(self) -> str:
        """One line: what was recorded, where, and whether that is this machine."""
        host = ("this machine's CPU model and core count" if self.here else
                "another machine, not this one: its timings are that machine's")
        return (f"the recorded example ({self.path}: the default pair, “{self.prompt}”, recorded {self.date} on "
                f"{self.cpu}, {self.cores} cores: {host})")


def _run(decoder: str, data: dict, head: dict, namer: RecordedNamer) -> DecoderRun:
    run = DecoderRun(decoder, namer)
    spec = SpecConfig(gamma=head["pair"]["gamma"], kappa=head["pair"]["kappa"], exit_layer=head["pair"]["exit_layer"],
                      zero_windows=head["pair"].get("zero_windows", False))
    request = Request(tuple(head["prompt_ids"]), decoder, head["max_new_tokens"], SamplingConfig(), spec)
    settings = RunSettings(request, LaneConfig(kind=head["recorded"]["lanes"]), head["pair"]["exit_layer"],
                           head["pair"]["target"], head["pair"]["draft"], "")
    run.add(RunStart(decoder, request.prompt_ids, settings, 0.0))
    for lane, stage, t0, t1, step in data["spans"]:
        run.add(SpanEvent(lane, stage, t0, t1, step))
    for rec in data["steps"]:
        run.add(StepRecord(**{k: _tuples(v) for k, v in rec.items()}))
    summary = RunSummary(**{k: _tuples(v) for k, v in data["summary"].items()})
    run.add(RunEnd(tuple(data["token_ids"]), summary, None))
    return run


def _tuples(value):
    """JSON lists back into the tuples the engine's records hold (nested: the top-κ and branch rows)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


@cache
def load_example(path: str = EXAMPLE) -> Example | None:
    """The recorded example (None where the file is missing); read once per process, never written."""
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        return None
    with open(full, encoding="utf-8") as f:
        head = json.load(f)
    if head.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    namer = RecordedNamer({int(k): v for k, v in head["tokens"].items()})
    rec, pair = head["recorded"], head["pair"]
    runs = {d: _run(d, data, head, namer) for d, data in head["runs"].items()}
    return Example(path, head["prompt"], rec["cpu"], rec["cores"], rec["date"], pair["target"], pair["draft"],
                   pair["gamma"], pair["kappa"], pair["exit_layer"], pair["num_layers"], head["load"], runs)


def shown_runs(session: Session) -> tuple[dict, Example | None]:
    """What the Learn tab shows: the visitor's last Mirror-SD comparison, else the recorded example (then returned
    too, so the page can say what it is showing)."""
    mine = session.runs.get("mirror")
    if mine is not None and mine.steps:
        return session.runs, None
    example = load_example()
    return ({} if example is None else example.runs), example
