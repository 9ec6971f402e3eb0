"""Kernel 2: batched, ragged chain verification (greedy and lossless rejection sampling).

Semantics are fixed by :func:`lightspec_kernels.chain_verify_ref.chain_verify_ref` (the
contract with the core engine); see that module's docstring.  Randomness is an input:
``uniforms [B, K]`` decide acceptances and ``exponentials [B, V]`` (Exp(1) samples) pick
the recovered/bonus token as ``argmax(residual / exponentials)`` (first index on ties).

Triton path: greedy runs one program per (row, position, vocabulary chunk) computing
partial target argmaxes (positions past a row's draft length are skipped), then one
program per row merges them and finds the first mismatch.  Sampling: acceptance needs
only gathers of ``p[x]`` and ``q[x]``; then one streaming pass over the vocabulary of
the first unverified position samples the recovered (or bonus) token, split over
several programs per row (plus a merge kernel) when the batch is too small to fill
the GPU.
"""

from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, HAS_TRITON, backend_for, check_tensor, check_verify_inputs, next_pow2, plan_splits
from ._triton_utils import row_argmax
from .chain_verify_ref import chain_verify_ref

__all__ = ["chain_verify", "chain_verify_ref", "chain_verify_triton"]


def _check(draft_tokens, draft_lens, target_probs, draft_probs, uniforms, exponentials) -> None:
    check_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=(torch.int64,), expect="(draft_tokens [B, K])")
    B, K = draft_tokens.shape
    dev = draft_tokens.device
    check_tensor("draft_lens", draft_lens, shape=(B,), dtypes=(torch.int64,), device=dev, expect="(draft_lens [B])")
    check_tensor(
        "target_probs",
        target_probs,
        shape=(B, K + 1, None),
        dtypes=FLOAT_DTYPES,
        device=dev,
        expect="(target_probs [B, K+1, V])",
    )
    check_verify_inputs(target_probs, draft_probs, uniforms, exponentials, batch=B, slots=K, slot_name="K", device=dev)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _chain_argmax_kernel(
        tp_ptr,
        s_tb,
        s_tk,  # target_probs [B, K+1, V]
        lens_ptr,  # [B] int64
        pv_ptr,
        pi_ptr,  # [B, K+1, S] f32 / int32 partial (max, argmax) per vocabulary chunk
        K,
        V,
        CHUNK,
        BLOCK_V: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1)
        split = tl.program_id(2)
        S = tl.num_programs(2)
        n = tl.load(lens_ptr + b)
        lo = split * CHUNK
        hi = tl.where(i <= n, tl.minimum(lo + CHUNK, V), lo)  # positions past the draft: skip
        best, best_i = row_argmax(tp_ptr + b * s_tb + i * s_tk, lo, hi, V, BLOCK_V)
        o = (b * (K + 1) + i) * S + split
        tl.store(pv_ptr + o, best)
        tl.store(pi_ptr + o, best_i)

    @triton.jit
    def _emit_row(out_ptr, acc_ptr, b, drafts, final, acc, K, KP1: tl.constexpr):
        j = tl.arange(0, KP1)
        row = tl.where(j < acc, drafts, -1)
        row = tl.where(j == acc, final.to(tl.int64), row)
        tl.store(out_ptr + b * (K + 1) + j, row, mask=j < K + 1)
        tl.store(acc_ptr + b, acc.to(tl.int64))

    @triton.jit
    def _chain_greedy_finish_kernel(
        dt_ptr,
        s_db,  # draft_tokens [B, K] int64
        lens_ptr,  # [B]
        pv_ptr,
        pi_ptr,  # [B, K+1, S] partials of _chain_argmax_kernel
        acc_ptr,
        out_ptr,  # [B] int64, [B, K+1] int64
        K,
        S,
        KP1: tl.constexpr,
        SP: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KP1)
        si = tl.arange(0, SP)
        n = tl.load(lens_ptr + b)
        drafts = tl.load(dt_ptr + b * s_db + j, mask=j < K, other=-1)
        o = (b * (K + 1) + j[:, None]) * S + si[None, :]
        m2 = (j[:, None] < K + 1) & (si[None, :] < S)
        pv = tl.load(pv_ptr + o, mask=m2, other=float("-inf"))
        pi = tl.load(pi_ptr + o, mask=m2, other=2147483647)
        best = tl.max(pv, 1)
        tids = tl.min(tl.where(pv == best[:, None], pi, 2147483647), 1)  # chunks ascend: first index
        match = (tids.to(tl.int64) == drafts) & (j < n) & (j < K)
        acc = tl.min(tl.where(match, K, j), 0)
        final = tl.sum(tl.where(j == acc, tids, 0), 0)
        _emit_row(out_ptr, acc_ptr, b, drafts, final, acc, K, KP1)

    @triton.jit
    def _chain_accept(
        dt_ptr,
        s_db,
        lens_ptr,
        tp_ptr,
        s_tb,
        s_tk,
        dp_ptr,
        s_qb,
        s_qk,
        u_ptr,
        s_ub,
        b,
        K,
        HAS_Q: tl.constexpr,
        KP1: tl.constexpr,
    ):
        """Acceptance of row b: returns (drafts [KP1], n, accepted, drafted token at the rejected slot)."""
        j = tl.arange(0, KP1)
        n = tl.load(lens_ptr + b)
        live = (j < n) & (j < K)
        drafts = tl.load(dt_ptr + b * s_db + j, mask=j < K, other=-1)
        tok = tl.maximum(drafts, 0)
        p_x = tl.load(tp_ptr + b * s_tb + j * s_tk + tok, mask=live, other=0.0).to(tl.float32)
        if HAS_Q:
            q_x = tl.load(dp_ptr + b * s_qb + j * s_qk + tok, mask=live, other=1.0).to(tl.float32)
        else:
            q_x = tl.full((KP1,), 1.0, tl.float32)
        u = tl.load(u_ptr + b * s_ub + j, mask=live, other=1.0).to(tl.float32)
        ok = (u * q_x < p_x) & live
        acc = tl.min(tl.where(ok, K, j), 0)
        x_rej = tl.sum(tl.where(j == acc, tok, 0), 0)
        return drafts, n, acc, x_rej

    @triton.jit
    def _chain_sample_kernel(
        dt_ptr,
        s_db,  # draft_tokens [B, K] int64
        lens_ptr,  # [B] int64
        tp_ptr,
        s_tb,
        s_tk,  # target_probs [B, K+1, V]
        dp_ptr,
        s_qb,
        s_qk,  # draft_probs [B, K, V] (ignored unless HAS_Q)
        u_ptr,
        s_ub,  # uniforms [B, K]
        e_ptr,
        s_eb,  # exponentials [B, V]
        acc_ptr,
        out_ptr,  # [B] int64, [B, K+1] int64 (not SPLIT)
        pv_ptr,
        pi_ptr,  # SPLIT: [B, S, 2] f32 (best p/e, best r/e), [B, S, 3] int32 (argmaxes, any_pos)
        K,
        V,
        CHUNK,
        HAS_Q: tl.constexpr,
        KP1: tl.constexpr,
        BLOCK_V: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        S = tl.num_programs(1)
        drafts, n, acc, x_rej = _chain_accept(
            dt_ptr, s_db, lens_ptr, tp_ptr, s_tb, s_tk, dp_ptr, s_qb, s_qk, u_ptr, s_ub, b, K, HAS_Q, KP1
        )
        rejected = acc < n
        p_row = tp_ptr + b * s_tb + acc * s_tk
        q_row = dp_ptr + b * s_qb + tl.minimum(acc, K - 1) * s_qk
        e_row = e_ptr + b * s_eb
        lo = split * CHUNK
        hi = tl.minimum(lo + CHUNK, V)
        q_hi = tl.where(rejected, hi, 0)  # read q only for rejected rows
        offs = tl.arange(0, BLOCK_V)
        best_p = tl.full((), float("-inf"), tl.float32)
        best_pi = tl.zeros((), tl.int32)
        best_r = tl.full((), float("-inf"), tl.float32)
        best_ri = tl.zeros((), tl.int32)
        any_pos = tl.zeros((), tl.int32)
        for start in range(lo, hi, BLOCK_V):
            idx = start + offs
            msk = idx < hi
            p = tl.load(p_row + idx, mask=msk, other=0.0).to(tl.float32)
            e = tl.load(e_row + idx, mask=msk, other=1.0).to(tl.float32)
            if HAS_Q:
                q = tl.load(q_row + idx, mask=idx < q_hi, other=0.0).to(tl.float32)
                res = tl.maximum(p - q, 0.0)
            else:
                res = tl.maximum(tl.where(idx == x_rej, 0.0, p), 0.0)
            any_pos = tl.maximum(any_pos, tl.max(tl.where(msk & (res > 0), 1, 0), 0))
            kp = tl.where(msk, tl.math.div_rn(p, e), float("-inf"))
            kr = tl.where(msk, tl.math.div_rn(res, e), float("-inf"))
            bm, bi = tl.max(kp, 0, return_indices=True, return_indices_tie_break_left=True)
            bi = bi + start
            upd = bm > best_p
            best_pi = tl.where(upd, bi, best_pi)
            best_p = tl.where(upd, bm, best_p)
            bm, bi = tl.max(kr, 0, return_indices=True, return_indices_tie_break_left=True)
            bi = bi + start
            upd = bm > best_r
            best_ri = tl.where(upd, bi, best_ri)
            best_r = tl.where(upd, bm, best_r)
        if SPLIT:
            o = b * S + split
            tl.store(pv_ptr + o * 2, best_p)
            tl.store(pv_ptr + o * 2 + 1, best_r)
            tl.store(pi_ptr + o * 3, best_pi)
            tl.store(pi_ptr + o * 3 + 1, best_ri)
            tl.store(pi_ptr + o * 3 + 2, any_pos)
        else:
            final = tl.where(rejected & (any_pos > 0), best_ri, best_pi)
            _emit_row(out_ptr, acc_ptr, b, drafts, final, acc, K, KP1)

    @triton.jit
    def _chain_sample_finish_kernel(
        dt_ptr,
        s_db,
        lens_ptr,
        tp_ptr,
        s_tb,
        s_tk,
        dp_ptr,
        s_qb,
        s_qk,
        u_ptr,
        s_ub,
        acc_ptr,
        out_ptr,
        pv_ptr,
        pi_ptr,  # partials of _chain_sample_kernel(SPLIT=True)
        K,
        S,
        HAS_Q: tl.constexpr,
        KP1: tl.constexpr,
        SP: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        drafts, n, acc, x_rej = _chain_accept(
            dt_ptr, s_db, lens_ptr, tp_ptr, s_tb, s_tk, dp_ptr, s_qb, s_qk, u_ptr, s_ub, b, K, HAS_Q, KP1
        )
        si = tl.arange(0, SP)
        ok = si < S
        o = b * S + si
        bp = tl.load(pv_ptr + o * 2, mask=ok, other=float("-inf"))
        br = tl.load(pv_ptr + o * 2 + 1, mask=ok, other=float("-inf"))
        bpi = tl.load(pi_ptr + o * 3, mask=ok, other=2147483647)
        bri = tl.load(pi_ptr + o * 3 + 1, mask=ok, other=2147483647)
        anyp = tl.load(pi_ptr + o * 3 + 2, mask=ok, other=0)
        pi = tl.min(tl.where(bp == tl.max(bp, 0), bpi, 2147483647), 0)
        ri = tl.min(tl.where(br == tl.max(br, 0), bri, 2147483647), 0)
        final = tl.where((acc < n) & (tl.max(anyp, 0) > 0), ri, pi)
        _emit_row(out_ptr, acc_ptr, b, drafts, final, acc, K, KP1)


def chain_verify_triton(
    draft_tokens,
    draft_lens,
    target_probs,
    draft_probs=None,
    uniforms=None,
    exponentials=None,
    *,
    num_splits: int | None = None,
    block_v: int | None = None,
):
    """Triton implementation of :func:`chain_verify` (no dispatch).

    ``num_splits`` (None: auto) splits each vocabulary scan over several programs, with
    a small finishing kernel; ``block_v`` overrides the block size (tests).
    """
    _check(draft_tokens, draft_lens, target_probs, draft_probs, uniforms, exponentials)
    B, K = draft_tokens.shape
    V = target_probs.shape[2]
    dev = draft_tokens.device
    accepted = torch.empty(B, dtype=torch.long, device=dev)
    emitted = torch.empty((B, K + 1), dtype=torch.long, device=dev)
    if B == 0:
        return accepted, emitted

    def last_contig(t):
        return t if t is None or t.stride(-1) == 1 else t.contiguous()

    draft_tokens, target_probs, draft_probs = map(last_contig, (draft_tokens, target_probs, draft_probs))
    uniforms, exponentials = last_contig(uniforms), last_contig(exponentials)
    draft_lens = draft_lens.contiguous()
    KP1 = max(next_pow2(K + 1), 2)
    block = block_v or min(next_pow2(V), 4096 if dev.type == "cuda" else 16384)
    warps = 8 if dev.type == "cuda" else 1
    if uniforms is None:
        S, chunk = plan_splits(V, block, B * (K + 1), dev, num_splits)
        pv = torch.empty((B, K + 1, S), dtype=torch.float32, device=dev)
        pi = torch.empty((B, K + 1, S), dtype=torch.int32, device=dev)
        _chain_argmax_kernel[(B, K + 1, S)](
            target_probs,
            target_probs.stride(0),
            target_probs.stride(1),
            draft_lens,
            pv,
            pi,
            K,
            V,
            chunk,
            BLOCK_V=block,
            num_warps=warps,
        )
        _chain_greedy_finish_kernel[(B,)](
            draft_tokens,
            draft_tokens.stride(0),
            draft_lens,
            pv,
            pi,
            accepted,
            emitted,
            K,
            S,
            KP1=KP1,
            SP=max(next_pow2(S), 2),
            num_warps=1,
        )
        return accepted, emitted
    S, chunk = plan_splits(V, block, B, dev, num_splits)
    dp = draft_probs if draft_probs is not None else target_probs
    common = (
        draft_tokens,
        draft_tokens.stride(0),
        draft_lens,
        target_probs,
        target_probs.stride(0),
        target_probs.stride(1),
        dp,
        dp.stride(0),
        dp.stride(1),
        uniforms,
        uniforms.stride(0),
    )
    if S > 1:
        pv = torch.empty((B, S, 2), dtype=torch.float32, device=dev)
        pi = torch.empty((B, S, 3), dtype=torch.int32, device=dev)
    else:
        pv, pi = accepted, accepted  # unused
    _chain_sample_kernel[(B, S)](
        *common,
        exponentials,
        exponentials.stride(0),
        accepted,
        emitted,
        pv,
        pi,
        K,
        V,
        chunk,
        HAS_Q=draft_probs is not None,
        KP1=KP1,
        BLOCK_V=block,
        SPLIT=S > 1,
        num_warps=warps,
    )
    if S > 1:
        _chain_sample_finish_kernel[(B,)](
            *common,
            accepted,
            emitted,
            pv,
            pi,
            K,
            S,
            HAS_Q=draft_probs is not None,
            KP1=KP1,
            SP=max(next_pow2(S), 2),
            num_warps=1,
        )
    return accepted, emitted


def chain_verify(
    draft_tokens: torch.Tensor,  # [B, K] int64; entries at i >= draft_lens[b] are ignored
    draft_lens: torch.Tensor,  # [B] int64, 0 <= draft_lens[b] <= K
    target_probs: torch.Tensor,  # [B, K+1, V] fp32/bf16/fp16; greedy: logits are fine
    draft_probs: torch.Tensor | None = None,  # [B, K, V] or None (one-hot drafts, e.g. n-gram)
    uniforms: torch.Tensor | None = None,  # [B, K] in [0, 1); None selects greedy verification
    exponentials: torch.Tensor | None = None,  # [B, V] Exp(1) samples; required when sampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify B ragged draft chains; returns ``(accepted [B] int64, emitted [B, K+1] int64)``.

    Row b emits its first ``accepted[b]`` drafts, then one recovered/bonus token, then -1.
    Dispatch: Triton on CUDA tensors, the PyTorch reference elsewhere
    (``LIGHTSPEC_KERNELS=torch|triton`` forces one).
    """
    _check(draft_tokens, draft_lens, target_probs, draft_probs, uniforms, exponentials)
    tensors = (draft_tokens, draft_lens, target_probs, draft_probs, uniforms, exponentials)
    if backend_for(*tensors) == "triton":
        return chain_verify_triton(*tensors)
    return chain_verify_ref(*tensors)
