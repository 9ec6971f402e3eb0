"""Triton device helpers shared by the verification kernels."""

from __future__ import annotations

from ._common import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def row_argmax(ptr, lo, hi, V, BLOCK_V: tl.constexpr):
        """(max, first index of the max) of ``ptr[lo:hi]`` upcast to fp32; (-inf, 0) when empty."""
        offs = tl.arange(0, BLOCK_V)
        best = tl.full((), float("-inf"), tl.float32)
        best_i = tl.zeros((), tl.int32)
        for start in range(lo, hi, BLOCK_V):
            idx = start + offs
            x = tl.load(ptr + idx, mask=(idx < V) & (idx < hi), other=float("-inf")).to(tl.float32)
            bm, bi = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
            bi = bi + start
            upd = bm > best
            best_i = tl.where(upd, bi, best_i)
            best = tl.where(upd, bm, best)
        return best, best_i

    @triton.jit
    def sample_argmax(r_ptr, e_ptr, V, BLOCK_V: tl.constexpr):
        """First index of the maximum of ``r / e`` over ``[0, V)`` (IEEE division, fp32)."""
        offs = tl.arange(0, BLOCK_V)
        best = tl.full((), float("-inf"), tl.float32)
        best_i = tl.zeros((), tl.int32)
        for start in range(0, V, BLOCK_V):
            idx = start + offs
            msk = idx < V
            r = tl.load(r_ptr + idx, mask=msk, other=0.0).to(tl.float32)
            e = tl.load(e_ptr + idx, mask=msk, other=1.0).to(tl.float32)
            key = tl.where(msk, tl.math.div_rn(r, e), float("-inf"))
            bm, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            bi = bi + start
            upd = bm > best
            best_i = tl.where(upd, bi, best_i)
            best = tl.where(upd, bm, best)
        return best_i
