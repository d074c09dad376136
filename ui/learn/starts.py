"""Where the Learn tab's what-if and speedup curve start, each with the source of its figures said on the page:

- this machine: the visitor's last Mirror-SD run (measured spans, with T_AR from its AR run), else the loaded pair's
  load-time timings (pair.PairInfo: measured here when the pair loaded);
- the recorded example (ui/learn/example.py): measured where it was recorded, and labelled with that machine and file;
- the paper's illustrative accelerator (docs/ALGORITHM.md §4): illustrative, measured nowhere.

Every "chosen for this machine" γ, κ (the latency model's choice at load) is shown beside what a run measured.
"""
from __future__ import annotations

from dataclasses import dataclass

from mirror_core import machine

from .example import Example, load_example
from ..numbers import latency_model, speedup
from ..session import DecoderRun, Session
from ..whatif import ACCELERATOR, WhatIf

THIS_MACHINE = "This machine"
EXAMPLE = "The recorded example"
PAPER = "Accelerators (the paper's illustrative numbers)"
STARTS = (THIS_MACHINE, EXAMPLE, PAPER)


@dataclass(frozen=True)
class Start:
    knobs: WhatIf
    note: str   # Markdown: where every figure comes from (measured here, measured elsewhere, illustrative)
    key: str    # names the figures: the tab reopens on a start only when its figures changed


def start(which: str, session: Session, info) -> Start:
    """The knobs and their source for one choice of the "Start from" radio; `info`: the loaded pair's PairInfo."""
    example = load_example()
    if which == PAPER or (which == EXAMPLE and example is None):
        return Start(ACCELERATOR, "Started from the paper's **illustrative** accelerator numbers (docs/ALGORITHM.md "
                                  "§4): measured nowhere, a worked example of the model.", PAPER)
    if which == THIS_MACHINE:
        found = _from_run(session, info) or _from_load(info)
        if found is not None:
            return found
    if example is None:
        return start(PAPER, session, info)
    return _from_example(example, "" if which == EXAMPLE else
                         "No run yet and no load-time timings of a loaded pair here, so not this machine's figures: ")


def _chosen(settings, info, measured: float | None) -> str:
    """The load's "chosen for this machine" γ, κ beside what the run measured (where the run used the choice)."""
    if not settings.spec_note or info is None or info.spec_choice is None or (info.target, info.draft) != (
            settings.target, settings.draft) or measured is None:
        return ""
    c = info.spec_choice
    verdict = ("it held" if measured >= 0.9 * c.speedup else
               "it did not hold here: the Experiments' γ and κ sweeps measure the alternatives")
    return (f" γ {c.gamma}, κ {c.kappa} were chosen for this machine at load as modelled **{c.speedup:.2f}×** AR; "
            f"this run measured **{measured:.2f}×**: {verdict}.")


def _from_run(session: Session, info) -> Start | None:
    mirror, ar = session.runs.get("mirror"), session.runs.get("ar")
    model = latency_model(mirror, ar)
    if model is None or not model.t_ar:
        return None
    measured, _ = speedup(ar, mirror)
    settings = mirror.start.settings
    note = (f"Started from **your last run** on this machine ({machine.cpu_model()}): its measured spans (the Run "
            f"tab's latency table; the window knob is the run's T_pre + Δ ÷ T_AR, the *window* of the fold under the "
            f"verdict), T_AR from its AR run. Mirror-SD measured "
            f"{'—' if measured is None else f'{measured:.2f}×'} AR; its spans model {model.speedup:.2f}×."
            + _chosen(settings, info, measured))
    return Start(WhatIf.from_model(model, settings.request.spec.gamma), note, f"run:{session.generation}")


def _from_load(info) -> Start | None:
    knobs = None if info is None else WhatIf.from_load(info)
    if knobs is None:
        return None
    c = info.spec_choice
    chosen = (f" At load the latency model chose γ {c.gamma}, κ {c.kappa} here (modelled {c.speedup:.2f}× AR); no run "
              "has measured it yet: run the Run tab to check." if c else "")
    note = (f"Started from **this machine's load-time timings** ({machine.cpu_model()}, the loaded pair): T_AR (the "
            "baseline's step), the window's cost (the *window at load* the choice of γ, κ modelled with) and the "
            "draft's step and branch rows, timed when the pair loaded. τ and FF come from the "
            "draft's profile (measured on held-out answers when it was trained, not here); " + (
                f"the readout and messages ({knobs.overhead_ms:.2f} ms a step) as a short run of each decoder timed "
                "them at load." if info.overheads else "the readout and messages are not timed at load (0 ms).")
            + chosen)
    return Start(knobs, note, f"load:{info.target}:{info.draft}")


def _from_example(example: Example, why: str) -> Start:
    mirror, ar = example.runs["mirror"], example.runs["ar"]
    measured, _ = speedup(ar, mirror)
    knobs = WhatIf.from_model(latency_model(mirror, ar), example.gamma)
    chosen = example.load.get("chosen")
    held = (f" γ {chosen['gamma']}, κ {chosen['kappa']} were chosen at its load as modelled "
            f"{chosen['modelled_speedup']:.2f}× AR; the recording measured {measured:.2f}×."
            if chosen and measured is not None else "")
    speeds = f"Mirror-SD {_tokens_per_s(mirror):.1f} vs AR {_tokens_per_s(ar):.1f} tok/s"
    return Start(knobs, f"{why}Started from {example.where}: its measured spans. Mirror-SD measured there "
                        f"{measured:.2f}× AR ({speeds})." + held,
                 f"example:{example.path}")


def _tokens_per_s(run: DecoderRun) -> float:
    return run.summary.tokens_per_s or 0.0
