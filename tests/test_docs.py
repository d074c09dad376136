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


RECORD = re.compile(r"docs/bench/([a-z0-9_]+)")


def _first_record() -> tuple[str, dict]:
    """The one record BENCHMARKS.md's first section quotes: its name and its bench.json."""
    import json

    with open(os.path.join(ROOT, "docs", "BENCHMARKS.md"), encoding="utf-8") as f:
        first = re.split(r"^## ", f.read(), flags=re.M)[1]
    names = set(RECORD.findall(first))
    assert len(names) == 1, names
    name = names.pop()
    with open(os.path.join(ROOT, "docs", "bench", name, "bench.json"), encoding="utf-8") as f:
        return name, json.load(f)


def test_the_first_figures_come_from_one_record_made_at_todays_defaults():
    """README's and BENCHMARKS.md's first figures are one named record's (docs/bench/NAME/bench.json), and that record
    ran at today's defaults: the lanes' format and kernel choices as LaneConfig's defaults, γ and κ as the pair chose
    them, the default pair's own format (int8, for the reason calibrate.PAIR_FORMAT_WHY gives now) on the exact
    kernel, the context draft and greedy sampling as their configs' defaults."""
    from dataclasses import asdict, fields

    from mirror_core.config import ContextConfig, LaneConfig, SamplingConfig, SpecConfig
    from mirror_core.models.pairs import REAL_DRAFT, REAL_TARGET
    from mirror_core.runners.calibrate import PAIR_FORMAT_WHY

    name, record = _first_record()
    s = record["settings"]
    defaults = LaneConfig()
    for field in ("dtype", "kernel", "serial_cores", "exit_head", "runner", "kind"):
        assert s["lanes"][field] == getattr(defaults, field), field
    assert s["target"] == REAL_TARGET and os.path.join(ROOT, s["draft"]) == REAL_DRAFT
    chosen, spec = s["chosen_settings"], s["spec"]
    assert (spec["gamma"], spec["kappa"]) == (chosen["gamma"], chosen["kappa"])  # the pair's own choice
    assert spec["branch_budget"] == SpecConfig().branch_budget and spec["context"] == asdict(ContextConfig())
    assert s["sampling"] == {f.name: getattr(SamplingConfig(), f.name) for f in fields(SamplingConfig)}
    target = s["dtypes"]["auto"]["calibration"]["target"]
    assert (target["requested"], target["sequence"], target["note"]) == ("auto", "int8", PAIR_FORMAT_WHY[True])
    assert s["target_kernel"]["auto"]["roofline"]["kernel"] != "torch"  # --kernel auto: the exact kernel
    summary = {row["name"]: row for row in record["summary"]}
    for decoder in ("sd", "mirror"):
        assert summary[decoder]["all_equal_to_ar"] is True, decoder
    with open(os.path.join(ROOT, "docs", "BENCHMARKS.md"), encoding="utf-8") as f:
        first = re.split(r"^## ", f.read(), flags=re.M)[1]
    for decoder, row in summary.items():  # the table quotes the record, row by row
        low, high = row["speedup_vs_baseline_range"]
        quoted = (f"| `{decoder}` | {row['tokens_per_s']:.1f} | {row['speedup_vs_baseline']:.2f} ({low:.2f}–{high:.2f})")
        assert quoted in first, quoted
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    measures = readme[readme.index("**What it measures on a CPU.**"):]
    assert RECORD.search(measures).group(1) == name  # README's first figures: the same record
    for said in (f"{summary['ar']['tokens_per_s']:.1f} tok/s", f"vanilla SD {summary['sd']['speedup_vs_baseline']:.2f}×",
                 f"Mirror-SD {summary['mirror']['speedup_vs_baseline']:.2f}×", f"τ {summary['mirror']['tau']:.2f}"):
        assert said in measures, said


def test_the_readmes_screenshot_is_the_first_screen():
    """assets/screenshot.png is a window's first screen (testing/browser.py: 1280x800 at most), not the whole page as
    a strip, and under 300 KB."""
    import struct

    path = os.path.join(ROOT, "assets", "screenshot.png")
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width <= 1280 and height <= 800 and os.path.getsize(path) < 300_000, (width, height)
