"""The weight formats' one table (mirror_core/kernels/formats.py): the CLI's and the UI's choices come from it, every
packing computes a named function, and the CLI names the function that wrote a text, with the recorded int8 against
float32 measurement for the default target (scripts/format_quality.py)."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from mirror_core.cli import function_line
from mirror_core.config import DTYPE_CHOICES, KERNEL_CHOICES
from mirror_core.kernels.formats import BLOCK_STORAGES, FUNCTIONS, INT8, PACKINGS, packing
from mirror_core.kernels.variants import SCALAR, VARIANTS
from mirror_core.models.pairs import FORMAT_QUALITY, REAL_TARGET, TOY_TARGET


def test_the_choices_derive_from_the_tables():
    assert DTYPE_CHOICES == ("auto", *FUNCTIONS) and KERNEL_CHOICES == ("auto", "torch", *VARIANTS)
    assert SCALAR in VARIANTS and VARIANTS[SCALAR] == ((), ())  # the reference needs nothing of the CPU
    assert sorted(p.code for p in PACKINGS) == list(range(len(PACKINGS)))
    assert {p.function for p in PACKINGS} == set(FUNCTIONS)
    for p in PACKINGS:  # a packing is found from what it computes and what it stores, and only int8 reads int8
        assert packing(p.function, None if p.storage == p.function else p.storage) is p
        assert (p.activations == INT8) == (p.function == INT8) and p.blocks == (p.storage in BLOCK_STORAGES)


def _info(target: str, fmt: str, kernel: str = "avx2"):
    cal = SimpleNamespace(sequence=fmt, note="the pair's format")
    return SimpleNamespace(target=target, target_dtype=cal, roofline=SimpleNamespace(kernel=kernel))


def test_the_cli_names_the_function_and_its_measured_agreement():
    with open(FORMAT_QUALITY, encoding="utf-8") as f:
        record = json.load(f)
    assert record["target"] == REAL_TARGET and os.path.exists(record["text"]) and record["tokens"] > 1000
    line = function_line(_info(REAL_TARGET, "int8"))
    assert line.startswith(FUNCTIONS["int8"]) and "the same tokens on every CPU" in line
    assert f"{record['top1_agreement']:.1%}" in line and "scripts/format_quality.py" in line
    toy = function_line(_info(TOY_TARGET, "float32", kernel="torch"))
    assert toy.startswith(FUNCTIONS["float32"]) and "this machine's rounding" in toy and "agreement" not in toy
