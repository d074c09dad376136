"""A lean runner for Llama-family weights (Llama, Mistral, Qwen2, Qwen3): the same interface as HFRunner.

FastLlamaRunner's docstring says what it holds, its cache layout and why it is fast on a CPU
(measured: BENCHMARKS.md's history). Layers ≤ ℓ_e and > ℓ_e are two calls of one loop, so the early-exit readout
sits between them. RoPE frequencies come from the model's own rotary module (any scaling type whose
frequencies do not depend on the sequence length).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..models.ops import RopeTable, apply_rope, attend, attend_blocks, rms_norm
from ..records import RowBand, RowPlan
from .exactness import EXACT_ROWS, RowOp, pad_rows
from ..kernels.blocks import BlockWeights
from ..kernels.formats import Q8_0, QK
from ..kernels.native import INT8, STAND_INS, NativeLayer, PackedLinear, format_name
from ..kernels.native import rms_norm as native_rms_norm
from ..models.exit_head import TORCH_PRODUCTS, ExitLogits, ExitProducts
from .protocol import NO_KERNEL, ExitPass, KernelChoice, WeightFormats, WeightStream, lower_formats

FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

KEY_BUCKET = 64  # with a row plan, attention reduces over key axes of a multiple of this length


@dataclass
class _Layer:
    ln1: torch.Tensor          # [H]
    w_qkv: torch.Tensor        # [H, (Hq + 2·Hkv)·D]
    b_qkv: torch.Tensor | None  # [(Hq + 2·Hkv)·D] (Qwen2)
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D]
    w_o: torch.Tensor          # [Hq·D, H]
    ln2: torch.Tensor          # [H]
    w_gate_up: torch.Tensor    # [H, 2·I]
    w_down: torch.Tensor       # [I, H]


@dataclass
class FastCache:
    k: torch.Tensor   # [L, Hkv, S_max, D]
    v: torch.Tensor   # [L, Hkv, S_max, D]
    length: int = 0


@dataclass
class _FastPass:
    """One forward between forward_to_exit and finish_pass: where it writes and what the next layer reads."""
    cache: FastCache
    start: int                 # the first new position
    end: int                   # one past the last
    x: torch.Tensor            # [1, T, H] the hidden state after the layers run so far
    cos: torch.Tensor          # [T, D]
    sin: torch.Tensor          # [T, D]
    plan: RowPlan | None       # the row plan when T <= EXACT_ROWS
    groups: list | None        # the key buckets under a row plan (_key_buckets)
    mask: torch.Tensor | None  # [1, T, S] causal among the new tokens (no row plan, T > 1)
    native: bool = False       # the layers run as NativeLayers (kernels/native.py): exact without a plan


@dataclass
class FastBranches:
    prefix: FastCache         # shared, read-only: every row sees its first valid[r] entries
    valid: torch.Tensor       # [R] long
    k: torch.Tensor           # [L, R, Hkv, S_own, D] each row's own entries
    v: torch.Tensor
    own: int = 0              # entries each row holds in k/v (all rows advance together)


class FastLlamaRunner:
    """The Runner protocol over a Llama-family model's weights, without the model's own forward.

    Holds plain tensors taken from the loaded model (no modules, no hooks): the embedding, per layer
    a `_Layer` of fused, transposed weights (in, out), the final norm gain, the LM head transposed
    and sliced to vocab_size, and the rotary module's frequencies and scaling.

    Cache layout: a `FastCache` is keys and values [L, Hkv, S_max, D] allocated once (doubling when
    a window outgrows it) plus `length`, the number of valid entries; entry s holds position s with
    RoPE applied. Branch rows (`FastBranches`) read a cache's first valid[r] entries as a shared,
    read-only prefix and keep their own entries in [L, R, Hkv, S_own, D] next to it.

    Why it is fast: weights stored transposed and fused (q|k|v, gate|up), so single-row matmuls
    stream them at full bandwidth; attention reads the preallocated buffers in place (no cache
    objects; one causal mask per call, none for one new token); branch rows attend to the shared
    prefix once ("cascade" attention) instead of copying it per row. The maths is mirror_core/models/ops.py.

    Positions come from the caller: `forward` appends at the cache's `length`, `fork` takes each
    row's valid length and `forward_rows` feeds at valid[r] + own. Rolling back is `truncate`
    (an integer) and adopting a branch is `select_row`; no position moves except by the engine's calls.
    """

    kernel = NO_KERNEL             # the exact small-row kernel (kernels/native.py), or none and why
    #                                (runners.choose_kernel decides it for build_runner)
    plans_rows = True              # its calls take a row plan (row_ops, row_plan)
    reads_features = False
    native_layers: list[NativeLayer] | None = None  # the sequence layers as the kernel runs them (with `kernel`)
    _rope_table: RopeTable | None = None  # _rope's cos, sin rows (made on first use: the kernel decides exact)

    def __init__(self, model, vocab_size: int | None = None, capacity: int = 512, exit_head=None,
                 kernel: KernelChoice | None = None, blocks: dict[str, BlockWeights] | None = None):
        cfg = model.config
        if cfg.model_type not in FAST_MODEL_TYPES:
            raise ValueError(f"fast runner supports {FAST_MODEL_TYPES}, not {cfg.model_type!r}")
        rotary = model.model.rotary_emb
        if getattr(rotary, "rope_type", "default") == "dynamic":
            raise ValueError("dynamic RoPE scaling depends on the sequence length; use the generic runner")
        self.device = model.model.embed_tokens.weight.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.num_layers = cfg.num_hidden_layers
        self.num_streams = 0
        self.vocab_size = int(vocab_size or cfg.vocab_size)
        self.h_q, self.h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.h_q
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.inv_freq = rotary.inv_freq.to(self.device, torch.float32)                 # [D/2]
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.capacity = capacity
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self.exit_head = exit_head  # an exit_head.ExitHead: the layer-ℓ_e readout instead of the final norm + LM head
        self.kernel = kernel or self.kernel
        # the model's own GGUF blocks (models/gguf_blocks.py), by map: the kernel's float32 format streams them
        self._blocks = {} if self._lib is None else _fused_blocks(blocks or {}, cfg.num_hidden_layers, self.vocab_size)
        self.block_note = ""  # why a map given as blocks stayed float32 ("" when none did)
        with torch.no_grad():
            self.embed = model.model.embed_tokens.weight.detach()                          # [V, H]
            self.norm = model.model.norm.weight.detach()                                   # [H]
            lm_head = model.lm_head.weight.detach()[: self.vocab_size].t().contiguous()     # [H, V]
            self._keep_layers([self._layer(layer) for layer in model.model.layers], lm_head)

    @staticmethod
    def _layer(layer) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        w_qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0).t().contiguous()
        b_qkv = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if a.q_proj.bias is not None else None
        qn = getattr(a, "q_norm", None)
        kn = getattr(a, "k_norm", None)
        return _Layer(layer.input_layernorm.weight.detach(), w_qkv.detach(), None if b_qkv is None else b_qkv.detach(),
                      None if qn is None else qn.weight.detach(), None if kn is None else kn.weight.detach(),
                      a.o_proj.weight.detach().t().contiguous(), layer.post_attention_layernorm.weight.detach(),
                      torch.cat([m.gate_proj.weight, m.up_proj.weight], 0).detach().t().contiguous(),
                      m.down_proj.weight.detach().t().contiguous())

    # -- matmul dtypes (chosen per lane and per shape by runners/calibrate.py) --------------
    # A row plan (runners/exactness.py, set by check_rows for a target whose logits otherwise depend on how many rows
    # share a call): in calls of up to EXACT_ROWS rows every matmul runs in its measured row band (chunked, zero
    # rows padded) and each row attends over a key axis that depends only on its own position (_key_buckets: a key
    # axis of another length blocks the softmax-weighted sum of values differently, and so rounds it).
    row_plan: RowPlan | None = None

    def _keep_layers(self, layers: list[_Layer], lm_head: torch.Tensor) -> None:
        """The weights as loaded (the master copy); set_dtypes may add copies whose linear maps are in another dtype,
        or packed for the kernel (then the LM head too)."""
        self._master = (layers, lm_head)
        self._weights: dict[torch.dtype, tuple[list[_Layer], object, list[NativeLayer] | None]] = {}
        self._exit_packs: dict[torch.dtype, ExitProducts] = {}  # the exit head's packed products per format
        self._exit_products = TORCH_PRODUCTS  # the ones exit_readout passes to the head now
        self.set_dtypes(self.dtype)

    def set_dtypes(self, sequence: torch.dtype, rows: torch.dtype | None = None) -> None:
        """The dtype of the linear maps' weights in one-sequence forwards (AR steps, windows) and in branch
        rows (forward_rows). Only the matmuls change: with torch's matmul each casts its input to the weights'
        dtype and its product back, and the LM head keeps the loaded dtype; with the kernel every linear map and
        the LM head run packed in that format (float32 inputs and products; kernels/src/kernel.cpp). The residual
        stream, norms, attention and KV cache keep the model's dtype either way."""
        self.layers, self.lm_head, self.native_layers = self._weights_in(sequence)
        self.row_layers, self.row_head, _ = self._weights_in(rows or sequence)
        if self._lib is not None and self.exit_head is not None:  # the readout in the same format
            if sequence not in self._exit_packs:
                self._exit_packs[sequence] = self._pack_exit_head(sequence)
            self._exit_products = self._exit_packs[sequence]

    def drop_unused_dtypes(self, keep_loaded: bool = False) -> None:
        """Free the weight copies that neither set_dtypes choice uses, and the loaded ones unless `keep_loaded` (from
        which set_dtypes can make any offered format again)."""
        used = {self.sequence_dtype, self.rows_dtype}
        self._weights = {d: w for d, w in self._weights.items() if d in used}
        self._exit_packs = {d: p for d, p in self._exit_packs.items() if d in used}
        if not keep_loaded:
            self._master = None

    @property
    def sequence_dtype(self) -> torch.dtype:
        return self.layers[0].w_qkv.dtype

    @property
    def rows_dtype(self) -> torch.dtype:
        return self.row_layers[0].w_qkv.dtype

    @property
    def _lib(self):
        """The kernel's native.Library (None: torch's matmul)."""
        return self.kernel.library

    @property
    def formats(self) -> WeightFormats:
        """The loaded format and those of lower precision (every format on the kernel), int8 where the kernel streams
        the model's own GGUF blocks, and q8_0 (quantised from the loaded float32 weights) on the kernel where every
        map's inputs fill blocks of 32; only the linear maps change format."""
        blocks = tuple(sorted(map(str, self._blocks))) if self._lib is not None else ()
        fits = self._lib is not None and self.dtype == torch.float32 and all(
            k % QK == 0 for k in (self.layers[0].w_qkv.shape[0], self.layers[0].w_o.shape[0],
                                  self.layers[0].w_down.shape[0]))
        return WeightFormats(lower_formats(self.dtype) + ((torch.int8,) if blocks else ())
                             + ((STAND_INS[Q8_0],) if fits else ()), blocks=blocks)

    @property
    def weight_stream(self) -> WeightStream:
        """Every layer's linear maps and the LM head as the one-sequence forwards stream them now."""
        maps = [w for layer in self.layers for w in (layer.w_qkv, layer.w_o, layer.w_gate_up, layer.w_down)]
        maps.append(self.lm_head)
        size = sum(w.nbytes if isinstance(w, PackedLinear) else w.numel() * w.element_size() for w in maps)
        return WeightStream(size, sum(w.shape[0] * w.shape[1] for w in maps), self._storage())

    def _weights_in(self, dtype: torch.dtype) -> tuple[list[_Layer], object, list[NativeLayer] | None]:
        if dtype not in self._weights:
            if self._master is None:
                raise RuntimeError(f"no {dtype} weights: the loaded ones were freed (drop_unused_dtypes)")
            layers, head = self._master
            if self._lib is not None:
                fmt = format_name(dtype)
                pack = lambda w, name: self._pack(w, fmt, name)  # noqa: E731
                head = pack(head, "head")
                layers = [replace(layer, w_qkv=pack(layer.w_qkv, (i, "qkv")), w_o=pack(layer.w_o, (i, "o")),
                                  w_gate_up=pack(layer.w_gate_up, (i, "gate_up")), w_down=pack(layer.w_down, (i, "down")))
                          for i, layer in enumerate(layers)]
            elif dtype != self.dtype:
                layers = [replace(layer, w_qkv=layer.w_qkv.to(dtype), w_o=layer.w_o.to(dtype),
                                  w_gate_up=layer.w_gate_up.to(dtype), w_down=layer.w_down.to(dtype)) for layer in layers]
            self._weights[dtype] = (layers, head, None if self._lib is None else [self._native(x) for x in layers])
        return self._weights[dtype]

    def _pack(self, w: torch.Tensor, fmt: str, name, rows: torch.Tensor | None = None) -> PackedLinear:
        """w [K, N] packed in `fmt`; in float32 and int8, as the model's own GGUF blocks where it has them (`rows`: a
        subset of the map's outputs). Blocks that do not dequantise to w exactly are not used (block_note says so),
        and a map without blocks runs int8's neighbour, exact float32."""
        blocks = self._blocks.get(name) if fmt in ("float32", INT8) else None
        if blocks is not None:
            try:
                return PackedLinear(w, fmt, self._lib, blocks=blocks if rows is None else blocks.rows(rows))
            except ValueError as exc:
                self.block_note = f"{name}: {exc}; streamed as float32"
        return PackedLinear(w, "float32" if fmt == INT8 else fmt, self._lib)

    def _storage(self) -> str:
        """What the sequence forwards' linear maps stream: the format, or the GGUF block formats it is stored in
        ("float32 as q4_1+q8_0")."""
        stores = sorted({w.storage for layer in self.layers for w in (layer.w_qkv, layer.w_o, layer.w_gate_up,
                         layer.w_down)} | {self.lm_head.storage}) if isinstance(self.lm_head, PackedLinear) else []
        fmt = format_name(self.sequence_dtype)
        kinds = [k for k in stores if k != fmt]
        return fmt if not kinds else f"{fmt} on {'+'.join(stores)}" if fmt == INT8 else f"{fmt} as {'+'.join(stores)}"

    def _pack_exit_head(self, dtype: torch.dtype) -> ExitProducts:
        """The exit head's products in the target's format; in int8 its adapter A (float weights, no GGUF blocks)
        runs q8_0, int8's arithmetic on Q8_0 blocks quantised from it (the readout only picks candidates)."""
        fmt = format_name(dtype)
        adapter = self.exit_head.adapter
        return ExitProducts(PackedLinear(adapter, Q8_0, self._lib) if fmt == INT8 and adapter.shape[0] % QK == 0
                            else self._pack(adapter, fmt, "exit adapter"),
                            self._pack(self.exit_head.w, fmt, "head", rows=self.exit_head.ids))

    def _native(self, layer: _Layer) -> NativeLayer:
        return NativeLayer(self._lib, ln1=layer.ln1, ln2=layer.ln2, qkv=layer.w_qkv, b_qkv=layer.b_qkv,
                           q_norm=layer.q_norm, k_norm=layer.k_norm, o=layer.w_o, gate_up=layer.w_gate_up,
                           down=layer.w_down, heads=self.h_q, kv_heads=self.h_kv, head_dim=self.head_dim, eps=self.eps)

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return (self.device,)

    # -- building blocks (the maths is mirror_core/models/ops.py; these bind this model's weights) ----
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., T, D] at positions [..., T], in this model's frequencies, scaling and dtype (ops.RopeTable;
        on the kernel in float64 angles: the same bits on every CPU)."""
        if self._rope_table is None:
            self._rope_table = RopeTable(self.inv_freq, self.rope_scale, self.dtype, exact=self._lib is not None)
        return self._rope_table(positions)

    def _kernel(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [..., K] @ w [K, N] in the weights' dtype, the product back in x's dtype (a no-op cast when they agree);
        packed weights run the exact kernel. The one place a linear map runs (a test runner overrides it to round
        like another CPU)."""
        if type(w) is PackedLinear:
            return w(x)
        return x @ w if x.dtype == w.dtype else (x.to(w.dtype) @ w).to(x.dtype)

    def _matmul(self, x: torch.Tensor, w: torch.Tensor, band: RowBand | None = None) -> torch.Tensor:
        """x [..., K] @ w, with a row band: the rows (all leading axes) in the band's chunks, each padded with zero
        rows to the band's floor, so every row's product comes from the same kernel in any call."""
        if band is None or band.holds(x.numel() // x.shape[-1]):
            return self._kernel(x, w)
        rows = x.reshape(-1, x.shape[-1])                                                 # [M, K]
        parts = [self._kernel(pad_rows(rows[a:b], n), w)[: b - a] for a, b, n in band.spans(rows.shape[0])]
        return torch.cat(parts).view(*x.shape[:-1], w.shape[1])                           # [..., N]

    def _attend(self, q, keys, values, may_attend) -> torch.Tensor:
        """ops.attend with this model's scale (the one place sequence attention runs; a test runner overrides it)."""
        return attend(q, keys, values, may_attend, self.scale)

    def _attend_rows(self, q, keys, values, may_attend, band: RowBand | None) -> torch.Tensor:
        """q [1, Hq, L, D] over one key axis in the band's chunks of query rows (padded rows attend like the last
        real one and are dropped) → [1, L, Hq·D]."""
        if band is None or band.holds(q.shape[2]):
            return self._attend(q, keys, values, may_attend)
        parts = []
        for a, b, n in band.spans(q.shape[2]):
            ok = may_attend[:, a:b]
            ok = torch.cat([ok, ok[:, -1:].expand(-1, n - (b - a), -1)], 1) if n > b - a else ok  # [1, n, S]
            parts.append(self._attend(pad_rows(q[:, :, a:b], n, dim=2), keys, values, ok)[:, : b - a])
        return torch.cat(parts, 1)

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos, sin, plan: RowPlan | None = None):
        """x [B, T, H] → q [B, Hq, T, D], k and v [B, Hkv, T, D] with RoPE applied."""
        b, t, _ = x.shape
        band = plan and plan.band("qkv")
        qkv = self._matmul(rms_norm(x, layer.ln1, self.eps), layer.w_qkv, band)            # [B, T, (Hq+2Hkv)·D]
        if layer.b_qkv is not None:
            qkv = qkv + layer.b_qkv
        d = self.head_dim
        q, k, v = qkv.split([self.h_q * d, self.h_kv * d, self.h_kv * d], -1)
        q = q.view(b, t, self.h_q, d)
        k = k.view(b, t, self.h_kv, d)
        if layer.q_norm is not None:
            q, k = rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)
        q = apply_rope(q.transpose(1, 2), cos, sin)                                       # [B, Hq, T, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)                                       # [B, Hkv, T, D]
        return q, k, v.view(b, t, self.h_kv, d).transpose(1, 2)

    def _mlp_residual(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor, plan: RowPlan | None = None):
        x = x + self._matmul(attn, layer.w_o, plan and plan.band("o"))                    # [B, T, H]
        gate, up = self._matmul(rms_norm(x, layer.ln2, self.eps), layer.w_gate_up,
                                plan and plan.band("gate_up")).chunk(2, -1)               # [B, T, I] each
        return x + self._matmul(F.silu(gate) * up, layer.w_down, plan and plan.band("down"))  # [B, T, H]

    def _head(self, x: torch.Tensor, plan: RowPlan | None = None, head=None) -> torch.Tensor:
        band = plan and plan.band("head")
        w = self.lm_head if head is None else head
        return self._matmul(self._final_norm(x), w, band).float()                         # [..., V]

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final RMS norm: the kernel's own (the layers' norm: the same bits on every CPU) where the kernel runs
        the maps, else ops.rms_norm."""
        if self._lib is not None and x.dtype == torch.float32:
            return native_rms_norm(self._lib, x, self.norm, self.eps)
        return rms_norm(x, self.norm, self.eps)

    def exit_readout(self, h: torch.Tensor, layer: int) -> ExitLogits:
        """The layer-ℓ_e readout: the trained exit head when it was trained for this layer (over its own ids), else
        the logit lens (over the whole vocabulary)."""
        head = self.exit_head
        if head is not None and head.layer == layer:
            return head.columns(h, self._exit_products)                                   # [T, V_e]
        return ExitLogits(self._head(h.to(self.dtype)), None, self.vocab_size)            # [T, V]

    # -- the row-shape-dependent operations, bound to this model's weights (runners/exactness.py measures them) ------
    def row_ops(self) -> list[RowOp]:
        """Each linear map (at the current matmul dtype), the LM head, and attention over every key-axis length a
        row plan uses (multiples of KEY_BUCKET up to the context) as operations on rows."""
        layer = self.layers[0]  # every layer has these shapes; a kernel is chosen by shape, not by values
        ops = [RowOp(name, w.shape[0], lambda x, band, w=w: self._matmul(x, w, band))
               for name, w in (("qkv", layer.w_qkv), ("o", layer.w_o), ("gate_up", layer.w_gate_up),
                               ("down", layer.w_down), ("head", self.lm_head))]
        gen = torch.Generator().manual_seed(2)
        lengths, n = [], KEY_BUCKET
        while n < 2 * (self.max_positions or 4096) and len(lengths) < 9:  # the bucket above the context too
            lengths.append(n)
            n *= 2
        kv = [tuple(torch.randn(1, self.h_kv, s, self.head_dim, generator=gen).to(self.device, self.dtype)
                    for _ in range(2)) for s in lengths or [KEY_BUCKET]]                  # keys, values [1, Hkv, S, D]

        def attention(x: torch.Tensor, band: RowBand | None) -> torch.Tensor:  # query rows [M, Hq·D] → [M, n·Hq·D]
            m = x.shape[0]
            q = x.to(self.dtype).view(1, m, self.h_q, self.head_dim).transpose(1, 2)      # [1, Hq, M, D]
            outs = [self._attend_rows(q, k, v, torch.ones(1, m, k.shape[2], dtype=torch.bool, device=self.device),
                                      band)[0] for k, v in kv]
            return torch.cat(outs, -1)

        return ops + [RowOp("attention", self.h_q * self.head_dim, attention)]

    # -- sequences -------------------------------------------------------------------------
    def new_cache(self) -> FastCache:
        shape = (self.num_layers, self.h_kv, self.capacity, self.head_dim)
        return FastCache(torch.zeros(shape, dtype=self.dtype, device=self.device),  # zeros: see _key_buckets
                         torch.zeros(shape, dtype=self.dtype, device=self.device))

    def cache_len(self, cache: FastCache) -> int:
        return cache.length

    def _reserve(self, cache: FastCache, need: int) -> None:
        if need > cache.k.shape[2]:
            grow = max(need, 2 * cache.k.shape[2]) - cache.k.shape[2]
            pad = (0, 0, 0, grow)
            cache.k, cache.v = F.pad(cache.k, pad), F.pad(cache.v, pad)

    @torch.inference_mode()
    def forward(self, cache: FastCache, ids: list[int], rows: int | None = None) -> torch.Tensor:
        p = self._begin(cache, ids)
        self._run_layers(p, 0, self.num_layers)
        return self._end(p, rows)                                                         # [T, V] ([rows, V])

    @torch.inference_mode()
    def forward_to_exit(self, cache: FastCache, ids: list[int], layer: int) -> ExitPass:
        p = self._begin(cache, ids)
        self._run_layers(p, 0, layer)
        return ExitPass(p.x[0].float().clone(), layer, p)                                 # h^(ℓ_e) [T, H]

    @torch.inference_mode()
    def finish_pass(self, exit_pass: ExitPass, rows: int | None = None) -> torch.Tensor:
        p: _FastPass = exit_pass.rest
        self._run_layers(p, exit_pass.layer, self.num_layers)
        return self._end(p, rows)                                                         # [T, V] ([rows, V])

    def _begin(self, cache: FastCache, ids: list[int]) -> _FastPass:
        t, start = len(ids), cache.length
        end = start + t
        self._reserve(cache, end)
        x = self.embed[torch.tensor(ids, device=self.device)].unsqueeze(0)               # [1, T, H]
        cos, sin = self._rope(torch.arange(start, end, device=self.device))               # [T, D]
        if self.native_layers is not None:  # every row alone by construction: no plan, buckets or mask
            return _FastPass(cache, start, end, x, cos, sin, None, None, None, native=True)
        plan = self.row_plan if t <= EXACT_ROWS else None  # longer calls (prefills) are the same in every decoder
        groups = None if plan is None else self._key_buckets(cache, start, t)
        mask = None
        if t > 1 and groups is None:  # causal among the new tokens; the cached prefix is visible to all
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(start).unsqueeze(0)  # [1, T, S]
        return _FastPass(cache, start, end, x, cos, sin, plan, groups, mask)

    def _end(self, p: _FastPass, rows: int | None = None) -> torch.Tensor:
        """The pass's logits: every row's, or (rows) only the last rows' (a prefill reads one: the LM head is a fifth
        of a token's arithmetic, so the other rows skip it)."""
        p.cache.length = p.end
        x = p.x if rows is None else p.x[:, p.x.shape[1] - rows:]                          # [1, T|rows, H]
        return self._head(x, p.plan)[0]                                                   # [T|rows, V]

    def _run_layers(self, p: _FastPass, first: int, stop: int) -> None:
        """Layers first+1..stop of a pass (p.x [1, T, H] in and out; their keys and values into the cache)."""
        cache, start, end = p.cache, p.start, p.end
        if p.native:
            for i in range(first, stop):
                self.native_layers[i](p.x[0], p.cos, p.sin, cache.k[i], cache.v[i], start)       # x [T, H] in place
            return
        band = None if p.plan is None else p.plan.band("attention")
        for i in range(first, stop):
            layer = self.layers[i]
            q, k, v = self._qkv(layer, p.x, p.cos, p.sin, p.plan)
            cache.k[i, :, start:end] = k[0]
            cache.v[i, :, start:end] = v[0]
            if p.groups is not None:  # each row over its bucket's keys, masked to its own: the same call shape as alone
                attn = torch.cat([self._attend_rows(q[:, :, lo:hi], cache.k[i, :, :keys].unsqueeze(0),
                                                    cache.v[i, :, :keys].unsqueeze(0), ok, band)
                                  for lo, hi, keys, ok in p.groups], 1)                   # [1, T, Hq·D]
            else:
                attn = self._attend(q, cache.k[i, :, :end].unsqueeze(0), cache.v[i, :, :end].unsqueeze(0), p.mask)
            p.x = self._mlp_residual(layer, p.x, attn, p.plan)

    def _key_buckets(self, cache: FastCache, start: int, rows: int) -> list[tuple[int, int, int, torch.Tensor]]:
        """Attention under a row plan: rows grouped by their key bucket (own length rounded up to KEY_BUCKET), each
        group as (first row, end row, keys, may-attend [1, rows, keys]). A row then reduces over the same key axis
        whether it is alone (AR) or in a window, so its rounding cannot depend on the call. Entries past a row's
        length are masked (probability exactly 0); the cache is zero-initialised so 0 × value stays 0."""
        groups, lo = [], 0
        while lo < rows:
            keys = -(-(start + lo + 1) // KEY_BUCKET) * KEY_BUCKET
            hi = lo
            while hi < rows and start + hi + 1 <= keys:
                hi += 1
            self._reserve(cache, keys)
            lengths = torch.arange(start + lo + 1, start + hi + 1, device=self.device)          # [rows]
            ok = (torch.arange(keys, device=self.device) < lengths.unsqueeze(1)).unsqueeze(0)  # [1, rows, keys]
            groups.append((lo, hi, keys, ok))
            lo = hi
        return groups

    def truncate(self, cache: FastCache, length: int) -> None:
        cache.length = min(cache.length, length)

    # -- branch rows (cascade attention: the shared prefix is read once for all rows) ----------
    def fork(self, cache: FastCache, valid_lengths: list[int]) -> FastBranches:
        rows = len(valid_lengths)
        shape = (self.num_layers, rows, self.h_kv, 16, self.head_dim)
        return FastBranches(cache, torch.tensor(valid_lengths, device=self.device),
                            torch.empty(shape, dtype=self.dtype, device=self.device),
                            torch.empty(shape, dtype=self.dtype, device=self.device))

    @torch.inference_mode()
    def forward_rows(self, br: FastBranches, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows, t = ids.shape
        if br.own + t > br.k.shape[3]:
            pad = (0, 0, 0, max(br.own + t, 2 * br.k.shape[3]) - br.k.shape[3])
            br.k, br.v = F.pad(br.k, pad), F.pad(br.v, pad)
        p_len = int(br.valid.max())
        positions = br.valid.unsqueeze(1) + br.own + torch.arange(t, device=self.device)  # [R, T]
        cos, sin = self._rope(positions.unsqueeze(1))                                     # [R, 1, T, D]
        prefix_ok = (torch.arange(p_len, device=self.device) < br.valid.unsqueeze(1)).unsqueeze(1)  # [R, 1, P]
        own_ok = torch.ones(t, br.own + t, dtype=torch.bool, device=self.device).tril(br.own)[None]  # [1, T, own+T]
        x = self.embed[ids.to(self.device)]                                               # [R, T, H]
        end = br.own + t
        for i, layer in enumerate(self.row_layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            br.k[i, :, :, br.own: end] = k
            br.v[i, :, :, br.own: end] = v
            # cascade: the shared prefix is read once for all rows, then each row's own entries
            prefix = (br.prefix.k[i, :, :p_len].unsqueeze(0), br.prefix.v[i, :, :p_len].unsqueeze(0), prefix_ok)
            attn = attend_blocks(q, [prefix, (br.k[i, :, :, :end], br.v[i, :, :, :end], own_ok)], self.scale)
            x = self._mlp_residual(layer, x, attn)
        br.own += t
        return self._head(x, head=self.row_head), None                                   # [R, T, V]

    def select_row(self, br: FastBranches, row: int) -> FastCache:
        valid = int(br.valid[row])
        cache = self.new_cache()
        self._reserve(cache, valid + br.own)
        cache.k[:, :, :valid] = br.prefix.k[:, :, :valid]
        cache.v[:, :, :valid] = br.prefix.v[:, :, :valid]
        cache.k[:, :, valid: valid + br.own] = br.k[:, row, :, : br.own]
        cache.v[:, :, valid: valid + br.own] = br.v[:, row, :, : br.own]
        cache.length = valid + br.own
        return cache


def _fused_blocks(blocks: dict[str, BlockWeights], layers: int, vocab_size: int) -> dict:
    """The runner's maps as blocks, where every part of the map has them: (i, "qkv"), (i, "o"), (i, "gate_up"),
    (i, "down") and "head" (the LM head's first vocab_size outputs)."""
    parts = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
             "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
    out: dict = {}
    for i in range(layers):
        for name, members in parts.items():
            found = [blocks.get(f"model.layers.{i}.{m}.weight") for m in members]
            if all(b is not None for b in found):
                out[(i, name)] = found[0] if len(found) == 1 else BlockWeights.cat(found)
    head = blocks.get("lm_head.weight")
    if head is not None:
        out["head"] = head if head.shape[0] == vocab_size else head.rows(torch.arange(min(vocab_size, head.shape[0])))
    return out
