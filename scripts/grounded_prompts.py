"""Build assets/grounded_prompts.jsonl: tasks whose answer is mostly already in the prompt (fix or edit a given
function, correct or rewrite a given text, convert or extract data), on texts nobody in this project wrote: functions
and data of the Python standard library and the Zen of Python.

    python scripts/grounded_prompts.py            # rewrites assets/grounded_prompts.jsonl

The committed file is what the bench and the page use; this script records where each text came from (read from the
running Python's own standard library, so a different Python version may give slightly different texts).
"""
from __future__ import annotations

import calendar
import codecs
import colorsys
import io
import http
import inspect
import json
import pathlib
import shlex
import statistics
import string
import textwrap
from contextlib import redirect_stdout

with redirect_stdout(io.StringIO()):  # importing `this` prints the Zen
    import this

OUT = pathlib.Path(__file__).resolve().parent.parent / "assets" / "grounded_prompts.jsonl"


def source(fn) -> str:
    return inspect.getsource(fn).rstrip() + "\n"


def zen() -> list[str]:
    return codecs.decode(this.s, "rot13").splitlines()[2:]


def prompts() -> list[tuple[str, str, str]]:
    """(category, prompt, where its text came from)"""
    rgb = source(colorsys.rgb_to_hsv).replace("h = 2.0+rc-bc", "h = 2.0+bc-rc")
    hsv = source(colorsys.hsv_to_rgb).replace("i = int(h*6.0)", "i = int(h*5.0)")
    status = [{"code": s.value, "phrase": s.phrase} for s in list(http.HTTPStatus)[4:12]]
    csv = "code,phrase\n" + "".join(f"{s['code']},{s['phrase']}\n" for s in status)
    months = {calendar.month_name[m]: calendar.monthrange(2025, m)[1] for m in range(1, 13)}
    typos = "\n".join(zen()[8:16]).replace("silently", "silentyl").replace("ambiguity", "ambiguty") \
        .replace("temptation", "temptaiton").replace("obvious", "obvius").replace("preferably", "prefrably")
    return [
        ("fix", "This Python function has a bug in the branch for green. Fix it and return the whole corrected "
                f"function.\n\n```python\n{rgb}```", "colorsys.rgb_to_hsv, a sign swapped on purpose"),
        ("fix", "This Python function gives wrong colours. Find the bug, fix it and return the whole corrected "
                f"function.\n\n```python\n{hsv}```", "colorsys.hsv_to_rgb, a constant changed on purpose"),
        ("edit", "Add type hints to this function and return the whole function.\n\n"
                 f"```python\n{source(textwrap.indent)}```", "textwrap.indent"),
        ("edit", "Rename the parameter s to text everywhere in this function and return the whole function.\n\n"
                 f"```python\n{source(string.capwords)}```", "string.capwords"),
        ("edit", "Remove the comments from this function and return the whole function.\n\n"
                 f"```python\n{source(shlex.quote)}```", "shlex.quote"),
        ("edit", "Rewrite this function so that it uses a loop instead of a generator, and return the whole "
                 f"function.\n\n```python\n{source(statistics.median_low)}```", "statistics.median_low"),
        ("rewrite", "Rewrite this text as a numbered list, one line per item.\n\n" + "\n".join(zen()[:8]),
         "the Zen of Python, lines 1-8"),
        ("correct", f"Correct the spelling mistakes in this text and return it in full.\n\n{typos}",
         "the Zen of Python, lines 9-16, with five words misspelt on purpose"),
        ("convert", f"Convert this JSON to CSV with a header row.\n\n{json.dumps(status, indent=2)}",
         "http.HTTPStatus 200-207"),
        ("convert", f"Convert this CSV to a Markdown table.\n\n{csv}", "http.HTTPStatus 200-207"),
        ("convert", "Convert this Python dictionary to JSON.\n\n" + repr(months), "calendar: days per month, 2025"),
        ("extract", "Copy every line of this function that contains the word return, in order.\n\n"
                    f"```python\n{source(statistics.median_high)}```", "statistics.median_high"),
    ]


def main() -> None:
    lines = [json.dumps({"question_id": f"grounded-{i}", "category": cat, "turns": [text], "source": f"Python "
                         "standard library: " + where}) for i, (cat, text, where) in enumerate(prompts(), start=1)]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} prompts -> {OUT}")


if __name__ == "__main__":
    main()
