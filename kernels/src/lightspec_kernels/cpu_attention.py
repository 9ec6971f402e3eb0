"""A CPU kernel for the attention of a few new tokens over a KV cache (float32).

Why: PyTorch's CPU ``scaled_dot_product_attention`` costs ~115 us per call for one query
token over 400 cached ones (6 heads of 64; the 2-core VM, 1 thread), a quarter of the zoo
target's decode step, for about 300k multiply-adds.  ``cpu_attention.c`` does the same
work directly (no blocking, no threads, no temporaries beyond one score row).

Semantics (``attention``; ``attention_ref`` is the same in PyTorch): for each batch row,
query head and query, softmax over the visible cache columns of ``q . k * scale`` (plus an
additive mask), times the values.  Query head h reads key/value head ``h // (H // H_kv)``.
Visible: where a bool mask is True; where an additive mask is above -inf; with no mask
and ``causal``, columns ``c <= i + C - Q`` for query i (the new tokens are the cache's
last Q columns); otherwise every column.  A query that sees nothing gets zeros.  The
result for one query does not depend on the batch, the other queries or the mask's form.

Compiled on first use like ``cpu_linear`` (``_cpu_build``); without it, ``attention``
runs ``attention_ref``.  ``LIGHTSPEC_KERNELS=torch`` forces the reference.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from . import _cpu_build

_SOURCE = Path(__file__).with_name("cpu_attention.c")
_F32 = torch.float32
_configured = False


def _library() -> ctypes.CDLL | None:
    global _configured
    if _configured:
        return _lib
    lib, _ = _cpu_build.library(_SOURCE)
    if lib is not None and not _configured:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.ls_attention.argtypes = [ptr, i64, i64, i64, i64, i64, i64, i64,  # q
                                     ptr, ptr, i64, i64, i64, i64, i64, i64, i64, i64,  # k, v
                                     ptr, ptr, i64, i64, i64, i64,  # masks
                                     ctypes.c_int, ctypes.c_float, ptr, ctypes.c_int]
        lib.ls_attention.restype = ctypes.c_int
        _set(lib)
    return lib


_lib: ctypes.CDLL | None = None


def _set(lib: ctypes.CDLL) -> None:
    global _lib, _configured
    _lib, _configured = lib, True


def available() -> bool:
    """True when the compiled kernel can run here (built on the first call)."""
    return _library() is not None


def reason() -> str | None:
    """Why the kernel is not available (``None`` when it is)."""
    return _cpu_build.library(_SOURCE)[1]


def _check(query, key, value, mask) -> None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query [B, H, Q, D], key and value [B, H_kv, C, D] must be 4-D")
    B, H, _, D = query.shape
    if key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in shape")
    if key.shape[0] != B or key.shape[3] != D:
        raise ValueError(f"key {tuple(key.shape)} does not fit query {tuple(query.shape)}")
    if key.shape[1] == 0 or H % key.shape[1]:
        raise ValueError(f"{H} query heads cannot share {key.shape[1]} key/value heads")
    if mask is not None:
        if mask.dim() != 4:
            raise ValueError(f"mask must be 4-D [B or 1, H or 1, Q, C], got shape {tuple(mask.shape)}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise ValueError(f"mask dtype {mask.dtype} is not supported: use bool or an additive float mask")


def _mask_view(mask: torch.Tensor, B: int, H: int, Q: int, C: int) -> torch.Tensor:
    if mask.shape[3] > C:
        mask = mask[..., :C]
    try:
        return mask.expand(B, H, Q, C)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to [{B}, {H}, {Q}, {C}]") from None


def attention_ref(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                  scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """PyTorch reference: ``query [B, H, Q, D]``, ``key/value [B, H_kv, C, D]`` → ``[B, Q, H, D]``."""
    _check(query, key, value, mask)
    B, H, Q, D = query.shape
    C = key.shape[2]
    scale = D**-0.5 if scale is None else scale
    rep = H // key.shape[1]
    k = key.repeat_interleave(rep, dim=1).float()
    v = value.repeat_interleave(rep, dim=1).float()
    s = (query.float() @ k.transpose(-1, -2)) * scale  # [B, H, Q, C]
    if mask is None:
        cols = torch.arange(C, device=query.device)
        limit = torch.arange(Q, device=query.device)[:, None] + C - Q
        visible = (cols[None, :] <= limit) if causal else torch.ones(Q, C, dtype=torch.bool, device=query.device)
        visible = visible.expand(B, H, Q, C)
    else:
        m = _mask_view(mask, B, H, Q, C)
        if m.dtype == torch.bool:
            visible = m
        else:
            visible = m > float("-inf")
            s = s + m.float()
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees nothing: zeros
    return (p @ v).transpose(1, 2).to(query.dtype)


def attention_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                  scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """The compiled kernel (no dispatch); float32 CPU tensors, any strides.  Kept lean:
    a decode step calls it once per layer."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the CPU attention kernel is not available: {reason()}")
    B, H, Q, D = query.shape
    kB, Hkv, C, kD = key.shape
    if (kB != B or kD != D or value.shape != key.shape or Hkv == 0 or H % Hkv or query.dtype != _F32
            or key.dtype != _F32 or value.dtype != _F32 or query.device.type != "cpu" or key.device.type != "cpu"
            or (mask is not None and mask.dim() != 4)):
        _check(query, key, value, mask)  # names the problem
        raise ValueError(f"query, key and value must be float32 on the CPU, got {query.dtype} on {query.device}, "
                         f"{key.dtype} on {key.device}, {value.dtype} on {value.device}")
    q = query if query.stride(3) == 1 else query.contiguous()
    k = key if key.stride(3) == 1 else key.contiguous()
    v = value if value.stride(3) == 1 else value.contiguous()
    bptr = fptr = None
    ms = (0, 0, 0, 0)
    if mask is not None:
        m = _mask_view(mask, B, H, Q, C)
        if m.dtype is torch.bool:
            bptr = m.data_ptr()
        else:
            if m.dtype != _F32:
                if not m.is_floating_point():
                    _check(query, key, value, mask)
                m = m.float()
            fptr = m.data_ptr()
        ms = m.stride()
    out = torch.empty(B, Q, H, D, dtype=_F32)
    if B and H and Q:
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        rc = lib.ls_attention(q.data_ptr(), B, H, Q, D, qs[0], qs[1], qs[2], k.data_ptr(), v.data_ptr(), Hkv, C,
                              ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], bptr, fptr, ms[0], ms[1], ms[2], ms[3],
                              1 if causal else 0, D**-0.5 if scale is None else scale, out.data_ptr(),
                              torch.get_num_threads() if Q > 16 else 1)
        if rc != 0:
            raise MemoryError(f"cpu attention could not allocate a score row of {C} floats")
    return out


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """``query [B, H, Q, D]`` over ``key, value [B, H_kv, C, D]`` → ``[B, Q, H, D]``: the
    compiled kernel for float32 CPU tensors when available (and not ``LIGHTSPEC_KERNELS=torch``),
    else the reference."""
    if (query.dtype == torch.float32 and query.device.type == "cpu" and key.dtype == torch.float32
            and os.environ.get("LIGHTSPEC_KERNELS") != "torch" and _library() is not None):
        return attention_cpu(query, key, value, mask, scale, causal)
    return attention_ref(query, key, value, mask, scale, causal)
