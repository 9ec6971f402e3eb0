"""A Llama-family decoder block for a few new tokens, in one call per block (CPU, float32).

Why: with ``cpu_linear``, ``cpu_attention`` and ``cpu_norm_rope`` the arithmetic of a small
model's decode step is compiled, but the step still issues ~25 tensor operations and
kernel calls per block from Python, a few microseconds each: on the zoo target (7 blocks,
1 thread) half of a 3.4 ms step.  ``cpu_decoder.c`` chains those calls in C:

* ``front(i, h, act, ...)``: ``h += down_{i-1}(act)`` (when ``act`` is given), RMSNorm,
  the q/k/v product, the rotary embedding of q and k, the new keys and values written
  into the cache slabs, attention over the cache, ``h += o(attention)``, RMSNorm and the
  gate/up product, returned as ``[B, q, 2 I]``;
* ``tail(h, act)``: the last block's ``h += down(act)`` and the final norm.

A ragged batch (a verify whose rows have drafts of different lengths, padded to the
longest) passes ``rows``, the slots of its real tokens: only those go through the products,
so the padding costs no product (the zoo target at batch 8, 300 cached tokens: two rows
verifying 4 drafts while six verify none, 13.5 ms packed, about what 8 rows of 2 tokens
cost, 13.2 ms, against 21.0 ms for every row at 5 tokens).

The caller computes the activation ``act = silu(gate) * up`` between two blocks with
PyTorch's operations: the model's own forward does, and this file does not reproduce
PyTorch's ``exp`` rounding.

Numerics: the C code calls the same kernels (``ls_linear_*``, ``ls_attention``,
``ls_rms_norm``, ``ls_rotary``) on the same values in the same order as the op-by-op
forward that calls them from Python, so the results are equal bit for bit
(``block_front_ref`` and ``block_tail_ref`` are that op-by-op forward, in PyTorch).

Shapes: B rows of q new tokens, hidden size Hd, H query heads and G key/value heads of D,
intermediate size I.  ``h [B, q, Hd]`` contiguous, updated in place.  Cache slabs
``[B, G, cap, D]`` contiguous, whose first ``cols`` columns hold the cache.  ``cos, sin
[B, q, D]``.  ``mask [B, q, cols + q]`` bool (True = visible) or ``None``: causal.

Compiled on first use like the other CPU kernels (``_cpu_build``); ``available()`` is
False wherever any of the four kernels it chains is unavailable.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import _cpu_build, cpu_attention, cpu_linear, cpu_norm_rope
from .cpu_linear import PackedWeight

_SOURCE = Path(__file__).with_name("cpu_decoder.c")
_F32 = torch.float32
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class _Proj(ctypes.Structure):
    _fields_ = [("fn", _ptr), ("w", _ptr), ("bias", _ptr), ("n", _i64), ("k", _i64)]


class _Block(ctypes.Structure):
    _fields_ = [("qkv", _Proj), ("o", _Proj), ("gate_up", _Proj), ("down", _Proj), ("norm1", _ptr),
                ("norm2", _ptr), ("eps1", ctypes.c_float), ("eps2", ctypes.c_float)]


class _Model(ctypes.Structure):
    _fields_ = [("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64), ("inter", _i64),
                ("scale", ctypes.c_float), ("norm", _ptr), ("rotary", _ptr), ("attention", _ptr)]


class _TwoStream(ctypes.Structure):
    _fields_ = [("norm_a", _ptr), ("final_norm", _ptr), ("eps_a", ctypes.c_float), ("final_eps", ctypes.c_float),
                ("norm_before_residual", ctypes.c_int), ("embed", _ptr), ("cos_table", _ptr), ("sin_table", _ptr),
                ("vocab", _i64), ("n_pos", _i64)]


_P = ctypes.POINTER
_kernel = _cpu_build.Kernel(_SOURCE, {
    "ls_front_work": ([_P(_Model), _i64], _i64),
    "ls_block_front": ([_P(_Model), _P(_Block), _P(_Proj), _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr,
                        _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, ctypes.c_int], ctypes.c_int),
    "ls_block_tail": ([_P(_Model), _P(_Proj), _ptr, ctypes.c_float, _i64, _ptr, _ptr, _ptr, _ptr, ctypes.c_int], None),
    "ls_silu_mul": ([_ptr, _i64, _i64, _ptr], None),
    "ls_decoder_run": ([_P(_Model), _ptr, _i64, _ptr, ctypes.c_float, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _ptr,
                        _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, ctypes.c_int], ctypes.c_int),
    "ls_two_stream_work": ([_P(_Model), _i64], _i64),
    "ls_two_stream_layer": ([_P(_Model), _P(_Block), _P(_TwoStream), _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr,
                             _ptr, _ptr, _ptr, _ptr, _ptr, ctypes.c_int], ctypes.c_int),
})


def _library() -> ctypes.CDLL | None:
    return _kernel.get()


def available() -> bool:
    """True when this kernel and the four it chains can run here."""
    return reason() is None


def reason() -> str | None:
    """Why the kernel is not available (``None`` when it is)."""
    for mod in (cpu_linear, cpu_attention, cpu_norm_rope):
        why = mod.reason()
        if why is not None:
            return why
    return _cpu_build.library(_SOURCE)[1]


@dataclass(frozen=True)
class BlockWeights:
    """One block's weights: packed products (q/k/v and gate/up each side by side in one
    weight: ``[(H + 2G) D, Hd]``, ``[2 I, Hd]``), optional biases, RMSNorm weights ``[Hd]``."""

    qkv: PackedWeight
    o: PackedWeight
    gate_up: PackedWeight
    down: PackedWeight
    norm1: torch.Tensor
    norm2: torch.Tensor
    eps1: float
    eps2: float
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


def keep_pointer(t: torch.Tensor, keep: list[torch.Tensor]) -> int:
    """The address of ``t`` made contiguous, kept alive in ``keep``."""
    t = t.detach().contiguous()
    keep.append(t)
    return t.data_ptr()


def c_block(b: BlockWeights, keep: list[torch.Tensor]) -> _Block:
    """``b`` as the C struct the kernels read (every buffer it points to kept in ``keep``)."""
    lin = cpu_linear._library()
    f16, f32 = ctypes.cast(lin.ls_linear_f16, _ptr).value, ctypes.cast(lin.ls_linear_f32, _ptr).value

    def proj(pw: PackedWeight, bias: torch.Tensor | None) -> _Proj:
        bias_ptr = None if bias is None else keep_pointer(bias.float(), keep)
        keep.append(pw.data)
        return _Proj(f16 if pw.data.dtype == torch.float16 else f32, pw.data.data_ptr(), bias_ptr, pw.out_features,
                     pw.in_features)

    return _Block(proj(b.qkv, b.qkv_bias), proj(b.o, b.o_bias), proj(b.gate_up, b.gate_up_bias),
                  proj(b.down, b.down_bias), keep_pointer(b.norm1, keep), keep_pointer(b.norm2, keep), b.eps1, b.eps2)


def c_model(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, scale: float) -> _Model:
    """The shapes and the chained kernels' entry points as the C struct the kernels read."""
    norm_lib, attn_lib = cpu_norm_rope._library(), cpu_attention._library()
    return _Model(hidden, heads, kv_heads, head_dim, inter, scale, ctypes.cast(norm_lib.ls_rms_norm, _ptr).value,
                  ctypes.cast(norm_lib.ls_rotary, _ptr).value, ctypes.cast(attn_lib.ls_attention, _ptr).value)


