"""The exact small-row linear kernel (small_rows.cpp): built with this machine's C++ compiler on first use, loaded
with ctypes, and called only with tensors whose dtype, shape, strides and alignment were checked here.

Why it exists: torch's CPU matmul picks its kernel by the number of rows, so a position's logits change between an
AR step (1 row) and a window (γ + 1 rows), and the exact plan that repairs it (runners/exactness.py) makes a window
cost several steps. This kernel gives every row the same float32 chain whatever the call's size (small_rows.cpp's
header says how), and streams the weights once per call, so a window of a few rows costs about one step.

Weights may also stay in a GGUF file's own blocks (q4_1, q8_0: models/gguf_blocks.py's BlockWeights, checked here
field by field before they are packed): they are dequantised in registers
to exactly the float32 weights gguf's dequantisation gives, so such a map computes the float32 format's function
bit for bit while it reads 5 (q4_1) or 8.5 (q8_0) bits a weight instead of 32.

Threads: `set_threads(n)` gives the calling thread a pool of n kernel threads (it and n − 1 workers, which inherit
its CPU affinity); its later calls split their output columns (and a layer its attention heads) between them.
Every output stays one thread's one chain, so the bits do not depend on n.

Format "int8" (INT8) is another function: the same GGUF blocks against activations rounded to int8 per row and block
of 32 (llama.cpp's kind of arithmetic; small_rows.cpp's i8), with exact integer dot products. It reads the blocks'
bytes and does a quarter of the float work, so a window of rows costs little more than one. It is offered only for
maps stored as blocks, and each row is still rounded alone: one function for any row count and thread count.

Variants, by the CPU's flags (the best one this CPU runs and loads is the default; tests force the others):
    amx           as avx512_vnni, and the int8 format's calls of 16+ rows (prefills) on AMX-INT8 tiles (the OS must grant
                  tile data; the same bits as VNNI's)
    avx512_vnni   as avx512_bf16, with VNNI's int8 dot products (vpdpbusd) for the int8 format
    avx512_bf16   AVX-512 with bf16 dot products (bfloat16 weights: one vdpbf16ps per pair of k)
    avx512        AVX-512 (F, BW, VL) with FMA and F16C
    avx2          AVX2 with FMA and F16C
Where none applies or no compiler exists, `library()` returns None with the reason (`unavailable()`), and the
runners keep torch's matmul under a measured row plan.
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
import types
from dataclasses import dataclass, field

import torch

from .. import machine

SOURCE = os.path.join(os.path.dirname(__file__), "small_rows.cpp")
FORMATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # weight formats by name
_BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++20", "-fno-math-errno", "-ffp-contract=off")
VARIANTS = {  # name → (CPU flags it needs, compiler flags)
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_int8", "fma", "f16c"),
            ("-DMSD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mamx-tile",
             "-mamx-int8", "-mfma", "-mf16c")),
    "avx512_vnni": (("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "fma", "f16c"),
                    ("-DMSD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma",
                     "-mf16c")),
    "avx512_bf16": (("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma", "f16c"),
                    ("-DMSD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mf16c")),
    "avx512": (("avx512f", "avx512bw", "avx512vl", "fma", "f16c"),
               ("-DMSD_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c")),
    "avx2": (("avx2", "fma", "f16c"), ("-DMSD_AVX2", "-mavx2", "-mfma", "-mf16c")),
}
VARIANT_CODES = {6: "amx", 5: "avx512_vnni", 4: "avx512_bf16", 3: "avx512", 2: "avx2"}
BUILD_TIMEOUT_S = 120
ALIGN = 64  # bytes: packed panels are read with aligned vector loads
HUGE_PAGE = 2 << 20  # bytes: packed weights of at least this size start on a 2 MB boundary and ask for 2 MB pages
BLOCK_FORMATS = {"q4_1": 3, "q8_0": 4}  # GGUF block storages the kernel streams, by small_rows.cpp's format code
INT8 = "int8"  # the format whose activations are rounded to int8 (blocks only)
INT8_CODES = {"q4_1": 5, "q8_0": 6}  # the blocks packed for it, by small_rows.cpp's format code


class KernelError(RuntimeError):
    """A call the kernel refuses (the Python side checks first; this is the C side's own refusal)."""


def format_name(dtype: torch.dtype) -> str:
    """The weight format's name for a torch dtype ("bfloat16"; torch.int8 stands for the int8 format), or the dtype's
    own name where it is no format."""
    return next((n for n, d in FORMATS.items() if d == dtype), str(dtype).removeprefix("torch."))


def runnable_variants() -> tuple[str, ...]:
    """The variants this CPU can run, best first."""
    return tuple(name for name, (needs, _) in VARIANTS.items() if machine.has_cpu_flags(*needs))


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
    """Compile small_rows.cpp for one variant into the cache folder (keyed by source, flags and compiler)."""
    flags = _BASE_FLAGS + VARIANTS[variant][1]
    with open(SOURCE, "rb") as f:
        source = f.read()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[:1]
    key = hashlib.sha256(source + " ".join((cxx, *flags, *version)).encode()).hexdigest()[:16]
    path = os.path.join(machine.cache_dir("kernels"), f"small_rows_{variant}_{key}.so")
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


def _load(build: Build) -> Library:
    dll = ctypes.CDLL(build.path)
    for fmt in ("f32", "f16", "bf16"):
        pack, run = getattr(dll, f"msd_pack_{fmt}"), getattr(dll, f"msd_linear_{fmt}")
        pack.argtypes, pack.restype = [_P, _I64, _I64, _I64, _P], ctypes.c_int
        run.argtypes, run.restype = [_P, _I64, _I64, _I64, _P, _I64, _P, _I64], ctypes.c_int
    for suffix in ("", "_i8"):
        for fmt in BLOCK_FORMATS:
            run = getattr(dll, f"msd_linear_{fmt}{suffix}")
            run.argtypes, run.restype = [_P, _I64, _I64, _I64, _P, _I64, _P, _I64], ctypes.c_int
        pack_q4, pack_q8 = getattr(dll, f"msd_pack_q4_1{suffix}"), getattr(dll, f"msd_pack_q8_0{suffix}")
        pack_q4.argtypes, pack_q4.restype = [_P, _P, _P, _I64, _I64, _P], ctypes.c_int  # d, m, q, k, n, out
        pack_q8.argtypes, pack_q8.restype = [_P, _P, _I64, _I64, _P], ctypes.c_int      # d, q, k, n, out
    dll.msd_variant.restype = dll.msd_panel.restype = dll.msd_threads.restype = dll.msd_qk.restype = ctypes.c_int
    dll.msd_set_threads.argtypes, dll.msd_set_threads.restype = [ctypes.c_int], ctypes.c_int
    dll.msd_block_bytes.argtypes, dll.msd_block_bytes.restype = [ctypes.c_int], _I64
    dll.msd_advise_huge.argtypes, dll.msd_advise_huge.restype = [_P, _I64], ctypes.c_int
    dll.msd_layer_size.restype = _I64
    dll.msd_set_amx_rows.argtypes, dll.msd_set_amx_rows.restype = [_I64], None
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
        blocks = types.SimpleNamespace(kind="q4_1", d=d, q=q, m=m)
        w = _dequantised(blocks).t().contiguous()
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
        _failures["None"] = _failures.get(str(next(iter(runnable_variants()), None)), "no AVX2/FMA/F16C on this CPU")
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


def _check_blocks(b, qk: int) -> None:
    """GGUF blocks as the packer reads them: kind q4_1 or q8_0; d [N, K/qk] float16; q [N, K/qk, qk] uint8 with
    values 0..15 (q4_1) or int8 (q8_0); m like d (q4_1 only); all on the CPU."""
    want = {"q4_1": torch.uint8, "q8_0": torch.int8}.get(getattr(b, "kind", None))
    d, q, m = getattr(b, "d", None), getattr(b, "q", None), getattr(b, "m", None)
    tensors = all(isinstance(t, torch.Tensor) and t.is_cpu for t in (d, q) + ((m,) if want == torch.uint8 else ()))
    ok = (want is not None and tensors and d.dim() == 2 and d.dtype == torch.float16 and q.dtype == want
          and tuple(q.shape) == (*d.shape, qk)
          and (m is None if want == torch.int8 else (m.dtype == torch.float16 and m.shape == d.shape)))
    if not ok:
        raise ValueError(f"GGUF blocks must be q4_1 or q8_0 with d [N, K/{qk}] float16, q [N, K/{qk}, {qk}] and, for "
                         f"q4_1, m like d; got {getattr(b, 'kind', b)!r}")
    if want == torch.uint8 and q.numel() and int(q.max()) > 15:
        raise ValueError("q4_1 values must lie in 0..15")


def _dequantised(b) -> torch.Tensor:
    """W [N, K] float32 as small_rows.cpp dequantises checked blocks: d·q (exact in float32), then + m for q4_1."""
    w = b.d.float().unsqueeze(-1) * b.q.float()                                           # [N, K/qk, qk]
    return (w if b.m is None else w + b.m.float().unsqueeze(-1)).reshape(b.d.shape[0], -1)


_PACK = {"float32": ("f32", torch.float32, 1), "float16": ("f16", torch.int16, 1), "bfloat16": ("bf16", torch.int32, 2)}
_FORMAT_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


class PackedLinear:
    """W [K, N] packed for the kernel in one format; calling it computes x [..., K] float32 → [..., N] float32,
    every row by the same chain whatever the number of rows (small_rows.cpp).

    With `blocks` (W's own GGUF blocks, checked to dequantise to exactly w), a float32 map is stored as those blocks:
    the same function as the float32 pack, bit for bit, at the blocks' bytes."""

    def __init__(self, w: torch.Tensor, fmt: str, lib: Library, blocks=None):
        if fmt not in _PACK and fmt != INT8:
            raise ValueError(f"unknown weight format {fmt!r} (known: {', '.join(_PACK)}, {INT8})")
        if fmt == INT8 and blocks is None:
            raise ValueError("the int8 format runs on GGUF blocks only; give the map's blocks")
        if w.dim() != 2 or w.device.type != "cpu" or not w.dtype.is_floating_point:
            raise ValueError(f"a linear map's weight must be a 2-D floating CPU tensor, got {tuple(w.shape)} "
                             f"{w.dtype} on {w.device}")
        self.format, self.lib = fmt, lib
        self.k, self.n = int(w.shape[0]), int(w.shape[1])
        self.storage = fmt if blocks is None else blocks.kind  # what one call streams: a format or a block format
        panel = lib.dll.msd_panel()
        panels = -(-self.n // panel)
        if blocks is not None:
            # the packing and the linear map share a name: q4_1 / q8_0, with _i8 for the int8 format
            name = blocks.kind + ("_i8" if fmt == INT8 else "")
            self.code = (INT8_CODES if fmt == INT8 else BLOCK_FORMATS).get(blocks.kind)  # small_rows.cpp's format
            self._pack_blocks(w, blocks, panels, name)
        else:
            name, store, per = _PACK[fmt]
            self.code = _FORMAT_CODES[fmt]
            rows = -(-self.k // per)  # k (float32/float16) or k pairs (bfloat16)
            src = w.detach().to(torch.float32).contiguous()
            self.data = _aligned_zeros(panels * rows * panel, store, huge=lib)
            if lib.fn(f"msd_pack_{name}")(src.data_ptr(), self.k, self.n, src.stride(0), self.data.data_ptr()):
                raise KernelError(f"packing a {self.k}x{self.n} weight was refused")
        self._run = lib.fn(f"msd_linear_{name}")
        self._data_ptr = self.data.data_ptr()

    def _pack_blocks(self, w: torch.Tensor, blocks, panels: int, name: str) -> None:
        qk = self.lib.dll.msd_qk()  # k per block, as small_rows.cpp packs them
        _check_blocks(blocks, qk)
        if self.format not in ("float32", INT8):
            raise ValueError(f"GGUF blocks dequantise to float32 weights; they cannot be packed as {self.format}")
        shape = (int(blocks.d.shape[0]), int(blocks.d.shape[1]) * qk)
        if shape != (self.n, self.k):
            raise ValueError(f"{blocks.kind} blocks of shape {shape} for a {self.k}x{self.n} weight (want "
                             f"{(self.n, self.k)})")
        same = torch.equal(_dequantised(blocks).view(torch.int32), w.detach().t().contiguous().view(torch.int32))
        if w.dtype != torch.float32 or not same:
            raise ValueError(f"these {blocks.kind} blocks do not dequantise to this weight bit for bit")
        d = blocks.d.contiguous().view(torch.int16)
        q = blocks.q.contiguous()
        self.data = _aligned_zeros(panels * (self.k // qk) * self.lib.dll.msd_block_bytes(self.code), torch.uint8,
                                   huge=self.lib)
        pack = self.lib.fn(f"msd_pack_{name}")
        if blocks.kind == "q4_1":
            m = blocks.m.contiguous().view(torch.int16)
            bad = pack(d.data_ptr(), m.data_ptr(), q.data_ptr(), self.k, self.n, self.data.data_ptr())
        else:
            bad = pack(d.data_ptr(), q.data_ptr(), self.k, self.n, self.data.data_ptr())
        if bad:
            raise KernelError(f"packing {blocks.kind} blocks of a {self.k}x{self.n} weight was refused")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)

    @property
    def dtype(self) -> torch.dtype:
        return FORMATS.get(self.format, torch.int8)  # torch.int8 stands for the int8 format

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
        if m and self._run(x.data_ptr(), m, self.k, self.k, self._data_ptr, self.n, y.data_ptr(), self.n):
            raise KernelError(f"the kernel refused x {tuple(x.shape)} for a {self.k}x{self.n} weight")
        return y


# -- a whole decoder layer ------------------------------------------------------------------------------------
class _LayerSpec(ctypes.Structure):  # small_rows.cpp's msd_layer, field for field
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
    RoPE, grouped-query causal attention over the layer's cache, SiLU MLP) run by small_rows.cpp in one call:
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
