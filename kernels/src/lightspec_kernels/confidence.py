"""Kernel 1: confidence statistics of logits in one streaming pass.

For every row of ``logits [N, V]`` (fp32, bf16 or fp16) and ``z = logits.float() * (1 / temperature)``:

* ``max_prob [N] f32``  = max softmax(z)
* ``entropy  [N] f32``  = -sum softmax(z) * log softmax(z)   (0 * log 0 counts as 0)
* ``lse      [N] f32``  = logsumexp(z)
* ``topk_ids [N, k] int64`` the k largest logits, in descending order; ties go to the
  lower vocabulary index (selection uses the fp32-upcast logits, so it does not depend
  on the temperature)
* ``topk_probs [N, k] f32`` = softmax(z) at those ids

The Triton kernel keeps a running max, rescaled (per-lane) sums of exponentials and
of ``e * (z - max)`` (online softmax), plus a k-slot running top-k list that a block
only touches when its max beats the current k-th value, so no ``[N, V]`` probability
tensor is ever materialised and a block costs one cross-thread reduction.  Rows must contain at least one
finite logit.  ``top_k`` is 0 (no top-k) to 16.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import FLOAT_DTYPES, HAS_TRITON, backend_for, check_tensor, next_pow2, plan_splits

MAX_TOP_K = 16


class ConfidenceStats(NamedTuple):
    max_prob: torch.Tensor  # [N] float32
    entropy: torch.Tensor  # [N] float32
    lse: torch.Tensor  # [N] float32
    topk_ids: torch.Tensor  # [N, k] int64
    topk_probs: torch.Tensor  # [N, k] float32


def _check(logits: torch.Tensor, temperature: float, top_k: int) -> None:
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES, expect="(logits [N, V])")
    if not (isinstance(top_k, int) and 0 <= top_k <= MAX_TOP_K):
        raise ValueError(f"top_k: got {top_k!r}; expected an int in [0, {MAX_TOP_K}]")
    if top_k > logits.shape[1]:
        raise ValueError(f"top_k: got {top_k} for logits with vocabulary {logits.shape[1]}; expected top_k <= V")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature: got {temperature!r}; expected a float > 0")
    if logits.shape[1] == 0:
        raise ValueError(f"logits: got {tuple(logits.shape)}; expected a non-empty vocabulary")


def confidence_stats_ref(
    logits: torch.Tensor,  # [N, V] fp32/bf16/fp16
    temperature: float = 1.0,
    top_k: int = 0,  # 0..16
) -> ConfidenceStats:
    """PyTorch reference (materialises [N, V]; same semantics as the kernel)."""
    _check(logits, temperature, top_k)
    x = logits.float()
    z = x * (1.0 / temperature)
    lse = torch.logsumexp(z, dim=-1)
    logp = z - lse[:, None]
    p = logp.exp()
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)
    max_prob = (z.max(dim=-1).values - lse).exp()
    if top_k > 0:
        # stable descending sort: equal logits keep ascending index order
        ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :top_k]
        probs = (z.gather(1, ids) - lse[:, None]).exp()
    else:
        ids = torch.empty((x.shape[0], 0), dtype=torch.long, device=x.device)
        probs = torch.empty((x.shape[0], 0), dtype=torch.float32, device=x.device)
    return ConfidenceStats(max_prob, entropy, lse, ids, probs)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _confidence_kernel(
        x_ptr,  # [N, V] logits
        stride_row,
        V,
        inv_temp,
        maxp_ptr,  # [N] f32
        ent_ptr,  # [N] f32
        lse_ptr,  # [N] f32
        ids_ptr,  # [N, TOP_K] int64 (contiguous)
        probs_ptr,  # [N, TOP_K] f32 (contiguous)
        part_ptr,  # SPLIT: [N, S, 3] f32 partials (m, s, t)
        pv_ptr,  # SPLIT: [N, S, KP] f32 partial top-k values
        pi_ptr,  # SPLIT: [N, S, KP] int32 partial top-k ids
        CHUNK,  # vocabulary entries per program (multiple of BLOCK_V)
        TOP_K: tl.constexpr,
        KP: tl.constexpr,  # power of two >= max(TOP_K, 1)
        BLOCK_V: tl.constexpr,
        SPLIT: tl.constexpr,  # False: one program per row writes the outputs
    ):
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        n_split = tl.num_programs(1)
        c_lo = split * CHUNK
        c_hi = tl.minimum(c_lo + CHUNK, V)
        base = x_ptr + row * stride_row
        offs = tl.arange(0, BLOCK_V)
        BIG: tl.constexpr = 2147483647
        NEG_INF: tl.constexpr = float("-inf")
        # Online softmax with a scalar running max m and per-lane partial sums, so each
        # block costs one reduction (its max, shared with the top-k check):
        #   s_vec = sum exp(z - m),  t_vec = sum exp(z - m) * (z - m)   (per lane)
        m = tl.full((), NEG_INF, tl.float32)
        s_vec = tl.zeros((BLOCK_V,), tl.float32)
        t_vec = tl.zeros((BLOCK_V,), tl.float32)
        kk = tl.arange(0, KP)
        vals = tl.where(kk < TOP_K, NEG_INF, float("inf"))  # running top-k (raw fp32 logits)
        ids = tl.where(kk < TOP_K, BIG, -1)
        wv = tl.min(vals, 0)  # worst kept entry: smallest value, then largest index
        wi = tl.max(tl.where(vals == wv, ids, -1), 0)
        for start in range(c_lo, c_hi, BLOCK_V):
            idx = start + offs
            msk = idx < V
            x = tl.load(base + idx, mask=msk, other=NEG_INF).to(tl.float32)
            bx = tl.max(x, 0)
            # x -> x * inv_temp is monotone, so the block max of z is bx * inv_temp exactly
            m_new = tl.maximum(m, bx * inv_temp)
            m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
            alpha = tl.exp(m - m_safe)
            delta = tl.where(m == NEG_INF, 0.0, m - m_safe)
            z = x * inv_temp
            e = tl.exp(z - m_safe)
            ed = e * tl.where(e > 0, z - m_safe, 0.0)
            t_vec = alpha * (t_vec + delta * s_vec) + ed
            s_vec = s_vec * alpha + e
            m = m_new
            if TOP_K > 0:
                kx = x  # out-of-range lanes are -inf ...
                kidx = tl.where(msk, idx, BIG)  # ... and carry index BIG (never selected)
                bv = bx
                go = bv >= wv
                while go:
                    bi = tl.min(tl.where(kx == bv, kidx, BIG), 0)
                    better = (bi < BIG) & ((bv > wv) | (bi < wi))
                    slot = tl.min(tl.where((vals == wv) & (ids == wi), kk, KP), 0)
                    put = (kk == slot) & better
                    vals = tl.where(put, bv, vals)
                    ids = tl.where(put, bi, ids)
                    kidx = tl.where(kidx == bi, BIG, kidx)
                    kx = tl.where(kidx == BIG, NEG_INF, kx)
                    wv = tl.min(vals, 0)
                    wi = tl.max(tl.where(vals == wv, ids, -1), 0)
                    bv = tl.max(kx, 0)
                    go = better & (bv >= wv)
        s = tl.sum(s_vec, 0)
        t = tl.sum(t_vec, 0)
        if SPLIT:
            pbase = (row * n_split + split) * 3
            tl.store(part_ptr + pbase, m)
            tl.store(part_ptr + pbase + 1, s)
            tl.store(part_ptr + pbase + 2, t)
            if TOP_K > 0:
                kbase = (row * n_split + split) * KP
                tl.store(pv_ptr + kbase + kk, tl.where(kk < TOP_K, vals, NEG_INF))
                tl.store(pi_ptr + kbase + kk, tl.where(kk < TOP_K, ids, BIG))
        else:
            vals = tl.where(kk < TOP_K, vals, NEG_INF)  # drop the +inf padding slots
            ids = tl.where(kk < TOP_K, ids, BIG)
            _confidence_finish(
                row,
                m,
                s,
                t,
                vals[None, :],
                ids[None, :],
                inv_temp,
                maxp_ptr,
                ent_ptr,
                lse_ptr,
                ids_ptr,
                probs_ptr,
                TOP_K,
            )

    @triton.jit
    def _confidence_finish(
        row, m, s, t, vals, ids, inv_temp, maxp_ptr, ent_ptr, lse_ptr, ids_ptr, probs_ptr, TOP_K: tl.constexpr
    ):
        """Write the row's outputs from (m, s, t) and 2D candidate top-k tiles (vals, ids)."""
        NEG_INF: tl.constexpr = float("-inf")
        BIG: tl.constexpr = 2147483647
        m_safe = tl.where(m == NEG_INF, 0.0, m)
        log_s = tl.log(s)
        lse = m_safe + log_s
        tl.store(lse_ptr + row, lse)
        tl.store(maxp_ptr + row, tl.exp(m - lse))
        tl.store(ent_ptr + row, log_s - t / s)
        if TOP_K > 0:
            for j in tl.static_range(TOP_K):
                bv = tl.max(tl.max(vals, 1), 0)
                bi = tl.min(tl.min(tl.where(vals == bv, ids, BIG), 1), 0)
                tl.store(ids_ptr + row * TOP_K + j, bi.to(tl.int64))
                tl.store(probs_ptr + row * TOP_K + j, tl.exp(bv * inv_temp - lse))
                taken = (vals == bv) & (ids == bi)
                ids = tl.where(taken, BIG, ids)
                vals = tl.where(taken, NEG_INF, vals)

    @triton.jit
    def _confidence_combine_kernel(
        inv_temp,
        maxp_ptr,
        ent_ptr,
        lse_ptr,
        ids_ptr,
        probs_ptr,
        part_ptr,
        pv_ptr,
        pi_ptr,  # partials of _confidence_kernel(SPLIT=True)
        S,
        SP: tl.constexpr,  # power of two >= S
        TOP_K: tl.constexpr,
        KP: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        NEG_INF: tl.constexpr = float("-inf")
        BIG: tl.constexpr = 2147483647
        si = tl.arange(0, SP)
        ok = si < S
        pb = (row * S + si) * 3
        ms = tl.load(part_ptr + pb, mask=ok, other=NEG_INF)
        ss = tl.load(part_ptr + pb + 1, mask=ok, other=0.0)
        ts = tl.load(part_ptr + pb + 2, mask=ok, other=0.0)
        m = tl.max(ms, 0)
        m_safe = tl.where(m == NEG_INF, 0.0, m)
        w = tl.exp(ms - m_safe)
        delta = tl.where(ms == NEG_INF, 0.0, ms - m_safe)
        s = tl.sum(w * ss, 0)
        t = tl.sum(w * (ts + delta * ss), 0)
        kk = tl.arange(0, KP)
        kb = (row * S + si[:, None]) * KP + kk[None, :]
        vals = tl.load(pv_ptr + kb, mask=ok[:, None], other=NEG_INF)
        ids = tl.load(pi_ptr + kb, mask=ok[:, None], other=BIG)
        _confidence_finish(row, m, s, t, vals, ids, inv_temp, maxp_ptr, ent_ptr, lse_ptr, ids_ptr, probs_ptr, TOP_K)


def confidence_stats_triton(
    logits: torch.Tensor,  # [N, V] fp32/bf16/fp16 (CUDA, or CPU under TRITON_INTERPRET=1)
    temperature: float = 1.0,
    top_k: int = 0,
    *,
    num_splits: int | None = None,  # vocabulary splits per row (None: auto, see plan_splits)
    block_v: int | None = None,  # power-of-two block size override (tests)
) -> ConfidenceStats:
    """Triton implementation (no dispatch).

    Rows are processed by S programs each (split vocabulary) when that is needed to fill
    the GPU; a second small kernel then merges the partial (max, sums, top-k lists).
    """
    _check(logits, temperature, top_k)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    N, V = logits.shape
    dev = logits.device
    out = ConfidenceStats(
        torch.empty(N, dtype=torch.float32, device=dev),
        torch.empty(N, dtype=torch.float32, device=dev),
        torch.empty(N, dtype=torch.float32, device=dev),
        torch.empty((N, top_k), dtype=torch.long, device=dev),
        torch.empty((N, top_k), dtype=torch.float32, device=dev),
    )
    if N == 0:
        return out
    block = block_v or min(next_pow2(V), 4096 if logits.is_cuda else 16384)
    S, chunk = plan_splits(V, block, N, dev, num_splits)
    KP = max(next_pow2(top_k), 2)
    warps = 8 if logits.is_cuda else 1
    inv_t = 1.0 / float(temperature)
    if S > 1:
        part = torch.empty((N, S, 3), dtype=torch.float32, device=dev)
        pv = torch.empty((N, S, KP), dtype=torch.float32, device=dev)
        pi = torch.empty((N, S, KP), dtype=torch.int32, device=dev)
    else:
        part = pv = pi = out.max_prob  # unused
    _confidence_kernel[(N, S)](
        logits,
        logits.stride(0),
        V,
        inv_t,
        out.max_prob,
        out.entropy,
        out.lse,
        out.topk_ids,
        out.topk_probs,
        part,
        pv,
        pi,
        chunk,
        TOP_K=top_k,
        KP=KP,
        BLOCK_V=block,
        SPLIT=S > 1,
        num_warps=warps,
    )
    if S > 1:
        _confidence_combine_kernel[(N,)](
            inv_t,
            out.max_prob,
            out.entropy,
            out.lse,
            out.topk_ids,
            out.topk_probs,
            part,
            pv,
            pi,
            S,
            SP=max(next_pow2(S), 2),
            TOP_K=top_k,
            KP=KP,
            num_warps=4 if logits.is_cuda else 1,
        )
    return out


def confidence_stats(
    logits: torch.Tensor,  # [N, V] fp32/bf16/fp16
    temperature: float = 1.0,  # > 0
    top_k: int = 0,  # 0..16
) -> ConfidenceStats:
    """Max probability, entropy, log-sum-exp and top-k of ``softmax(logits / temperature)``.

    Dispatch: Triton for CUDA tensors, the PyTorch reference otherwise
    (``LIGHTSPEC_KERNELS=torch|triton`` forces one).
    """
    _check(logits, temperature, top_k)
    if backend_for(logits) == "triton":
        return confidence_stats_triton(logits, temperature, top_k)
    return confidence_stats_ref(logits, temperature, top_k)
