"""Kernel 5: tree attention mask and depth-based position ids from parent indices.

``parents [B, N]`` follows the tree convention of :mod:`lightspec_kernels.tree`
(node 0 = root with parent -1, ``parents[b, j] < j``, -1 for j >= 1 marks padding).
The N tree nodes are appended after ``prefix_len`` cached tokens:

* ``mask [B, 1, N, prefix_len + N]``: query node i may attend to every prefix position
  and to tree node k iff k is i or an ancestor of i.  ``dtype=torch.bool``: True =
  attend; a float dtype: 0 = attend, ``torch.finfo(dtype).min`` = blocked (the additive
  4D mask HF models accept).  Padding nodes see the prefix and themselves only.
* ``position_ids [B, N] int64`` = ``prefix_len + depth`` (root depth 0, padding depth 0).
"""

from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, HAS_TRITON, backend_for, check_tensor, next_pow2

MASK_DTYPES = (torch.bool,) + FLOAT_DTYPES


def _check(parents, prefix_len, dtype) -> None:
    check_tensor("parents", parents, ndim=2, dtypes=(torch.int64,), expect="(parents [B, N])")
    if not (isinstance(prefix_len, int) and not isinstance(prefix_len, bool) and prefix_len >= 0):
        raise ValueError(f"prefix_len: got {prefix_len!r}; expected an int >= 0")
    if dtype not in MASK_DTYPES:
        raise ValueError(
            f"dtype: got {dtype}; expected one of torch.bool, torch.float32, torch.bfloat16, torch.float16"
        )


def tree_attention_mask_ref(
    parents: torch.Tensor,  # [B, N] int64
    prefix_len: int,
    dtype: torch.dtype = torch.bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference; returns ``(mask [B, 1, N, prefix_len+N], position_ids [B, N])``."""
    _check(parents, prefix_len, dtype)
    B, N = parents.shape
    dev = parents.device
    nodes = torch.arange(N, device=dev)
    anc = (nodes[:, None] == nodes[None, :]).expand(B, N, N).clone()  # [B, N(query), N(key)]
    cur = nodes[None, :].expand(B, N).clone()
    depth = torch.zeros((B, N), dtype=torch.long, device=dev)
    for _ in range(max(N - 1, 0)):
        cur = torch.where(cur >= 0, parents.gather(1, cur.clamp(min=0)), -1)
        depth += (cur >= 0).long()
        anc |= cur[:, :, None] == nodes[None, None, :]
    allowed = torch.cat([torch.ones((B, N, prefix_len), dtype=torch.bool, device=dev), anc], dim=2)[:, None]
    if dtype == torch.bool:
        mask = allowed
    else:
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask, depth + prefix_len


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _tree_mask_kernel(
        par_ptr,
        s_pb,  # parents [B, N]
        mask_ptr,  # [B, 1, N, W] contiguous, W = prefix_len + N
        pos_ptr,  # [B, N] int64
        N,
        prefix_len,
        min_val,
        IS_BOOL: tl.constexpr,
        NP: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        c0 = tl.program_id(1) * BLOCK_C
        W = prefix_len + N
        i = tl.arange(0, NP)
        c = c0 + tl.arange(0, BLOCK_C)
        node = c - prefix_len  # key node index of tree columns (negative in the prefix)
        allowed = (c[None, :] < prefix_len) | (node[None, :] == i[:, None])
        if c0 + BLOCK_C > prefix_len:  # block reaches the tree columns: walk ancestors
            cur = tl.where(i < N, i, -1)
            depth = tl.zeros((NP,), tl.int64)
            for _ in range(0, N - 1):
                cur = tl.load(par_ptr + b * s_pb + cur, mask=cur >= 0, other=-1).to(tl.int32)
                depth += (cur >= 0).to(tl.int64)
                allowed = allowed | ((cur[:, None] == node[None, :]) & (cur[:, None] >= 0))
            if (c0 <= prefix_len) & (prefix_len < c0 + BLOCK_C):
                tl.store(pos_ptr + b * N + i, depth + prefix_len, mask=i < N)
        m2 = (i[:, None] < N) & (c[None, :] < W)
        ptrs = mask_ptr + b * N * W + i[:, None] * W + c[None, :]
        if IS_BOOL:
            tl.store(ptrs, allowed, mask=m2)
        else:
            val = tl.where(allowed, 0.0, min_val)
            tl.store(ptrs, val.to(mask_ptr.dtype.element_ty), mask=m2)


def tree_attention_mask_triton(parents, prefix_len: int, dtype: torch.dtype = torch.bool):
    """Triton implementation of :func:`tree_attention_mask` (no dispatch)."""
    _check(parents, prefix_len, dtype)
    B, N = parents.shape
    W = prefix_len + N
    dev = parents.device
    mask = torch.empty((B, 1, N, W), dtype=dtype, device=dev)
    pos = torch.empty((B, N), dtype=torch.long, device=dev)
    if B == 0 or N == 0:
        return mask, pos
    parents = parents.contiguous()
    NP = next_pow2(N)
    block_c = max(16, min(next_pow2(W), 8192 // NP))
    min_val = 0.0 if dtype == torch.bool else float(torch.finfo(dtype).min)
    _tree_mask_kernel[(B, triton.cdiv(W, block_c))](
        parents,
        parents.stride(0),
        mask,
        pos,
        N,
        prefix_len,
        min_val,
        IS_BOOL=dtype == torch.bool,
        NP=NP,
        BLOCK_C=block_c,
        num_warps=4 if dev.type == "cuda" else 1,
    )
    return mask, pos


def tree_attention_mask(
    parents: torch.Tensor,  # [B, N] int64 (node 0 = root, -1 = root/padding)
    prefix_len: int,  # tokens already in the KV cache before the tree
    dtype: torch.dtype = torch.bool,  # torch.bool or fp32/bf16/fp16 (additive mask)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(mask [B, 1, N, prefix_len + N], position_ids [B, N] int64)``.

    Dispatch: Triton on CUDA tensors, the PyTorch reference elsewhere
    (``LIGHTSPEC_KERNELS=torch|triton`` forces one).
    """
    _check(parents, prefix_len, dtype)
    if backend_for(parents) == "triton":
        return tree_attention_mask_triton(parents, prefix_len, dtype)
    return tree_attention_mask_ref(parents, prefix_len, dtype)
