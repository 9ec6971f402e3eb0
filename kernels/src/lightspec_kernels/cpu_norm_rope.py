"""Fused RMSNorm (with an optional residual add) and rotary embedding for the CPU (float32).

Why: at batch 1 a small model's decode step is as much PyTorch op dispatch as arithmetic.
An RMSNorm written as HF writes it is eight tensor ops (~3 us each on the 2-core VM) for a
few hundred numbers; HF's rotary embedding is seven per tensor.  ``cpu_norm_rope.c`` makes
each one call.

* ``rms_norm(x [..., H], weight [H], eps, residual=None)``: ``weight * (s / sqrt(mean(s^2)
  + eps))`` with ``s = x`` or ``s = x + residual``; returns ``y`` or ``(s, y)``.  It sums
  in its own fixed order, so it rounds differently from PyTorch's ``mean``: LightSpec
  installs it in the model's norm modules (``lightspec_core.cpu_norm``) so that every
  forward runs it.
* ``rotary(x [B, N, Q, D], cos [B, Q, D], sin [B, Q, D])``: HF's ``x * cos +
  rotate_half(x) * sin`` → ``[B, N, Q, D]`` contiguous, rounded exactly as PyTorch's separate
  ops round it (no fused multiply-add), so it matches ``*_ref`` bit for bit.

Compiled on first use (``_cpu_build``); without it, or with ``LIGHTSPEC_KERNELS=torch``,
the PyTorch references run.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from . import _cpu_build

_SOURCE = Path(__file__).with_name("cpu_norm_rope.c")
_F32 = torch.float32
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_kernel = _cpu_build.Kernel(_SOURCE, {
    "ls_rms_norm": ([_PTR, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64, _PTR, ctypes.c_float, _PTR, _I64], None),
    "ls_rotary": ([_PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR], None),
})


def _library() -> ctypes.CDLL | None:
    return _kernel.get()


def available() -> bool:
    """True when the compiled kernels can run here (built on the first call)."""
    return _library() is not None


def reason() -> str | None:
    """Why the kernels are not available (``None`` when they are)."""
    return _cpu_build.library(_SOURCE)[1]


def _use_kernel(*tensors: torch.Tensor) -> bool:
    return (all(t.dtype == _F32 and t.device.type == "cpu" for t in tensors)
            and os.environ.get("LIGHTSPEC_KERNELS") != "torch" and _library() is not None)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """PyTorch reference of ``rms_norm`` (the same values up to summation order)."""
    s = x if residual is None else x + residual
    y = weight * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps))
    return y if residual is None else (s, y)


def _rows(t: torch.Tensor, H: int) -> torch.Tensor:
    t2 = t.reshape(-1, H)
    return t2 if t2.stride(1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``x [..., H]`` (+ ``residual``, same shape) → ``y`` (or ``(x + residual, y)``)."""
    H = x.shape[-1]
    if weight.shape != (H,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({H},) for inputs of {H} features")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}, x has {tuple(x.shape)}")
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if not _use_kernel(*tensors):
        return rms_norm_ref(x, weight, eps, residual)
    lib = _kernel.lib
    x2 = _rows(x, H)
    rows = x2.shape[0]
    y = torch.empty(x.shape, dtype=_F32)
    w = weight if weight.is_contiguous() else weight.contiguous()
    if residual is None:
        if rows:
            lib.ls_rms_norm(x2.data_ptr(), x2.stride(0), None, 0, None, 0, rows, H, w.data_ptr(), eps, y.data_ptr(), H)
        return y
    r2 = _rows(residual, H)
    s = torch.empty(x.shape, dtype=_F32)
    if rows:
        lib.ls_rms_norm(x2.data_ptr(), x2.stride(0), r2.data_ptr(), r2.stride(0), s.data_ptr(), H, rows, H,
                        w.data_ptr(), eps, y.data_ptr(), H)
    return s, y


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """PyTorch reference of ``rotary``: HF's ``apply_rotary_pos_emb`` for one tensor."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, N, Q, D]`` (any strides), ``cos, sin [B or 1, Q, D]`` → ``[B, N, Q, D]``, as
    ``rotary_ref`` bit for bit."""
    lib = _kernel.get()
    if (lib is not None and x.dim() == 4 and x.dtype is _F32 and cos.dtype is _F32 and sin.dtype is _F32
            and x.device.type == "cpu" and cos.device.type == "cpu" and sin.device.type == "cpu"
            and cos.dim() == 3 and cos.shape == sin.shape and os.environ.get("LIGHTSPEC_KERNELS") != "torch"):
        B, N, Q, D = x.shape
        if cos.shape[1] == Q and cos.shape[2] == D and cos.shape[0] in (1, B) and not D % 2:
            if x.stride(3) != 1:
                x = x.contiguous()
            if cos.stride(2) != 1 or sin.stride() != cos.stride():
                cos, sin = cos.contiguous(), sin.contiguous()
            out = torch.empty(B, N, Q, D, dtype=_F32)
            if B and N and Q:
                xs, cs = x.stride(), cos.stride()
                lib.ls_rotary(x.data_ptr(), B, N, Q, D, xs[0], xs[1], xs[2], cos.data_ptr(), sin.data_ptr(),
                              cs[0] if cos.shape[0] == B else 0, cs[1], out.data_ptr())
            return out
    if x.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        raise ValueError(f"rotary needs x [B, N, Q, D] and cos, sin [B, Q, D]; got {tuple(x.shape)}, "
                         f"{tuple(cos.shape)}, {tuple(sin.shape)}")
    B, N, Q, D = x.shape
    if cos.shape[1:] != (Q, D) or cos.shape[0] not in (1, B) or D % 2:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not fit x of shape {tuple(x.shape)} (D even)")
    return rotary_ref(x, cos, sin)


def bind_rms_norm(weight: torch.Tensor, eps: float):
    """``f(x, residual=None)`` = ``rms_norm(x, weight, eps, residual)`` with the checks and
    look-ups done once, for a decoding loop (x float32 on the CPU, last dim ``H``)."""
    H = weight.shape[0]
    if weight.dim() != 1:
        raise ValueError(f"weight must be 1-D [H], got shape {tuple(weight.shape)}")
    if not _use_kernel(weight):
        return lambda x, residual=None: rms_norm_ref(x, weight, eps, residual)
    fn, w = _kernel.lib.ls_rms_norm, weight.detach().contiguous()
    wptr, empty, f32 = w.data_ptr(), torch.empty, _F32

    def norm(x: torch.Tensor, residual: torch.Tensor | None = None):
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.numel() // H
        y = empty(x.shape, dtype=f32)
        if residual is None:
            fn(x.data_ptr(), H, None, 0, None, 0, rows, H, wptr, eps, y.data_ptr(), H)
            return y
        if not residual.is_contiguous():
            residual = residual.contiguous()
        s = empty(x.shape, dtype=f32)
        fn(x.data_ptr(), H, residual.data_ptr(), H, s.data_ptr(), H, rows, H, wptr, eps, y.data_ptr(), H)
        return s, y

    norm.weight = w  # keep the buffer alive with the closure
    return norm
