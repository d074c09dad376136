"""Contradictions between what the page says in its verdict, its fold and its Why (ui/verdict.py, ui/costs.py,
ui/numbers.py), read from the rendered text as a reader reads it: each figure said twice must be the same figure,
and each claim must agree with the figure it rests on. contradictions() returns one line per disagreement found."""
from __future__ import annotations

import re
from dataclasses import dataclass

NUMBER = r"(-?\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class PageTexts:
    """The three texts as the browser renders them (innerText / textContent)."""

    verdict: str   # the box above the fold: the plain sentence, the noise line, the gauge
    fold: str      # "Why, in numbers, with every definition": the arithmetic, the step bars, the chain
    why: str       # the latency table's Why: the run's measured steps, then the model's


def _first(pattern: str, text: str) -> tuple[float, ...] | None:
    m = re.search(pattern, text)
    return None if m is None else tuple(float(g) for g in m.groups())


def contradictions(t: PageTexts) -> list[str]:
    """Every disagreement between the texts (an empty list: none found)."""
    found: list[str] = []

    def same(what: str, a: tuple[float, ...] | None, b: tuple[float, ...] | None) -> None:
        if a is not None and b is not None and a != b:
            found.append(f"{what}: {a} in one place, {b} in another")

    head = _first(rf"Mirror-SD ran at {NUMBER}× AR's speed", t.verdict)
    fold_x = _first(rf"Mirror-SD {NUMBER}× AR \(", t.fold)
    same("Mirror-SD × AR", head, fold_x)
    same("Mirror-SD × vanilla SD", _first(rf"\({NUMBER}× vanilla SD's speed\)", t.verdict),
         _first(rf"· {NUMBER}× vanilla SD", t.fold))
    lost, won = "Speculation lost here" in t.verdict, "Speculation won here" in t.verdict
    slower, faster = "Slower here than AR" in t.fold, "Faster here than AR" in t.fold
    if fold_x is not None:
        if (slower and fold_x[0] >= 1) or (faster and fold_x[0] < 1):
            found.append(f"the fold calls {fold_x[0]:.2f}× AR {'slower' if slower else 'faster'}")
        if lost and won or (slower and won and fold_x[0] < 1):
            found.append("the verdict says speculation both won and lost")
    step = _first(rf"each step cost {NUMBER} AR steps but committed only {NUMBER} tokens", t.verdict) \
        or _first(rf"each step cost {NUMBER} AR steps and committed {NUMBER} tokens", t.verdict)
    whole = _first(rf"a whole step cost {NUMBER} AR steps \({NUMBER} ÷", t.fold)
    if step is not None and whole is not None:
        same("a Mirror-SD step in AR steps", step[:1], whole[:1])
    gauge = _first(rf"Mirror-SD\s+needs τ {NUMBER} · got {NUMBER}", t.verdict)
    if gauge is not None and step is not None:
        same("the gauge's τ needed and got against the sentence's", gauge, step)
    for decoder, title in (("mirror", "Mirror-SD"), ("sd", "vanilla SD")):
        bar = _first(rf"{'Mirror-SD' if decoder == 'mirror' else 'Vanilla SD'}: one step, τ = {NUMBER} tokens\s*"
                     rf"{NUMBER} ms", t.fold)
        said = _first(rf"{'a Mirror-SD' if decoder == 'mirror' else 'vanilla SD.s'} step took {NUMBER} ms", t.why)
        if bar is not None:
            same(f"{title}'s measured step (the bars against the Why)", bar[1:], said)
    if "(SD was faster)" in t.fold:
        per_token = _first(rf"\(τ {NUMBER} vs {NUMBER}: {NUMBER} vs {NUMBER} ms a token\)", t.fold)
        if per_token is not None and per_token[2] < per_token[3] and "the readings disagree" not in t.fold:
            found.append("the fold says SD was faster next to a Mirror-SD step that is cheaper per token")
    pays = "speculation pays where the answer copies" in t.fold
    if pays and (slower or lost):
        found.append("a claim that speculation pays beside a run where it did not")
    if re.search(r"the window of γ\+1 = (\d+) tokens", t.fold) and re.search(r"committed (\d+\.\d+) tokens", t.fold):
        window = int(re.search(r"the window of γ\+1 = (\d+) tokens", t.fold).group(1))
        tau = float(re.search(r"committed (\d+\.\d+) tokens", t.fold).group(1))
        if tau > window + 1e-9:
            found.append(f"τ {tau} committed from a window of {window} tokens")
    hidden = "so the draft is hidden" in t.why
    wait = _first(rf"the target waited {NUMBER} ms for the draft", t.why)
    if hidden and wait is not None and wait[0] > 0.05:
        found.append(f"the draft called hidden while the target waited {wait[0]} ms a step for it")
    return found
