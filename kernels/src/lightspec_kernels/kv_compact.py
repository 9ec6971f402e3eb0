"""Kernel 4: in-place KV-cache compaction.

For every row b and every slot j with ``keep_idx[b, j] >= 0``::

    cache[b, :, dst_start[b] + j, :] = cache[b, :, keep_idx[b, j], :]     (layout [B, H, T, D])

with gather-then-scatter semantics: every source entry is read before any destination
is written, so sources and destinations may overlap arbitrarily (e.g. moving an accepted
tree path ``[p+3, p+5, p+9]`` to ``[p+1, p+2, p+3]``).  Slots with ``keep_idx == -1``
write nothing.  ``seq_dim=1`` handles the ``[B, T, H, D]`` layout.  Indices must lie in
``[0, T)`` (the reference raises on a bad index; the kernel does not check, to avoid
a host sync).  Two destinations of one row never collide because ``dst_start[b] + j``
is distinct per j.

Triton: one program per (row, head, column slab of D) holds all M kept entries of its
slab in registers, with a block barrier between the gather and the scatter.
"""

from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, HAS_TRITON, backend_for, check_tensor, next_pow2

KV_DTYPES = FLOAT_DTYPES + (torch.int8, torch.uint8)


def _prepare(cache, keep_idx, dst_start, seq_dim):
    if seq_dim not in (1, 2):
        raise ValueError(f"seq_dim: got {seq_dim!r}; expected 2 for [B, H, T, D] (HF) or 1 for [B, T, H, D]")
    check_tensor("cache", cache, ndim=4, dtypes=KV_DTYPES, expect="(cache [B, H, T, D] or [B, T, H, D])")
    view = cache if seq_dim == 2 else cache.transpose(1, 2)  # [B, H, T, D] view
    B = view.shape[0]
    check_tensor(
        "keep_idx",
        keep_idx,
        shape=(B, None),
        dtypes=(torch.int64,),
        device=cache.device,
        expect="(keep_idx [B, M], -1 padded)",
    )
    if isinstance(dst_start, int) and not isinstance(dst_start, bool):
        if dst_start < 0:
            raise ValueError(f"dst_start: got {dst_start}; expected >= 0")
        dst = torch.full((B,), dst_start, dtype=torch.long, device=cache.device)
    else:
        check_tensor(
            "dst_start",
            dst_start,
            shape=(B,),
            dtypes=(torch.int64,),
            device=cache.device,
            expect="(dst_start [B] int64, or a python int)",
        )
        dst = dst_start
    return view, dst


def compact_kv_ref(
    cache: torch.Tensor,  # [B, H, T, D] (seq_dim=2) or [B, T, H, D] (seq_dim=1); modified in place
    keep_idx: torch.Tensor,  # [B, M] int64 source positions, -1 = skip
    dst_start: torch.Tensor | int,  # [B] int64 or int: destination of slot 0
    seq_dim: int = 2,
) -> torch.Tensor:
    """PyTorch reference; returns ``cache``."""
    view, dst = _prepare(cache, keep_idx, dst_start, seq_dim)
    B, M = keep_idx.shape
    if M == 0 or B == 0:
        return cache
    T = view.shape[2]
    valid = keep_idx >= 0
    dst_all = dst[:, None] + torch.arange(M, device=cache.device)[None, :]
    src = keep_idx[valid]
    dpos = dst_all[valid]
    if src.numel() and (int(src.max()) >= T or int(dpos.max()) >= T):
        raise ValueError(f"keep_idx/dst_start: positions must be < T={T}")
    rows = torch.arange(B, device=cache.device)[:, None].expand(B, M)[valid]
    vals = view[rows, :, src, :]  # [n, H, D] copy (gather before scatter)
    view[rows, :, dpos, :] = vals
    return cache


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _compact_kv_kernel(
        c_ptr,
        s_b,
        s_h,
        s_t,
        s_d,  # cache viewed as [B, H, T, D]
        keep_ptr,
        s_kb,  # keep_idx [B, M]
        dst_ptr,  # [B] int64
        H,
        M,
        D,
        MP: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        j = tl.arange(0, MP)
        src = tl.load(keep_ptr + b * s_kb + j, mask=j < M, other=-1)
        ok = src >= 0
        dst = tl.load(dst_ptr + b) + j
        base = c_ptr + b * s_b + h * s_h
        m2 = ok[:, None] & (d[None, :] < D)
        vals = tl.load(base + tl.maximum(src, 0)[:, None] * s_t + d[None, :] * s_d, mask=m2, other=0)
        tl.debug_barrier()  # every gather of the block before any scatter (overlapping ranges)
        tl.store(base + dst[:, None] * s_t + d[None, :] * s_d, vals, mask=m2)


def compact_kv_triton(cache, keep_idx, dst_start, seq_dim: int = 2) -> torch.Tensor:
    """Triton implementation of :func:`compact_kv` (no dispatch, no index checks)."""
    view, dst = _prepare(cache, keep_idx, dst_start, seq_dim)
    B, H, T, D = view.shape
    M = keep_idx.shape[1]
    if B == 0 or H == 0 or M == 0 or D == 0:
        return cache
    keep_idx = keep_idx.contiguous()
    dst = dst.contiguous()
    MP = next_pow2(M)
    block_d = max(16, min(next_pow2(D), 8192 // MP))
    _compact_kv_kernel[(B * H, triton.cdiv(D, block_d))](
        view,
        *view.stride(),
        keep_idx,
        keep_idx.stride(0),
        dst,
        H,
        M,
        D,
        MP=MP,
        BLOCK_D=block_d,
        num_warps=4 if cache.is_cuda else 1,
    )
    return cache


def compact_kv(
    cache: torch.Tensor,  # [B, H, T, D] (seq_dim=2, HF layout) or [B, T, H, D] (seq_dim=1); in place
    keep_idx: torch.Tensor,  # [B, M] int64 source positions along T, -1 = skip
    dst_start: torch.Tensor | int,  # [B] int64 or int: destination position of slot 0
    seq_dim: int = 2,
) -> torch.Tensor:
    """Move kept KV entries to ``dst_start + j`` in place; returns ``cache``.

    Dispatch: Triton on CUDA tensors, the PyTorch reference elsewhere
    (``LIGHTSPEC_KERNELS=torch|triton`` forces one).
    """
    _prepare(cache, keep_idx, dst_start, seq_dim)
    extra = dst_start if isinstance(dst_start, torch.Tensor) else None
    if backend_for(cache, keep_idx, extra) == "triton":
        return compact_kv_triton(cache, keep_idx, dst_start, seq_dim)
    return compact_kv_ref(cache, keep_idx, dst_start, seq_dim)
