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

    _TL_DTYPES = {
        torch.float32: tl.float32,
        torch.bfloat16: tl.bfloat16,
        torch.float16: tl.float16,
        torch.int8: tl.int8,
        torch.uint8: tl.uint8,
    }

    @triton.jit
    def _compact_kv_kernel(
        c_ptr,  # cache viewed as [B, H, T, D] (unused with FROM_TABLE)
        table_ptr,  # FROM_TABLE: [L] int64 data pointers of L caches with identical layout
        s_b,
        s_h,
        s_t,
        s_d,
        keep_ptr,
        s_kb,  # keep_idx [B, M]
        dst_ptr,  # [B] int64
        BH,
        H,
        M,
        D,
        MP: tl.constexpr,
        BLOCK_D: tl.constexpr,
        FROM_TABLE: tl.constexpr,
        ELEM: tl.constexpr,  # element type of the cached tensors (FROM_TABLE)
    ):
        pid = tl.program_id(0)
        rem = pid % BH
        b = (rem // H).to(tl.int64)
        h = (rem % H).to(tl.int64)
        if FROM_TABLE:
            layer_ptr = tl.load(table_ptr + pid // BH).to(tl.pointer_type(ELEM))
        else:
            layer_ptr = c_ptr
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        j = tl.arange(0, MP)
        src = tl.load(keep_ptr + b * s_kb + j, mask=j < M, other=-1)
        ok = src >= 0
        dst = tl.load(dst_ptr + b) + j
        base = layer_ptr + b * s_b + h * s_h
        m2 = ok[:, None] & (d[None, :] < D)
        vals = tl.load(base + tl.maximum(src, 0)[:, None] * s_t + d[None, :] * s_d, mask=m2, other=0)
        tl.debug_barrier()  # every gather of the block before any scatter (overlapping ranges)
        tl.store(base + dst[:, None] * s_t + d[None, :] * s_d, vals, mask=m2)


def _launch(views, keep_idx, dst, table=None):
    """One launch over every (cache, row, head, D slab); ``views`` share one layout."""
    B, H, T, D = views[0].shape
    M = keep_idx.shape[1]
    if B == 0 or H == 0 or M == 0 or D == 0:
        return
    keep_idx = keep_idx.contiguous()
    dst = dst.contiguous()
    MP = next_pow2(M)
    block_d = max(16, min(next_pow2(D), 8192 // MP))
    L = len(views)
    _compact_kv_kernel[(L * B * H, triton.cdiv(D, block_d))](
        views[0] if table is None else table,
        table if table is not None else keep_idx,
        *views[0].stride(),
        keep_idx,
        keep_idx.stride(0),
        dst,
        B * H,
        H,
        M,
        D,
        MP=MP,
        BLOCK_D=block_d,
        FROM_TABLE=table is not None,
        ELEM=_TL_DTYPES[views[0].dtype],
        num_warps=4 if views[0].is_cuda else 1,
    )


def compact_kv_triton(cache, keep_idx, dst_start, seq_dim: int = 2) -> torch.Tensor:
    """Triton implementation of :func:`compact_kv` (no dispatch, no index checks)."""
    view, dst = _prepare(cache, keep_idx, dst_start, seq_dim)
    _launch([view], keep_idx, dst)
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


def _prepare_layers(caches, keep_idx, dst_start, seq_dim):
    if not isinstance(caches, (list, tuple)) or len(caches) == 0:
        raise ValueError(f"caches: got {type(caches).__name__}; expected a non-empty list of [B, H, T, D] tensors")
    views, dst = [], None
    for i, c in enumerate(caches):
        try:
            v, dst = _prepare(c, keep_idx, dst_start, seq_dim)
        except ValueError as exc:
            raise ValueError(f"caches[{i}]: {exc}") from None
        if views and (
            v.shape != views[0].shape
            or v.stride() != views[0].stride()
            or v.dtype != views[0].dtype
            or v.device != views[0].device
        ):
            raise ValueError(
                f"caches[{i}]: got shape {tuple(c.shape)}, strides {c.stride()}, dtype {c.dtype}, device {c.device}; "
                f"expected the same layout as caches[0] ({tuple(caches[0].shape)}, {caches[0].stride()}, "
                f"{caches[0].dtype}, {caches[0].device})"
            )
        views.append(v)
    return views, dst


_TABLES: dict[tuple, torch.Tensor] = {}


def _pointer_table(views) -> torch.Tensor:
    """Device int64 tensor of the caches' data pointers, cached by address.

    Caches are long-lived, so the table is normally built once; building it goes through
    pinned memory with a non-blocking copy so that no call synchronises the host.
    """
    dev = views[0].device
    key = (str(dev), tuple(v.data_ptr() for v in views))
    table = _TABLES.get(key)
    if table is None:
        host = torch.tensor(key[1], dtype=torch.int64)
        if dev.type == "cuda":
            table = host.pin_memory().to(dev, non_blocking=True)
        else:
            table = host.to(dev)
        if len(_TABLES) >= 16:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = table
    return table


def compact_kv_layers_ref(caches, keep_idx, dst_start, seq_dim: int = 2) -> list[torch.Tensor]:
    """PyTorch reference of :func:`compact_kv_layers`."""
    _prepare_layers(caches, keep_idx, dst_start, seq_dim)
    return [compact_kv_ref(c, keep_idx, dst_start, seq_dim) for c in caches]


def compact_kv_layers_triton(caches, keep_idx, dst_start, seq_dim: int = 2) -> list[torch.Tensor]:
    """Triton implementation of :func:`compact_kv_layers`: one launch for all caches."""
    views, dst = _prepare_layers(caches, keep_idx, dst_start, seq_dim)
    _launch(views, keep_idx, dst, _pointer_table(views))
    return list(caches)


def compact_kv_layers(
    caches: list[torch.Tensor],  # L tensors [B, H, T, D] (or [B, T, H, D], seq_dim=1), same layout; in place
    keep_idx: torch.Tensor,  # [B, M] int64 source positions, -1 = skip (shared by all caches)
    dst_start: torch.Tensor | int,  # [B] int64 or int
    seq_dim: int = 2,
) -> list[torch.Tensor]:
    """:func:`compact_kv` applied to many caches (e.g. K and V of every layer) in one launch.

    The Triton kernel reads the caches' addresses from a device table, so the cost is
    one launch instead of 2 x layers.  Dispatch as for :func:`compact_kv`.
    """
    _prepare_layers(caches, keep_idx, dst_start, seq_dim)
    extra = dst_start if isinstance(dst_start, torch.Tensor) else None
    if backend_for(*caches, keep_idx, extra) == "triton":
        return compact_kv_layers_triton(caches, keep_idx, dst_start, seq_dim)
    return compact_kv_layers_ref(caches, keep_idx, dst_start, seq_dim)
