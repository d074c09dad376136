"""The repository speaks of the project, not of how it was made: no text names a work session, an issue or a turn by
number (a reason, a figure and its command say why instead); README.md stays one screen per topic; the benchmarks page
opens with today's figures."""
from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESS_WORDS = re.compile(r"\b(sessions?|issues?|turns?)\b[ -]?#?\d|\bthe issue\b|\bissue'?s\b", re.IGNORECASE)
README_MAX_LINES = 250  # one screen per topic; the details are in docs/
SKIPPED = (".git", ".venv", "__pycache__", ".pytest_cache")


def _text_files() -> list[str]:
    """The files git tracks (every file outside the skipped folders where git is not there), text ones only."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [p for p in listed.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, files in os.walk(ROOT)
                 for f in files if not any(part in SKIPPED for part in d.split(os.sep))]
    out = []
    for path in paths:
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            head = f.read(4096)
        if b"\0" not in head:
            out.append(path)
    return out


def test_no_text_names_a_session_an_issue_or_a_turn_by_number():
    found = []
    for path in (p for p in _text_files() if p != "tests/test_docs.py"):  # this file spells out what it looks for
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                for hit in PROCESS_WORDS.finditer(line.replace('"turns": [', "")):
                    found.append(f"{path}:{n}: {hit.group(0)!r}")
    assert not found, found[:20]


def test_the_readme_fits_one_screen_per_topic():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= README_MAX_LINES


def test_the_benchmarks_page_opens_with_todays_figures():
    """Its first section is the current-figures table, before any dated section."""
    with open(os.path.join(ROOT, "docs", "BENCHMARKS.md"), encoding="utf-8") as f:
        text = f.read()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert sections[0].startswith("Today's figures") and "\n|---" in sections[0]
    assert not re.search(r"\(\d{4}-\d{2}-\d{2}", sections[0].splitlines()[0])
