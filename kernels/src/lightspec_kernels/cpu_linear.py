"""A CPU kernel for ``y = x @ W.T + b`` at the row counts of decoding, with W packed once.

Why: at batch 1, a decode step and a verify over a few tokens multiply 1-16 rows by every
weight of the model.  On the CPU the BLAS is slow at that shape: it re-packs the weight
on every call and reads it at a fraction of the memory bandwidth (on the 2-core VM, the zoo
target's projections: 4.0 ms per token-step through ``torch.mm`` at one thread).  This
kernel (``cpu_linear.c``) keeps each weight packed as column blocks ``[N/16, K, 16]``,
in float16 when every value is exactly a float16 (a model stored in float16; the products
do not change), and streams it once per call for up to 8 rows at a time (1.3 ms for the
same step, 2.0 ms for four rows).

Numerics: each output is one fused multiply-add chain over ``k = 0..K-1``, then ``+ b``.
A row's result therefore does not depend on the other rows computed with it: a verify
over q tokens reproduces a one-token step bit for bit.  It differs from ``torch.mm`` only
in the order of the summation (|diff| ~ 1e-6 relative).

The C source is compiled on first use with the system C compiler (``_cpu_build``: x86-64
with AVX2+F16C+FMA or AVX-512, cached per machine).  Where that fails (no compiler,
another architecture), ``available()`` is False, ``reason()`` says why, and
``packed_linear`` runs its PyTorch reference.  ``LIGHTSPEC_KERNELS=torch``
forces the reference; ``LIGHTSPEC_CPU_KERNEL=0`` disables the kernel altogether.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import _cpu_build

_SOURCE = Path(__file__).with_name("cpu_linear.c")
_configured = False

BLOCK = 16  # outputs per packed column block


@dataclass(frozen=True)
class PackedWeight:
    """A weight ``[N, K]`` packed for the kernel.

    ``data``: ``[ceil(N/16), K, 16]`` float16 or float32; block b holds outputs
    ``16b..16b+15`` for every input k, the last block zero-padded.  ``out_features`` = N,
    ``in_features`` = K."""

    data: torch.Tensor
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def unpack(self) -> torch.Tensor:
        """The weight ``[N, K]`` in float32 (the values that were packed)."""
        nb, k, _ = self.data.shape
        return self.data.float().permute(0, 2, 1).reshape(nb * BLOCK, k)[: self.out_features]


def pack(weight: torch.Tensor, half: bool | None = None) -> PackedWeight:
    """Pack a float32 ``weight [N, K]`` (any strides).

    ``half``: store float16 (``None``: exactly when every value is a float16 value, so the
    products do not change; ``True`` insists and raises otherwise; ``False``: float32)."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(weight.shape)}")
    if weight.dtype != torch.float32:
        raise ValueError(f"weight dtype {weight.dtype} is not supported: pack float32 weights")
    if weight.device.type != "cpu":
        raise ValueError(f"weight is on {weight.device}: the packed kernel is for CPU tensors")
    w = weight.detach()
    exact_half = bool(torch.equal(w.half().float(), w))
    if half and not exact_half:
        raise ValueError("half=True needs a weight whose values are all float16 values (this one's are not)")
    use_half = exact_half if half is None else half
    n, k = w.shape
    nb = -(-n // BLOCK)
    padded = w.new_zeros(nb * BLOCK, k)
    padded[:n] = w
    data = padded.view(nb, BLOCK, k).transpose(1, 2).contiguous()
    if use_half:
        data = data.half()
    return PackedWeight(data, n, k)


def cat(parts: list[PackedWeight]) -> PackedWeight:
    """One packed weight for ``torch.cat([p.unpack() for p in parts])`` (the outputs side by
    side), by concatenating the blocks: every part but the last must have N % 16 == 0 and
    all must share K and the storage dtype.  Its products equal the parts' bit for bit."""
    if not parts:
        raise ValueError("cat needs at least one packed weight")
    k, dtype = parts[0].in_features, parts[0].data.dtype
    for p in parts:
        if p.in_features != k or p.data.dtype != dtype:
            raise ValueError("cat needs packed weights with the same in_features and storage dtype")
    for p in parts[:-1]:
        if p.out_features % BLOCK:
            raise ValueError(f"cat: out_features {p.out_features} is not a multiple of {BLOCK}")
    data = torch.cat([p.data for p in parts])
    return PackedWeight(data, sum(p.out_features for p in parts), k)


def adjacent(parts: list[PackedWeight]) -> PackedWeight | None:
    """``cat(parts)`` as a view, without copying, when the parts lie side by side in one
    buffer (as ``lightspec_core``'s packing lays out q/k/v and gate/up); ``None`` otherwise."""
    if not parts:
        return None
    first = parts[0].data
    k, dtype = parts[0].in_features, first.dtype
    for a, b in zip(parts, parts[1:]):
        if a.out_features % BLOCK or b.in_features != k or b.data.dtype != dtype:
            return None
        if not (a.data.is_contiguous() and b.data.is_contiguous()):
            return None
        if a.data.data_ptr() + a.data.numel() * a.data.element_size() != b.data.data_ptr():
            return None
    if not parts[-1].data.is_contiguous():
        return None
    blocks = sum(p.data.shape[0] for p in parts)
    view = torch.as_strided(first, (blocks, k, BLOCK), first.stride(), first.storage_offset())
    return PackedWeight(view, sum(p.out_features for p in parts), k)


def _library() -> ctypes.CDLL | None:
    global _configured
    lib, _ = _cpu_build.library(_SOURCE)
    if lib is not None and not _configured:
        args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        for fn in (lib.ls_linear_f16, lib.ls_linear_f32):
            fn.argtypes = args
            fn.restype = None
        for fn in (lib.ls_linear_argmax_f16, lib.ls_linear_argmax_f32):
            fn.argtypes = args[:-1] + [ctypes.c_void_p, ctypes.c_int]
            fn.restype = ctypes.c_int
        _configured = True
    return lib


def available() -> bool:
    """True when the compiled kernel can run here (it is built on the first call)."""
    return _library() is not None


def reason() -> str | None:
    """Why the kernel is not available (``None`` when it is)."""
    return _cpu_build.library(_SOURCE)[1]


def isa() -> str:
    """The instruction set the kernel was compiled for: ``avx512``, ``avx2`` or ``none``."""
    lib = _library()
    return {2: "avx512", 1: "avx2"}.get(lib.ls_isa(), "none") if lib is not None else "none"


def _check(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> None:
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {packed.in_features}")
    if bias is not None and bias.shape != (packed.out_features,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({packed.out_features},)")


def packed_linear_ref(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference: ``x [..., K] @ W.T + bias`` → ``[..., N]`` with the packed values."""
    _check(x, packed, bias)
    w = packed.unpack().to(x.device)
    return F.linear(x, w.to(x.dtype), None if bias is None else bias.to(x.dtype))


def packed_linear_cpu(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The compiled kernel (no dispatch): ``x [..., K]`` float32 on the CPU → ``[..., N]``."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the CPU linear kernel is not available: {reason()}")
    _check(x, packed, bias)
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x must be float32 on the CPU, got {x.dtype} on {x.device}")
    return _kernel(lib, packed, bias)(x)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ W.T + bias`` → ``[..., N]``: the compiled kernel for float32 CPU input
    when it is available and not overridden (``LIGHTSPEC_KERNELS=torch``), else the reference."""
    if (x.dtype == torch.float32 and x.device.type == "cpu" and os.environ.get("LIGHTSPEC_KERNELS") != "torch"
            and _library() is not None):
        return packed_linear_cpu(x, packed, bias)
    return packed_linear_ref(x, packed, bias)


def bind(packed: PackedWeight, bias: torch.Tensor | None = None):
    """``f(x) = packed_linear(x, packed, bias)`` with the checks and look-ups done once, for
    a decoding loop that calls it 50 times per step: ``x [..., K]`` must be float32 on the
    CPU (what the loop of a float32 CPU model passes).  Without the kernel (or with
    ``LIGHTSPEC_KERNELS=torch``) it is the reference."""
    if bias is not None and bias.shape != (packed.out_features,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({packed.out_features},)")
    lib = _library()
    if lib is None or os.environ.get("LIGHTSPEC_KERNELS") == "torch":
        return lambda x: packed_linear_ref(x, packed, bias)
    return _kernel(lib, packed, bias)


def _kernel(lib, packed: PackedWeight, bias: torch.Tensor | None):
    """The compiled kernel as ``f(x)`` for ``packed`` (no dispatch, no argument checks)."""
    fn = lib.ls_linear_f16 if packed.data.dtype == torch.float16 else lib.ls_linear_f32
    k, n = packed.in_features, packed.out_features
    data = packed.data
    b = None if bias is None else bias.detach().float().contiguous()
    wptr, bptr = data.data_ptr(), None if b is None else b.data_ptr()
    empty, f32, threads = torch.empty, torch.float32, torch.get_num_threads

    def linear(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        m = x2.shape[0]
        y = empty(m, n, dtype=f32)
        if m:
            fn(x2.data_ptr(), m, k, k, wptr, n, bptr, y.data_ptr(), n, threads() if m > 8 else 1)
        return y.view(*x.shape[:-1], n)

    arg_fn = lib.ls_linear_argmax_f16 if packed.data.dtype == torch.float16 else lib.ls_linear_argmax_f32
    i64 = torch.int64

    def linear_argmax(x: torch.Tensor) -> torch.Tensor:
        """The argmax over the outputs of ``linear(x)``: ``x [..., K]`` → int64 ``[...]``."""
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        m = x2.shape[0]
        idx = empty(m, dtype=i64)
        if m:
            y = empty(m, n, dtype=f32)
            if arg_fn(x2.data_ptr(), m, k, k, wptr, n, bptr, y.data_ptr(), n, idx.data_ptr(), threads() if m > 8 else 1):
                raise MemoryError("the fused argmax could not allocate its per-strip results")
        return idx.view(x.shape[:-1])

    linear.packed, linear.bias = data, b  # keep the buffers alive as long as the closure
    linear.argmax = linear_argmax
    return linear


def linear_argmax_ref(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference of a bound kernel's ``argmax``: ``packed_linear_ref(x).argmax(-1)``."""
    return packed_linear_ref(x, packed, bias).argmax(dim=-1)
