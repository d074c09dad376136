"""The weight formats, one table: what each packing stores, what it computes, and its entry points. The kernel's own
table (src/formats.h, exported as msd_format_table) holds the same rows; native.py checks the two against each other
whenever a library loads, so no format is named anywhere else. No torch here: config.py derives its choices from it.

A *function* (FUNCTIONS) is what a model computes in a format; a *packing* (WeightFormat) is one way the kernel
stores a map for it. float32 has three packings (float32 values, or a GGUF file's own q4_1 / q8_0 blocks, which
dequantise to exactly those values); int8 has two (the same blocks against int8 activations). q8_0 is int8's
arithmetic on any float model: its packer quantises the float weights to Q8_0 blocks as llama.cpp's quantize does.
"""
from __future__ import annotations

from dataclasses import dataclass

QK = 32  # k per GGUF block (src/formats.h)

FUNCTIONS = {  # the function a model computes in each format, in one line (the CLI and the page show it)
    "float32": "float32: the dequantised model exactly (float32 weights and activations, one fused chain per output)",
    "bfloat16": "bfloat16 weights and activations (each rounded to nearest even), widened exactly, float32 sums",
    "float16": "float16 weights widened exactly, float32 activations",
    "int8": "int8 activations per block of 32 against the GGUF's own blocks, as llama.cpp computes this GGUF",
    "q8_0": "int8 activations per block of 32 on Q8_0 weights quantised from the model's float weights (llama.cpp's "
            "quantize: per 32 weights d = max|w|/127, q = w·(1/d) rounded to nearest, halves away from zero)",
}
INT8 = "int8"  # int8 activations against a GGUF model's own blocks
Q8_0 = "q8_0"  # int8 activations against Q8_0 blocks quantised from a float model's weights when packed
BLOCK_FUNCTIONS = (INT8, Q8_0)  # the functions of int8 activations against blocks (no torch dtype of their own)
NEEDS = {  # where a block function is offered, in words (the refusal of one a model does not offer says it)
    INT8: "int8 runs a GGUF target's own blocks on the exact kernel",
    Q8_0: "q8_0 quantises a float model's linear maps on the exact kernel, where every map's inputs fill blocks of 32",
}


@dataclass(frozen=True)
class WeightFormat:
    """One packing of a linear map (a row of src/formats.h's FORMAT_TABLE)."""

    code: int            # src/formats.h's Format
    name: str            # its entry point: msd_pack_<name>
    function: str        # the function a map packed so computes (a FUNCTIONS key)
    storage: str         # what one call streams: a float dtype's name, or a GGUF block format (q4_1, q8_0)
    activations: str     # what the weights are multiplied with: float32, bfloat16 or int8
    element_bytes: int   # per-element packings: bytes of one packed element (0 for block packings)
    k_per_element: int   # k in one packed element: 1, or 2 (bfloat16 pairs); 0 for block packings
    block_bytes: int     # block packings: bytes of one packed block of 32 columns x QK k (0 otherwise)

    @property
    def blocks(self) -> bool:
        return self.block_bytes > 0

    @property
    def quantises(self) -> bool:
        """Its packer reads float weights and quantises them to its blocks (msd_pack_<name>(w, k, n, stride, out))."""
        return self.blocks and self.storage == self.function


PACKINGS = (
    WeightFormat(0, "f32", "float32", "float32", "float32", 4, 1, 0),
    WeightFormat(1, "f16", "float16", "float16", "float32", 2, 1, 0),
    WeightFormat(2, "bf16", "bfloat16", "bfloat16", "bfloat16", 4, 2, 0),
    WeightFormat(3, "q4_1", "float32", "q4_1", "float32", 0, 0, 640),
    WeightFormat(4, "q8_0", "float32", "q8_0", "float32", 0, 0, 1088),
    WeightFormat(5, "q4_1_i8", "int8", "q4_1", "int8", 0, 0, 640),
    WeightFormat(6, "q8_0_i8", "int8", "q8_0", "int8", 0, 0, 1088),
    WeightFormat(7, "q8_0_quant", "q8_0", "q8_0", "int8", 0, 0, 1088),
)
BLOCK_STORAGES = tuple(dict.fromkeys(p.storage for p in PACKINGS if p.blocks))  # GGUF block formats the kernel reads


def packing(function: str, storage: str | None = None) -> WeightFormat:
    """The packing that computes `function` from `storage` (None: the function's own values)."""
    for p in PACKINGS:
        if p.function == function and p.storage == (storage or function):
            return p
    raise ValueError(f"no packing computes {function!r} from {storage or function!r} (formats: {', '.join(FUNCTIONS)}; "
                     f"{INT8} needs GGUF blocks: {', '.join(BLOCK_STORAGES)})")