class Decoder:
    """A stack of blocks bound for ``front``/``tail`` (module docstring): the weights'
    pointers are resolved once; a call passes only the step's tensors.

    Not re-entrant within a thread's call; scratch buffers are per thread."""

    def __init__(self, blocks: list[BlockWeights], heads: int, kv_heads: int, head_dim: int, scale: float,
                 final_norm: torch.Tensor, final_eps: float):
        lib = _library()
        why = reason()
        if lib is None or why is not None:
            raise RuntimeError(f"the CPU decoder kernel is not available: {why}")
        if not blocks:
            raise ValueError("Decoder needs at least one block")
        hidden = blocks[0].norm1.shape[0]
        inter = blocks[0].gate_up.out_features // 2
        for i, b in enumerate(blocks):
            want = {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
                    "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
            for name, (n, k) in want.items():
                pw = getattr(b, name)
                if (pw.out_features, pw.in_features) != (n, k):
                    raise ValueError(f"block {i}: {name} is [{pw.out_features}, {pw.in_features}], expected [{n}, {k}]")
            for name in ("norm1", "norm2"):
                w = getattr(b, name)
                if w.shape != (hidden,) or w.dtype != _F32:
                    raise ValueError(f"block {i}: {name} must be float32 [{hidden}], got {w.dtype} {tuple(w.shape)}")
        self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter = hidden, heads, kv_heads, head_dim, inter
        self._keep: list[torch.Tensor] = []  # every buffer a pointer refers to
        self._blocks = (_Block * len(blocks))()
        for i, b in enumerate(blocks):
            self._blocks[i] = c_block(b, self._keep)
        self._block_ptrs = [ctypes.pointer(self._blocks[i]) for i in range(len(blocks))]
        self._down_ptrs = [None] + [ctypes.pointer(self._blocks[i].down) for i in range(len(blocks) - 1)]
        self._last_down = ctypes.pointer(self._blocks[len(blocks) - 1].down)
        self._final = keep_pointer(final_norm, self._keep)
        self._final_eps = float(final_eps)
        self._model = c_model(hidden, heads, kv_heads, head_dim, inter, scale)
        self._model_ptr = ctypes.pointer(self._model)
        self._front, self._tail, self._work_size = lib.ls_block_front, lib.ls_block_tail, lib.ls_front_work
        self._run, self._silu_mul = lib.ls_decoder_run, lib.ls_silu_mul
        self._local = threading.local()
        self.num_blocks = len(blocks)
        # the activation in C too (one call per step) only where it rounds as PyTorch's here
        self.fused_activation = self._activation_matches_pytorch()

    def _activation_matches_pytorch(self) -> bool:
        """Whether ``ls_silu_mul`` equals ``activation`` (PyTorch's silu and product) bit for
        bit on a probe of this intermediate size: values over ten orders of magnitude, both
        signs, the clamps of exp and zeros.  PyTorch computes the silu's exp with SLEEF in
        its vectorised loop and with the C library in a loop's tail (I not a multiple of
        the vector width), so the answer depends on the machine and the size."""
        inter = self.inter
        if inter % 16:
            return False
        gen = torch.Generator().manual_seed(0)
        scales = torch.tensor([1e-6, 1e-3, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 40.0, 90.0, 110.0, 1e4])
        rows = [torch.randn(2 * inter, generator=gen) * scale for scale in scales for _ in range(4)]
        special = torch.tensor([0.0, -0.0, 1.0, -1.0, 87.0, -87.0, 88.7, -88.7, 103.9, -103.9, 104.1, -104.1,
                                100.0, -100.0, 1e-30, -1e-30, 3e38, -3e38])
        row = torch.randn(2 * inter, generator=gen)
        special = special[:inter]
        row[: special.numel()] = special
        row[inter : inter + special.numel()] = special.flip(0)
        gate_up = torch.stack(rows + [row])
        want = activation(gate_up)
        got = torch.empty_like(want)
        self._silu_mul(gate_up.data_ptr(), gate_up.shape[0], inter, got.data_ptr())
        return torch.equal(torch.nan_to_num(want), torch.nan_to_num(got)) and torch.equal(want.isnan(), got.isnan())

    def run(self, h: torch.Tensor, k_slabs: list[torch.Tensor], v_slabs: list[torch.Tensor], cols: int,
            cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
            records: dict[int, torch.Tensor] | None = None, rows: torch.Tensor | None = None,
            offsets: torch.Tensor | None = None) -> torch.Tensor:
        """Every block and the final norm for one step: returns the normed hidden states
        shaped as ``h`` (arguments as for ``front``; ``k_slabs``/``v_slabs``: one per block;
        ``records``: block index → a tensor shaped as ``h`` that receives its input).  One
        C call where the activation was found to round as PyTorch's (``fused_activation``),
        otherwise ``front`` per block with the activation in PyTorch between them."""
        if not self.fused_activation:
            act = None
            for i in range(self.num_blocks):
                rec = None if records is None else records.get(i)
                act = activation(self.front(i, h, act, k_slabs[i], v_slabs[i], cols, cos, sin, mask, rec, rows,
                                            offsets))
            return self.tail(h, act)
        B, q = cos.shape[0], cos.shape[1]
        M = h.numel() // self.hidden
        work, gate_up = self._buffers(B * q)
        act, out = torch.empty(M * self.inter, dtype=_F32), torch.empty(h.shape, dtype=_F32)
        n = self.num_blocks
        ks = (_ptr * n)(*[k.data_ptr() for k in k_slabs])
        vs = (_ptr * n)(*[v.data_ptr() for v in v_slabs])
        recs = None if not records else (_ptr * n)(*[records[i].data_ptr() if i in records else None for i in range(n)])
        rc = self._run(self._model_ptr, ctypes.addressof(self._blocks), n, self._final, self._final_eps, B, q,
                       None if rows is None else rows.data_ptr(), M, cols,
                       None if offsets is None else offsets.data_ptr(), k_slabs[0].shape[2], ks, vs,
                       cos.data_ptr(), sin.data_ptr(), None if mask is None else mask.data_ptr(), h.data_ptr(),
                       recs, work.data_ptr(), gate_up.data_ptr(), act.data_ptr(), out.data_ptr(),
                       torch.get_num_threads())
        if rc:
            raise MemoryError("cpu decoder: the attention could not allocate its score buffer")
        return out

    def _buffers(self, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scratch and the gate/up output for ``slots`` = B q token slots (this thread's,
        grown as needed)."""
        cached = getattr(self._local, "bufs", None)
        if cached is None or cached[0] < slots:
            work = torch.empty(int(self._work_size(self._model_ptr, slots)), dtype=_F32)
            gate_up = torch.empty(slots * 2 * self.inter, dtype=_F32)
            cached = self._local.bufs = (slots, work, gate_up)
        return cached[1], cached[2]

    def front(self, i: int, h: torch.Tensor, act: torch.Tensor | None, k_slab: torch.Tensor, v_slab: torch.Tensor,
              cols: int, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
              record: torch.Tensor | None = None, rows: torch.Tensor | None = None,
              offsets: torch.Tensor | None = None) -> torch.Tensor:
        """Block ``i`` (module docstring) for B rows of q new token slots (``cos [B, q, D]``
        gives B and q); returns gate/up ``[..., 2 I]`` shaped as ``h``, a per-thread buffer
        overwritten by the next call.

        ``h``: ``[B, q, Hd]``, or with ``rows`` (int64 ``[M]``, increasing: slot b q + i of
        each real token) ``[M, Hd]``: only the real tokens go through the products, the
        padding slots get zero keys and values, and ``mask`` (required then) must hide every
        column from them.  ``act`` shaped as ``h`` with I features (None at block 0);
        ``record`` shaped as ``h``: receives the block's input.  ``offsets`` (int64 ``[B]``,
        each ``<= cols``): row b's new keys and values go to columns ``offsets[b] + i``
        instead of ``cols + i`` (rows of different lengths, each from column 0); ``mask``
        (required then) must hide every column past a row's own.  No argument checks: the
        caller passes contiguous CPU tensors of the documented shapes and dtypes."""
        B, q = cos.shape[0], cos.shape[1]
        M = h.numel() // self.hidden
        work, gate_up = self._buffers(B * q)
        rc = self._front(self._model_ptr, self._block_ptrs[i], self._down_ptrs[i], B, q,
                         None if rows is None else rows.data_ptr(), M, cols,
                         None if offsets is None else offsets.data_ptr(), k_slab.shape[2],
                         k_slab.data_ptr(), v_slab.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                         None if mask is None else mask.data_ptr(), h.data_ptr(),
                         None if act is None else act.data_ptr(), None if record is None else record.data_ptr(),
                         work.data_ptr(), gate_up.data_ptr(), torch.get_num_threads())
        if rc:
            raise MemoryError("cpu decoder: the attention could not allocate its score buffer")
        return gate_up[: M * 2 * self.inter].view(*h.shape[:-1], 2 * self.inter)

    def tail(self, h: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``h += down(act)`` of the last block, then the final norm: shaped as ``h`` (new)."""
        M = h.numel() // self.hidden
        work, _ = self._buffers(M)
        out = torch.empty(h.shape, dtype=_F32)
        self._tail(self._model_ptr, self._last_down, self._final, self._final_eps, M, h.data_ptr(),
                   act.data_ptr(), work.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out


def activation(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU between two blocks: ``silu(gate) * up`` of ``gate_up [..., 2 I]`` (PyTorch ops)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def block_front_ref(w: BlockWeights, down_prev: tuple[PackedWeight, torch.Tensor | None] | None, heads: int,
                    kv_heads: int, head_dim: int, scale: float, h: torch.Tensor, act: torch.Tensor | None,
                    k_slab: torch.Tensor, v_slab: torch.Tensor, cols: int, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor | None = None, offsets: list[int] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of ``Decoder.front`` for one block: returns ``(h, gate_up)`` and
    writes the new keys and values into the slabs, as the kernel does (``offsets``: each
    row's first new column, as the kernel's)."""
    B, q, Hd = h.shape
    H, G, D = heads, kv_heads, head_dim
    if act is not None:
        h = h + cpu_linear.packed_linear_ref(act, *down_prev)
    x = cpu_norm_rope.rms_norm_ref(h, w.norm1, w.eps1)
    qkv = cpu_linear.packed_linear_ref(x, w.qkv, w.qkv_bias).view(B, q, H + 2 * G, D)
    qk = cpu_norm_rope.rotary_ref(qkv[:, :, : H + G].transpose(1, 2), cos, sin)  # [B, H+G, q, D]
    for b, start in enumerate([cols] * B if offsets is None else offsets):
        k_slab[b, :, start : start + q] = qk[b, H:]
        v_slab[b, :, start : start + q] = qkv[b, :, H + G :].transpose(0, 1)
    C = cols + q
    if mask is None:
        mask = torch.ones(q, C, dtype=torch.bool).tril(C - q)[None].expand(B, q, C)
    o = cpu_attention.attention_ref(qk[:, :H], k_slab[:, :, :C], v_slab[:, :, :C], mask[:, None], scale)
    h = h + cpu_linear.packed_linear_ref(o.reshape(B, q, H * D), w.o, w.o_bias)
    x = cpu_norm_rope.rms_norm_ref(h, w.norm2, w.eps2)
    return h, cpu_linear.packed_linear_ref(x, w.gate_up, w.gate_up_bias)


def block_tail_ref(down: PackedWeight, down_bias: torch.Tensor | None, final_norm: torch.Tensor, eps: float,
                   h: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of ``Decoder.tail``: returns ``(h, normed)``."""
    h = h + cpu_linear.packed_linear_ref(act, down, down_bias)
    return h, cpu_norm_rope.rms_norm_ref(h, final_norm, eps)
