"""The weight formats' one table (mirror_core/kernels/formats.py): the CLI's and the UI's choices come from it, every
packing computes a named function, and the CLI and the page name the function that wrote a text in one wording
(models/pairs.py: TargetFunction), with the recorded int8 against float32 measurement for the default target
(scripts/format_quality.py)."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from mirror_core.config import DTYPE_CHOICES, KERNEL_CHOICES
from mirror_core.kernels.formats import BLOCK_FUNCTIONS, BLOCK_STORAGES, FUNCTIONS, INT8, PACKINGS, packing
from mirror_core.kernels.variants import SCALAR, VARIANTS
from mirror_core.models.pairs import FORMAT_QUALITY, REAL_TARGET, TOY_TARGET, target_function


def test_the_choices_derive_from_the_tables():
    assert DTYPE_CHOICES == ("auto", *FUNCTIONS) and KERNEL_CHOICES == ("auto", "torch", *VARIANTS)
    assert SCALAR in VARIANTS and VARIANTS[SCALAR] == ((), ())  # the reference needs nothing of the CPU
    assert sorted(p.code for p in PACKINGS) == list(range(len(PACKINGS)))
    assert {p.function for p in PACKINGS} == set(FUNCTIONS)
    for p in PACKINGS:  # a packing is found from what it computes and what it stores; only block functions read int8
        assert packing(p.function, None if p.storage == p.function else p.storage) is p
        assert (p.activations == INT8) == (p.function in BLOCK_FUNCTIONS) and p.blocks == (p.storage in BLOCK_STORAGES)
        assert p.quantises == (p.function not in ("float32", INT8) and p.blocks)  # q8_0 packs float weights


def _info(target: str, fmt: str, kernel: str = "avx2", requested: str = "auto"):
    from mirror_core.records import Calibration, Timing

    cal = Calibration("target", requested, fmt, fmt, (Timing(fmt, "window", 12.5),), note="the pair's format")
    return SimpleNamespace(target=target, target_dtype=cal, roofline=SimpleNamespace(kernel=kernel), draft_dtype=None)


def test_the_cli_and_the_page_name_the_function_and_its_measured_agreement():
    from ui.numbers import dtype_line
    from ui.session import Session
    from ui.views import SAME_TEXT, WHO_WROTE_IT, who_wrote

    with open(FORMAT_QUALITY, encoding="utf-8") as f:
        record = json.load(f)
    assert record["target"] == REAL_TARGET and os.path.exists(record["text"]) and record["tokens"] > 1000
    line = target_function(_info(REAL_TARGET, "int8")).line
    assert line.startswith(FUNCTIONS["int8"]) and "the same tokens on every CPU" in line
    assert f"{record['top1_agreement']:.1%}" in line and "scripts/format_quality.py" in line
    toy = target_function(_info(TOY_TARGET, "float32", kernel="torch")).line
    assert toy.startswith(FUNCTIONS["float32"]) and "this machine's rounding" in toy and "agreement" not in toy
    # the page says it in the same words: the numbers' format line, and "Who wrote this" under the streams
    assert f"target: {line}; its window of γ+1 12.5 ms" in dtype_line(_info(REAL_TARGET, "int8")).replace("&#x27;", "'")
    session = Session()
    assert who_wrote(session) == WHO_WROTE_IT  # before a run: no function to name yet
    start = SimpleNamespace(settings=_info(REAL_TARGET, "float32"))
    session.runs["ar"] = SimpleNamespace(start=start)
    said = who_wrote(session)
    assert target_function(start.settings).line in said and said.endswith(SAME_TEXT) and "135 M" not in said
    assert "**Format**" in said and REAL_TARGET in said
