"""EAGLE-3's draft layer for a few new tokens in one call (CPU, float32).

Why: an EAGLE-3 head drafts one token per forward of one decoder layer, and at batch 1 that
layer written as PyTorch operations and kernel calls (the embedding and rotary look-ups, two
norms and a concatenation, three products, the rotary embedding, the cache's update, the
attention, the SwiGLU, the final norm) cost ~350 us per token on this CPU, where its
arithmetic is ~50 us (docs/design/eagle3.md, "Drafting cost").  ``cpu_decoder.c``'s
``ls_two_stream_layer`` runs all of it, writing the new keys and values into the cache's
slabs itself.

The layer (``two_stream_layer_ref`` is the same in PyTorch), for tokens ``ids`` with
features ``g``:

    a   = [norm_a(embed[ids]); norm1(g)]                 [.., 2 Hd]
    h   = g  (norm1(g) with norm_before_residual)
    h  += o(attention(rotary(q), rotary(k), v))           q, k, v = a Wqkv
    h  += down(silu(gate) * up)                           gate, up = norm2(h) Wgu
    out = final_norm(h)

``block.qkv`` reads ``2 Hd``; ``block.norm1`` is the feature's norm (EAGLE-3's
``hidden_norm``), ``block.norm2`` the post-attention norm.  The SwiGLU is ``cpu_decoder``'s
C one, which need not round as PyTorch's (a drafter's output never changes what the target
generates), so the result equals the reference to float32 rounding, not bit for bit.

Shapes: B rows of q new tokens, hidden size Hd, H query heads and G key/value heads of D.
``ids, positions [B, q]`` int64; ``g [B, q, Hd]``; cache ``k, v [B, G, >= cols + q, D]``
(views of slabs whose columns are ``D`` floats apart: a ``SlabCache`` layer's keys and
values), the new keys and values written to columns ``cols ..``; ``mask [B, q, cols + q]``
or ``[B, 1, q, cols + q]`` bool (True = visible), or ``None``: causal, the new tokens last.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from . import cpu_attention, cpu_decoder, cpu_linear, cpu_norm_rope
from .cpu_decoder import BlockWeights

_F32 = torch.float32
_ERRORS = {1: "the attention could not allocate its score buffer", 2: "a token id is outside the embedding table",
           3: "a position is outside the rotary tables"}


def available() -> bool:
    """True when the compiled layer can run here (``cpu_decoder``'s kernels)."""
    return cpu_decoder.available()


class TwoStreamLayer:
    """One EAGLE-3 draft layer bound once (module docstring): ``run`` passes only a step's
    tensors.  Scratch buffers are per thread; not re-entrant within a thread's call.

    ``embed [V, Hd]`` float32: the token embeddings; ``cos_table, sin_table [n_pos, D]``
    float32: the rotary tables by position; ``norm_a`` (``[Hd]``, ``eps_a``): the
    embedding's norm; ``final_norm`` (``[Hd]``, ``final_eps``)."""

    def __init__(self, block: BlockWeights, heads: int, kv_heads: int, head_dim: int, scale: float,
                 norm_a: torch.Tensor, eps_a: float, final_norm: torch.Tensor, final_eps: float,
                 norm_before_residual: bool, embed: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor):
        why = cpu_decoder.reason()
        if why is not None:
            raise RuntimeError(f"the CPU two-stream layer is not available: {why}")
        hidden = block.norm1.shape[0]
        inter = block.gate_up.out_features // 2
        want = {"qkv": ((heads + 2 * kv_heads) * head_dim, 2 * hidden), "o": (hidden, heads * head_dim),
                "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        for name, (n, k) in want.items():
            pw = getattr(block, name)
            if (pw.out_features, pw.in_features) != (n, k):
                raise ValueError(f"{name} is [{pw.out_features}, {pw.in_features}], expected [{n}, {k}]")
        if inter % 16:
            raise ValueError(f"intermediate size {inter} is not a multiple of 16 (the C SwiGLU's vector width)")
        for name, t, shape in (("norm_a", norm_a, (hidden,)), ("final_norm", final_norm, (hidden,)),
                               ("norm1", block.norm1, (hidden,)), ("norm2", block.norm2, (hidden,)),
                               ("embed", embed, (embed.shape[0], hidden)),
                               ("cos_table", cos_table, (cos_table.shape[0], head_dim)),
                               ("sin_table", sin_table, (cos_table.shape[0], head_dim))):
            if t.dtype != _F32 or tuple(t.shape) != shape or t.device.type != "cpu":
                raise ValueError(f"{name} must be float32 {list(shape)} on the CPU, got {t.dtype} {list(t.shape)}")
        self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter = hidden, heads, kv_heads, head_dim, inter
        self._keep: list[torch.Tensor] = []  # every buffer a pointer refers to
        keep = lambda t: cpu_decoder.keep_pointer(t, self._keep)  # noqa: E731
        self._block = cpu_decoder.c_block(block, self._keep)
        self._ts = cpu_decoder._TwoStream(keep(norm_a), keep(final_norm), eps_a, final_eps, int(bool(norm_before_residual)),
                                          keep(embed), keep(cos_table), keep(sin_table), embed.shape[0], cos_table.shape[0])
        self._model = cpu_decoder.c_model(hidden, heads, kv_heads, head_dim, inter, scale)
        self._model_ptr, self._block_ptr, self._ts_ptr = (ctypes.pointer(self._model), ctypes.pointer(self._block),
                                                          ctypes.pointer(self._ts))
        lib = cpu_decoder._library()
        self._run, self._work_size = lib.ls_two_stream_layer, lib.ls_two_stream_work
        self._local = threading.local()

    def _work(self, slots: int) -> torch.Tensor:
        cached = getattr(self._local, "work", None)
        if cached is None or cached[0] < slots:
            cached = self._local.work = (slots, torch.empty(int(self._work_size(self._model_ptr, slots)), dtype=_F32))
        return cached[1]

    def run(self, ids: torch.Tensor, positions: torch.Tensor, g: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            cols: int, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer over ``q`` new tokens (module docstring): writes their keys and values
        into ``k``/``v`` at columns ``cols ..`` and returns ``(h, out)``, each ``[B, q, Hd]``."""
        B, q = ids.shape
        D, G = self.head_dim, self.kv_heads
        if ids.dtype != torch.int64 or positions.dtype != torch.int64 or positions.shape != ids.shape:
            raise ValueError(f"ids and positions must be int64 [B, q]; got {ids.dtype} {list(ids.shape)}, "
                             f"{positions.dtype} {list(positions.shape)}")
        if g.dtype != _F32 or g.shape != (B, q, self.hidden):
            raise ValueError(f"g must be float32 [{B}, {q}, {self.hidden}], got {g.dtype} {list(g.shape)}")
        for name, t in (("k", k), ("v", v)):
            s = t.stride()
            if (t.dtype != _F32 or t.dim() != 4 or t.shape[0] != B or t.shape[1] != G or t.shape[3] != D
                    or s[3] != 1 or s[2] != D or s[0] != G * s[1] or t.shape[2] < cols + q):
                raise ValueError(f"{name} must be a float32 slab view [{B}, {G}, >= {cols + q}, {D}] with "
                                 f"columns {D} floats apart, got {list(t.shape)} strides {list(s)}")
        cap = k.stride(1) // D
        if v.stride(1) != k.stride(1):
            raise ValueError("k and v slabs differ in capacity")
        if mask is not None:
            if mask.dtype != torch.bool or mask.numel() != B * q * (cols + q) or mask.shape[-1] != cols + q:
                raise ValueError(f"mask must be bool [B, q, cols + q] = [{B}, {q}, {cols + q}], got "
                                 f"{mask.dtype} {list(mask.shape)}")
            mask = mask.contiguous()
        ids, positions, g = ids.contiguous(), positions.contiguous(), g.contiguous()
        h = torch.empty(B, q, self.hidden, dtype=_F32)
        out = torch.empty(B, q, self.hidden, dtype=_F32)
        rc = self._run(self._model_ptr, self._block_ptr, self._ts_ptr, B, q, ids.data_ptr(), positions.data_ptr(),
                       g.data_ptr(), cols, cap, k.data_ptr(), v.data_ptr(),
                       None if mask is None else mask.data_ptr(), h.data_ptr(), out.data_ptr(),
                       self._work(B * q).data_ptr(), torch.get_num_threads())
        if rc:
            raise (MemoryError if rc == 1 else IndexError)(f"cpu two-stream layer: {_ERRORS.get(rc, rc)}")
        return h, out


def two_stream_layer_ref(block: BlockWeights, heads: int, kv_heads: int, head_dim: int, scale: float,
                         norm_a: torch.Tensor, eps_a: float, final_norm: torch.Tensor, final_eps: float,
                         norm_before_residual: bool, embed: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, g: torch.Tensor,
                         k: torch.Tensor, v: torch.Tensor, cols: int, mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of ``TwoStreamLayer.run`` (same arguments): writes the keys and
    values into ``k``/``v`` and returns ``(h, out)``."""
    B, q = ids.shape
    H, G, D = heads, kv_heads, head_dim
    x = torch.cat([cpu_norm_rope.rms_norm_ref(embed[ids], norm_a, eps_a),
                   cpu_norm_rope.rms_norm_ref(g, block.norm1, block.eps1)], -1)
    h = x[..., g.shape[-1]:] if norm_before_residual else g
    qkv = cpu_linear.packed_linear_ref(x, block.qkv, block.qkv_bias).view(B, q, H + 2 * G, D)
    cos, sin = cos_table[positions], sin_table[positions]
    qk = cpu_norm_rope.rotary_ref(qkv[:, :, : H + G].transpose(1, 2), cos, sin)  # [B, H+G, q, D]
    k[:, :, cols : cols + q] = qk[:, H:]
    v[:, :, cols : cols + q] = qkv[:, :, H + G :].transpose(1, 2)
    C = cols + q
    if mask is None:
        mask = torch.ones(q, C, dtype=torch.bool).tril(C - q)[None].expand(B, q, C)
    o = cpu_attention.attention_ref(qk[:, :H], k[:, :, :C], v[:, :, :C], mask.reshape(B, 1, q, C), scale)
    h = h + cpu_linear.packed_linear_ref(o.reshape(B, q, H * D), block.o, block.o_bias)
    gate_up = cpu_linear.packed_linear_ref(cpu_norm_rope.rms_norm_ref(h, block.norm2, block.eps2), block.gate_up,
                                           block.gate_up_bias)
    h = h + cpu_linear.packed_linear_ref(cpu_decoder.activation(gate_up), block.down, block.down_bias)
    return h, cpu_norm_rope.rms_norm_ref(h, final_norm, final_eps)
