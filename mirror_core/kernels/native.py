"""The exact small-row kernel (src/kernel.cpp and its headers): built with this machine's C++ compiler on first use,
loaded with ctypes, and called only with tensors whose dtype, shape, strides and alignment were checked here.

Why it exists: torch's CPU matmul picks its kernel by the number of rows, so a position's logits change between an
AR step (1 row) and a window (γ + 1 rows), and the exact plan that repairs it (runners/exactness.py) makes a window
cost several steps. This kernel gives every row the same chain whatever the call's size, and streams the weights
once per call, so a window of a few rows costs about one step.

One function on every CPU: every variant (variants.py) is written against one 16-lane SIMD layer (src/simd.h), so the
AVX-512, AVX2 and AMX builds compute the same bits as the scalar reference build, for every format (formats.py): the
linear maps, and the layer's norms, attention, softmax and SiLU. A prompt gives the same tokens on every machine that
runs the kernel. Where no compiler exists, `library()` returns None with the reason (`unavailable()`), and the
runners keep torch's matmul under a measured row plan: a different rounding, said so wherever the format is named.

Weights may also stay in a GGUF file's own blocks (q4_1, q8_0: BlockWeights, checked here before they are packed):
dequantised in registers to exactly the float32 weights gguf's dequantisation gives, so such a map computes the
float32 function bit for bit while it reads 5 (q4_1) or 8.5 (q8_0) bits a weight instead of 32. The int8 function
reads the same blocks against activations rounded to int8 per row and block of 32 (llama.cpp's kind of arithmetic).

Threads: `set_threads(n)` gives the calling thread a pool of n kernel threads (it and n − 1 workers, which inherit
its CPU affinity); its later calls split their output columns (and a layer its attention heads) between them.
Every output stays one thread's one chain, so the bits do not depend on n.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch

from .. import machine
from .blocks import BlockWeights
from .formats import BLOCK_FUNCTIONS, FUNCTIONS, INT8, PACKINGS, Q8_0, QK, WeightFormat, packing
from .variants import SCALAR, VARIANT_CODES, VARIANTS

SOURCES = os.path.join(os.path.dirname(__file__), "src")  # kernel.cpp, the one translation unit, and its headers
SOURCE = os.path.join(SOURCES, "kernel.cpp")
FORMATS = {f: getattr(torch, f) for f in FUNCTIONS if f not in BLOCK_FUNCTIONS}  # the float formats' torch dtypes
STAND_INS = {INT8: torch.int8, Q8_0: torch.qint8}  # the torch dtypes that stand for the block functions (runners pass
#                                                    formats as torch dtypes: WeightFormats, set_dtypes)
_BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++20", "-fno-math-errno", "-ffp-contract=off")
BUILD_TIMEOUT_S = 120
ALIGN = 64  # bytes: packed panels are read with aligned vector loads
HUGE_PAGE = 2 << 20  # bytes: packed weights of at least this size start on a 2 MB boundary and ask for 2 MB pages


class KernelError(RuntimeError):
    """A call the kernel refuses (the Python side checks first; this is the C side's own refusal)."""


def format_name(dtype: torch.dtype) -> str:
    """The weight format's name for a torch dtype ("bfloat16"; STAND_INS: torch.int8 stands for int8, torch.qint8 for
    q8_0), or the dtype's own name where it is no format."""
    return next((n for n, d in {**FORMATS, **STAND_INS}.items() if d == dtype), str(dtype).removeprefix("torch."))


def runnable_variants() -> tuple[str, ...]:
    """The variants this CPU can run, best first."""
    return tuple(name for name, (needs, _) in VARIANTS.items() if not needs or machine.has_cpu_flags(*needs))


def compiler() -> str | None:
    """This machine's C++ compiler (machine.cxx_compiler: $CXX, else g++, c++ or clang++ on PATH), or None."""
    return machine.cxx_compiler()


@dataclass(frozen=True)
class Build:
    """Where the library of one variant came from."""

    variant: str
    path: str          # the shared library
    cached: bool       # built at an earlier load (nothing compiled now)
    seconds: float     # compile time at this load (0 when cached)


def _build(variant: str, cxx: str) -> Build:
    """Compile src/kernel.cpp for one variant into the cache folder (keyed by the sources, flags and compiler)."""
    flags = _BASE_FLAGS + VARIANTS[variant][1]
    source = b""
    for name in sorted(os.listdir(SOURCES)):
        with open(os.path.join(SOURCES, name), "rb") as f:
            source += name.encode() + f.read()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[:1]
    key = hashlib.sha256(source + " ".join((cxx, *flags, *version)).encode()).hexdigest()[:16]
    path = os.path.join(machine.cache_dir("kernels"), f"kernel_{variant}_{key}.so")
    if os.path.exists(path):
        return Build(variant, path, True, 0.0)
    t0 = time.perf_counter()
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        done = subprocess.run([cxx, *flags, SOURCE, "-o", tmp], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise OSError(f"{os.path.basename(cxx)} failed: {last}")
        os.replace(tmp, path)  # atomic: a second process building at once finds a whole library or none
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return Build(variant, path, False, round(time.perf_counter() - t0, 2))


_I64, _P = ctypes.c_int64, ctypes.c_void_p


@dataclass(frozen=True, eq=False)
class Library:
    """One loaded variant: pack weights and run the kernel (through PackedLinear, which checks every call)."""

    build: Build
    dll: ctypes.CDLL = field(repr=False)

    @property
    def variant(self) -> str:
        return self.build.variant

    def fn(self, name: str):
        return getattr(self.dll, name)

    def set_threads(self, threads: int) -> None:
        """The calling thread's kernel calls run on `threads` threads from now on (this thread and threads − 1
        workers that inherit its CPU affinity; idle workers sleep)."""
        if self.dll.msd_set_threads(int(threads)):
            raise ValueError(f"kernel threads must be in 1..64, got {threads}")

    def set_amx_rows(self, rows: int) -> None:
        """The amx variant: int8 calls of at least `rows` rows run on tiles (0: never; the bits do not change)."""
        self.dll.msd_set_amx_rows(int(rows))

    @property
    def threads(self) -> int:
        """The calling thread's kernel threads (1 until set_threads)."""
        return self.dll.msd_threads()


class _FormatInfo(ctypes.Structure):  # src/formats.h's msd_format_info, field for field
    _fields_ = [("code", ctypes.c_int32), ("element_bytes", ctypes.c_int32), ("k_per_element", ctypes.c_int32),
                ("block_bytes", ctypes.c_int32), ("int8_activations", ctypes.c_int32), ("name", ctypes.c_char * 12)]


def _check_formats(dll) -> None:
    """The library's format table equals formats.PACKINGS row for row (the one table in both languages)."""
    count = ctypes.c_int64()
    table = ctypes.cast(dll.msd_format_table(ctypes.byref(count)), ctypes.POINTER(_FormatInfo))
    got = [(t.code, t.name.decode(), t.element_bytes, t.k_per_element, t.block_bytes, bool(t.int8_activations))
           for t in table[: count.value]]
    want = [(p.code, p.name, p.element_bytes, p.k_per_element, p.block_bytes, p.activations == INT8) for p in PACKINGS]
    if got != want:
        raise OSError(f"the kernel's format table {got} is not formats.PACKINGS {want}")


def _load(build: Build) -> Library:
    dll = ctypes.CDLL(build.path)
    dll.msd_format_table.argtypes, dll.msd_format_table.restype = [ctypes.POINTER(ctypes.c_int64)], _P
    _check_formats(dll)
    for p in PACKINGS:
        pack = getattr(dll, f"msd_pack_{p.name}")
        if p.blocks and not p.quantises:  # d, m (q4_1; NULL for q8_0), q, k, n, out
            pack.argtypes, pack.restype = [_P, _P, _P, _I64, _I64, _P], ctypes.c_int
        else:                             # w, k, n, row stride, out
            pack.argtypes, pack.restype = [_P, _I64, _I64, _I64, _P], ctypes.c_int
    dll.msd_linear.argtypes = [ctypes.c_int32, _P, _I64, _I64, _I64, _P, _I64, _P, _I64]
    dll.msd_linear.restype = ctypes.c_int
    dll.msd_rms_norm.argtypes, dll.msd_rms_norm.restype = [_P, _I64, _I64, _P, ctypes.c_float, _P], ctypes.c_int
    dll.msd_variant.restype = dll.msd_panel.restype = dll.msd_threads.restype = dll.msd_qk.restype = ctypes.c_int
    dll.msd_set_threads.argtypes, dll.msd_set_threads.restype = [ctypes.c_int], ctypes.c_int
    dll.msd_advise_huge.argtypes, dll.msd_advise_huge.restype = [_P, _I64], ctypes.c_int
    dll.msd_layer_size.restype = _I64
    dll.msd_set_amx_rows.argtypes, dll.msd_set_amx_rows.restype = [_I64], None
    if dll.msd_qk() != QK:
        raise OSError(f"{build.path}: blocks of {dll.msd_qk()} k, formats.QK {QK}")
    if VARIANT_CODES.get(dll.msd_variant()) == "amx" and dll.msd_amx_init():
        raise OSError("the OS refused AMX tile data to this process (arch_prctl ARCH_REQ_XCOMP_PERM)")
    if dll.msd_layer_size() != ctypes.sizeof(_LayerSpec):
        raise OSError(f"{build.path}: msd_layer is {dll.msd_layer_size()} bytes, _LayerSpec {ctypes.sizeof(_LayerSpec)}")
    for name in ("msd_stream_read", "msd_stream_read_par"):
        getattr(dll, name).argtypes, getattr(dll, name).restype = [_P, _I64], ctypes.c_double
    dll.msd_layer_forward.argtypes = [ctypes.POINTER(_LayerSpec), _P, _I64, _P, _P, _P, _P, _I64, _I64]
    dll.msd_layer_forward.restype = ctypes.c_int
    got = VARIANT_CODES.get(dll.msd_variant())
    if got != build.variant:
        raise OSError(f"{build.path} is the {got} variant, not {build.variant}")
    return Library(build, dll)


def _best_seconds(run, calls: int) -> float:
    """The fastest of `calls` timed calls of run() (the least interference: a cost, not a typical wall time)."""
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(lib: Library | None, megabytes: int = 512, passes: int = 4, pool: bool = False) -> float:
    """GB/s streamed from memory here by the kernel's one-thread read (lib; with `pool`, split between the calling
    thread's kernel threads), or by torch's sum with the calling thread's torch threads (None): the best of `passes`
    reads of a buffer larger than the last-level cache (this VM's is 300 MB; the denominator of a step's roofline: weight bytes ÷ this)."""
    buf = _aligned_zeros(megabytes * (1 << 20) // 4, torch.float32)
    if lib is not None:
        read = lib.dll.msd_stream_read_par if pool else lib.dll.msd_stream_read
        run = lambda: read(buf.data_ptr(), buf.numel())  # noqa: E731
    else:
        run = buf.sum
    return round(buf.numel() * 4 / _best_seconds(run, passes) / 1e9, 1)


def peak_gflops(lib: Library | None, fmt: str, rows: int = 16) -> float:
    """GFLOP/s of the kernel (lib) or of torch's matmul (None) in a weight format when arithmetic, not memory, is the
    limit: `rows` rows against a weight small enough to stay in the core's cache (best of several calls; int8: the
    multiply-adds of its integer dot products, on random q4_1 blocks)."""
    k, n = 576, 256
    w = torch.randn(k, n, generator=torch.Generator().manual_seed(0)) / k ** 0.5
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    blocks = None
    if fmt == INT8:
        gen = torch.Generator().manual_seed(2)
        d, m = torch.full((n, k // 32), 0.01).half(), torch.full((n, k // 32), -0.05).half()
        q = torch.randint(0, 16, (n, k // 32, 32), generator=gen, dtype=torch.uint8)
        blocks = BlockWeights("q4_1", d, q, m)
        w = blocks.dequantize().t().contiguous()
    if lib is not None:
        packed = PackedLinear(w, fmt, lib, blocks=blocks)
        run = lambda: packed(x)  # noqa: E731
    else:
        wd, xd = w.to(FORMATS[fmt]), x.to(FORMATS[fmt])
        run = lambda: xd @ wd  # noqa: E731
    return round(2 * rows * k * n / _best_seconds(run, 30) / 1e9, 1)


_failures: dict[str, str] = {}


@functools.cache
def library(variant: str | None = None) -> Library | None:
    """The kernel library for `variant` (None: the best this CPU runs and loads), built on first use; None where it
    cannot be had here (`unavailable(variant)` says why in one line)."""
    if variant is None:
        for name in runnable_variants():
            lib = library(name)
            if lib is not None:
                return lib
        _failures["None"] = _failures.get(next(iter(runnable_variants()), SCALAR), "no variant could be built")
        return None
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r} (known: {', '.join(VARIANTS)})")
    if variant not in runnable_variants():
        _failures[variant] = f"this CPU cannot run the {variant} variant"
        return None
    cxx = compiler()
    if cxx is None:
        _failures[variant] = "no C++ compiler found (g++, c++ or clang++; set $CXX)"
        return None
    try:
        lib = _load(_build(variant, cxx))
    except (OSError, subprocess.SubprocessError) as e:
        _failures[variant] = f"the kernel could not be built or loaded: {e}"
        return None
    _loaded.append(lib)
    lib.set_threads(kernel_threads())
    return lib


_loaded: list[Library] = []  # every library loaded in this process (set_kernel_threads reaches each)


def set_kernel_threads(threads: int) -> None:
    """The calling thread's kernel threads in every loaded library and in those loaded later from this thread."""
    _wanted.threads = threads
    for lib in _loaded:
        lib.set_threads(threads)


def kernel_threads() -> int:
    """The calling thread's kernel threads (set_kernel_threads; 1 by default)."""
    return getattr(_wanted, "threads", 1)


_wanted = threading.local()


def unavailable(variant: str | None = None) -> str:
    """Why library(variant) is None ('' when it is not)."""
    return "" if library(variant) is not None else _failures.get(str(variant), "unavailable")


# -- packed weights ---------------------------------------------------------------------------------------------
def _aligned_zeros(count: int, dtype: torch.dtype, huge: Library | None = None) -> torch.Tensor:
    """A zero tensor of `count` elements whose data starts on an ALIGN-byte boundary; with `huge` (a library) and at
    least HUGE_PAGE bytes, on a 2 MB boundary with 2 MB pages asked for before the memory is first written."""
    item = torch.empty((), dtype=dtype).element_size()
    if huge is None or count * item < HUGE_PAGE:
        raw = torch.zeros(count + ALIGN // item, dtype=dtype)
        skip = (-raw.data_ptr() % ALIGN) // item
        return raw[skip: skip + count]
    raw = torch.empty(count * item + 2 * HUGE_PAGE, dtype=torch.uint8)  # untouched pages until zeroed below
    skip = -raw.data_ptr() % HUGE_PAGE
    span = -(-count * item // HUGE_PAGE) * HUGE_PAGE
    huge.dll.msd_advise_huge(raw.data_ptr() + skip, span)  # a refusal only costs speed
    return raw[skip: skip + count * item].zero_().view(dtype)


def _check_blocks(b: BlockWeights, w: torch.Tensor, k: int, n: int) -> None:
    """GGUF blocks as the packer reads them: on the CPU, shaped for this map, and dequantising to w bit for bit."""
    if not b.d.is_cpu or not b.q.is_cpu or (b.m is not None and not b.m.is_cpu):
        raise ValueError("GGUF blocks must be on the CPU")
    if b.shape != (n, k):
        raise ValueError(f"{b.kind} blocks of shape {b.shape} for a {k}x{n} weight (want {(n, k)})")
    if b.kind == "q4_1" and b.q.numel() and int(b.q.max()) > 15:
        raise ValueError("q4_1 values must lie in 0..15")
    same = torch.equal(b.dequantize().view(torch.int32), w.detach().t().contiguous().view(torch.int32))
    if w.dtype != torch.float32 or not same:
        raise ValueError(f"these {b.kind} blocks do not dequantise to this weight bit for bit")


_STORE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # a per-element packing's element, by bytes (bits only)


class PackedLinear:
    """W [K, N] packed for the kernel to compute one format (formats.FUNCTIONS); calling it computes x [..., K] float32
    → [..., N] float32, every row by the same chain whatever the number of rows, on every variant.

    With `blocks` (W's own GGUF blocks, checked to dequantise to exactly w), the map is stored as those blocks: float32
    computes the same function as from float32 values, bit for bit, at the blocks' bytes; int8 needs them. q8_0
    quantises w itself (K a multiple of 32, every weight finite) to Q8_0 blocks as llama.cpp does (src/pack.h)."""

    def __init__(self, w: torch.Tensor, fmt: str, lib: Library, blocks: BlockWeights | None = None):
        if fmt not in FUNCTIONS:
            raise ValueError(f"unknown weight format {fmt!r} (known: {', '.join(FUNCTIONS)})")
        if w.dim() != 2 or w.device.type != "cpu" or not w.dtype.is_floating_point:
            raise ValueError(f"a linear map's weight must be a 2-D floating CPU tensor, got {tuple(w.shape)} "
                             f"{w.dtype} on {w.device}")
        if fmt == INT8 and blocks is None:
            raise ValueError("the int8 format runs on GGUF blocks only; give the map's blocks (q8_0 quantises a float "
                             "map's weights itself)")
        if blocks is not None and not isinstance(blocks, BlockWeights):
            raise ValueError(f"GGUF blocks must be BlockWeights (q4_1 or q8_0), got {type(blocks).__name__}")
        if blocks is not None and fmt not in ("float32", INT8):
            raise ValueError(f"GGUF blocks dequantise to float32 weights; they cannot be packed as {fmt}")
        if fmt == Q8_0 and (w.shape[0] % QK or not bool(torch.isfinite(w).all())):
            raise ValueError(f"q8_0 quantises blocks of {QK} inputs of finite weights; this {tuple(w.shape)} weight "
                             f"{'has non-finite values' if w.shape[0] % QK == 0 else f'has {w.shape[0]} inputs'}")
        self.format, self.lib = fmt, lib
        self.k, self.n = int(w.shape[0]), int(w.shape[1])
        self.packing: WeightFormat = packing(fmt, None if blocks is None else blocks.kind)
        self.storage = self.packing.storage  # what one call streams: a format or a block format
        self.code = self.packing.code
        self.data = self._packed(w, blocks, lib)
        if self.data is None:
            raise KernelError(f"packing a {self.k}x{self.n} weight as {self.packing.name} was refused")
        self._run = lib.dll.msd_linear
        self._data_ptr = self.data.data_ptr()

    def _packed(self, w: torch.Tensor, blocks: BlockWeights | None, lib: Library) -> torch.Tensor | None:
        """The packed panels (64-byte aligned) of w or of its blocks; None where the packer refused them."""
        p, panels = self.packing, -(-self.n // lib.dll.msd_panel())
        pack = lib.fn(f"msd_pack_{p.name}")
        if p.blocks:
            data = _aligned_zeros(panels * (self.k // QK) * p.block_bytes, torch.uint8, huge=lib)
        else:
            rows = -(-self.k // p.k_per_element)  # k, or k pairs (bfloat16)
            data = _aligned_zeros(panels * rows * lib.dll.msd_panel(), _STORE[p.element_bytes], huge=lib)
        if blocks is not None:
            _check_blocks(blocks, w, self.k, self.n)
            d, q = blocks.d.contiguous().view(torch.int16), blocks.q.contiguous()
            m = None if blocks.m is None else blocks.m.contiguous().view(torch.int16)
            bad = pack(d.data_ptr(), None if m is None else m.data_ptr(), q.data_ptr(), self.k, self.n, data.data_ptr())
        else:  # float weights: per-element packings, or quantised to blocks (q8_0)
            src = w.detach().to(torch.float32).contiguous()
            bad = pack(src.data_ptr(), self.k, self.n, src.stride(0), data.data_ptr())
        return None if bad else data

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)

    @property
    def dtype(self) -> torch.dtype:
        return {**FORMATS, **STAND_INS}[self.format]

    @property
    def nbytes(self) -> int:
        """Bytes one call streams (the packed weights, padding included)."""
        return self.data.numel() * self.data.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] float32 on the CPU (any strides) → [..., N] float32. Checked here, then handed over as
        contiguous rows [M, K]; the packed weights were checked (dtype, size, 64-byte alignment) when packed."""
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or not x.is_cpu:
            raise TypeError(f"the kernel takes float32 CPU tensors, got {getattr(x, 'dtype', type(x).__name__)} "
                            f"on {getattr(x, 'device', '?')}")
        if x.dim() == 0 or x.shape[-1] != self.k:
            raise ValueError(f"x has shape {tuple(x.shape)}; this weight takes rows of {self.k}")
        if not x.is_contiguous():
            x = x.contiguous()
        m = x.numel() // self.k
        y = torch.empty(x.shape[:-1] + (self.n,), dtype=torch.float32)                     # [..., N]
        if m and self._run(self.code, x.data_ptr(), m, self.k, self.k, self._data_ptr, self.n, y.data_ptr(), self.n):
            raise KernelError(f"the kernel refused x {tuple(x.shape)} for a {self.k}x{self.n} weight")
        return y


def rms_norm(lib: Library, x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] RMS-normalised with gain [H] by the kernel's own norm (the layer's: one function on every variant),
    float32 in and out; checked here."""
    if not (isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.is_cpu and x.dim() >= 1):
        raise TypeError(f"the kernel's norm takes float32 CPU tensors, got {getattr(x, 'dtype', type(x).__name__)}")
    h = x.shape[-1]
    g = _vector(gain, h, "the norm's gain")
    x = x.contiguous()
    y = torch.empty_like(x)                                                               # [..., H]
    if x.numel() and lib.dll.msd_rms_norm(x.data_ptr(), x.numel() // h, h, g.data_ptr(), float(eps), y.data_ptr()):
        raise KernelError(f"the kernel's norm refused x {tuple(x.shape)}")
    return y


# -- a whole decoder layer ------------------------------------------------------------------------------------
class _LayerSpec(ctypes.Structure):  # src/layer.h's msd_layer, field for field
    _fields_ = [("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64), ("inter", _I64),
                ("fmt", ctypes.c_int32 * 4), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                ("ln1", _P), ("ln2", _P), ("w_qkv", _P), ("b_qkv", _P), ("q_norm", _P), ("k_norm", _P),
                ("w_o", _P), ("w_gate_up", _P), ("w_down", _P)]


def _vector(t: torch.Tensor | None, n: int, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach().to(torch.float32).contiguous()
    if t.shape != (n,):
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected ({n},)")
    return t


class NativeLayer:
    """One Llama-family decoder layer (RMS norms, fused q|k|v with optional bias (Qwen2) and q/k norms (Qwen3),
    RoPE, grouped-query causal attention over the layer's cache, SiLU MLP) run by the kernel (src/layer.h) in one call:
    every new row computed alone, so its output is the same in a call of any size."""

    def __init__(self, lib: Library, *, ln1, ln2, qkv: PackedLinear, b_qkv, q_norm, k_norm, o: PackedLinear,
                 gate_up: PackedLinear, down: PackedLinear, heads: int, kv_heads: int, head_dim: int, eps: float):
        h, i = qkv.k, down.k
        fmts = {m.format for m in (qkv, o, gate_up, down)}
        if len(fmts) != 1:
            raise ValueError(f"a layer's linear maps must share one format, got {sorted(fmts)}")
        if kv_heads < 1 or heads < 1 or heads % kv_heads or head_dim < 2 or head_dim % 2 or head_dim > 512:
            raise ValueError(f"unsupported attention shape: {heads} heads, {kv_heads} KV heads, head dim {head_dim}")
        shapes = {"q|k|v": (qkv.shape, (h, (heads + 2 * kv_heads) * head_dim)), "o": (o.shape, (heads * head_dim, h)),
                  "gate|up": (gate_up.shape, (h, 2 * i)), "down": (down.shape, (i, h))}
        for name, (got, want) in shapes.items():
            if got != want:
                raise ValueError(f"the {name} weight is {got}, expected {want}")
        self.hidden, self.heads, self.kv_heads, self.head_dim = h, heads, kv_heads, head_dim
        self._keep = [_vector(ln1, h, "ln1"), _vector(ln2, h, "ln2"),
                      _vector(b_qkv, qkv.n, "the q|k|v bias"), _vector(q_norm, head_dim, "q_norm"),
                      _vector(k_norm, head_dim, "k_norm"), qkv, o, gate_up, down]
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together")
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        ln1_, ln2_, b_, qn_, kn_ = self._keep[:5]
        codes = (ctypes.c_int32 * 4)(qkv.code, o.code, gate_up.code, down.code)
        self._spec = _LayerSpec(h, heads, kv_heads, head_dim, i, codes, float(eps),
                                float(head_dim ** -0.5), ptr(ln1_), ptr(ln2_), qkv.data.data_ptr(), ptr(b_),
                                ptr(qn_), ptr(kn_), o.data.data_ptr(), gate_up.data.data_ptr(), down.data.data_ptr())
        self._run = lib.fn("msd_layer_forward")
        self._spec_ref = ctypes.byref(self._spec)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, start: int) -> None:
        """x [T, H] (contiguous float32, updated in place) through the layer at positions start..start+T−1; keys
        and values [Hkv, cap, D] (contiguous float32: the layer's cache) get the new entries. cos, sin [T, D]."""
        t = x.shape[0] if x.dim() == 2 else -1
        d = self.head_dim
        ok = (t >= 1 and x.shape[1] == self.hidden and cos.shape == sin.shape == (t, d)
              and keys.shape == values.shape and keys.dim() == 3 and keys.shape[0] == self.kv_heads
              and keys.shape[2] == d and 0 <= start and start + t <= keys.shape[1]
              and all(a.dtype == torch.float32 and a.is_cpu and a.is_contiguous() for a in (x, cos, sin, keys, values)))
        if not ok:
            raise ValueError(f"native layer: bad call x {tuple(x.shape)} cos {tuple(cos.shape)} keys "
                             f"{tuple(keys.shape)} at {start} (float32, contiguous, CPU, inside the cache)")
        if self._run(self._spec_ref, x.data_ptr(), t, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
                     values.data_ptr(), keys.shape[1], start):
            raise KernelError("the native layer refused its arguments")
