"""Kernel 3: token-tree verification (greedy and SpecInfer multi-branch rejection sampling).

Tree convention (row b of a batch; N node slots):

* node 0 is the root: the current last token (already emitted, not verified again);
  ``parents[b, 0] == -1``.
* every other node j has ``0 <= parents[b, j] < j`` (topological order).  A slot j >= 1
  with ``parents[b, j] == -1`` is padding (ragged trees) and is ignored.
* ``tree_tokens[b, j]`` is node j's token (node 0's entry is not read).
* ``target_probs[b, j]`` is the target distribution of the token that follows node j
  (the model output at node j's position), so it scores node j's children; node 0's
  row comes from the last accepted token.
* ``draft_probs[b, j]`` (optional) is the draft distribution node j's children were
  sampled from (i.i.d., with replacement).  ``None`` means one-hot drafts (n-gram,
  deterministic top-k trees): q of a child is one-hot on its token.
* children are tried in ascending node index.

Greedy (``uniforms is None``): at the current node take t = argmax target_probs (first
index on ties); move to the first child whose token is t; stop when there is none, and
t is the bonus token.

Sampling (SpecInfer, lossless): keep an unnormalised residual r (initially p of the
current node) with mass Z = sum(r) (summed in fp64, rounded to fp32).  For each child
c with token x in order: accept iff ``(uniforms[b, c] * q(x)) * Z < r(x)`` (i.e. with
probability min(1, (r(x)/Z) / q(x))); on acceptance move to c and restart with its p.
On rejection ``r <- max(r - Z * q, 0)`` (one-hot q: ``r[x] <- 0``); if that leaves no
positive mass (rounding only), r falls back to p of the current node.  When a node has
no (more) children, the bonus token is ``argmax(r / exponentials[b])`` (first index),
an exact sample of norm(r) for Exp(1) exponentials.

Outputs (:class:`TreeVerifyResult`): ``path [B, N-1] int64`` the accepted node indices
from depth 1 down (root excluded), -1 padded; ``path_len [B] int64``; ``bonus [B] int64``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import FLOAT_DTYPES, HAS_TRITON, backend_for, check_tensor, check_verify_inputs, next_pow2, plan_splits
from ._triton_utils import row_argmax, sample_argmax


class TreeVerifyResult(NamedTuple):
    path: torch.Tensor  # [B, N-1] int64 accepted node indices (root excluded), -1 padded
    path_len: torch.Tensor  # [B] int64 number of accepted draft nodes
    bonus: torch.Tensor  # [B] int64 token emitted after the path


def _check(tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials) -> None:
    check_tensor("tree_tokens", tree_tokens, ndim=2, dtypes=(torch.int64,), expect="(tree_tokens [B, N])")
    B, N = tree_tokens.shape
    if N < 1:
        raise ValueError(f"tree_tokens: got shape {tuple(tree_tokens.shape)}; expected N >= 1 (node 0 is the root)")
    dev = tree_tokens.device
    check_tensor("parents", parents, shape=(B, N), dtypes=(torch.int64,), device=dev, expect="(parents [B, N])")
    check_tensor(
        "target_probs",
        target_probs,
        shape=(B, N, None),
        dtypes=FLOAT_DTYPES,
        device=dev,
        expect="(target_probs [B, N, V])",
    )
    check_verify_inputs(target_probs, draft_probs, uniforms, exponentials, batch=B, slots=N, slot_name="N", device=dev)


def check_tree(parents: torch.Tensor) -> None:
    """Value check of a parents tensor ``[B, N]`` (host sync; the kernels never call it)."""
    check_tensor("parents", parents, ndim=2, dtypes=(torch.int64,), expect="(parents [B, N])")
    B, N = parents.shape
    if N == 0:
        return
    if (parents[:, 0] != -1).any():
        raise ValueError("parents: node 0 is the root and must have parent -1 in every row")
    nodes = torch.arange(N, device=parents.device)
    bad = (parents < -1) | (parents >= nodes[None, :])
    if bad.any():
        b, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"parents: parents[{b}, {j}] = {int(parents[b, j])}; expected -1 (padding) or 0 <= parent < {j}"
        )
    # a padding node must not be anyone's parent
    pad = (parents == -1) & (nodes[None, :] > 0)
    n_children = torch.zeros_like(parents).scatter_add_(1, parents.clamp(min=0), (parents >= 0).long())
    hit = pad & (n_children > 0)
    if hit.any():
        b, j = (int(v) for v in hit.nonzero()[0])
        raise ValueError(f"parents: node {j} of row {b} is padding (parent -1) but has children")


def tree_verify_ref(
    tree_tokens: torch.Tensor,  # [B, N] int64
    parents: torch.Tensor,  # [B, N] int64, -1 for the root (node 0) and padding
    target_probs: torch.Tensor,  # [B, N, V] float (greedy: logits are fine)
    draft_probs: torch.Tensor | None = None,  # [B, N, V] float or None (one-hot drafts)
    uniforms: torch.Tensor | None = None,  # [B, N] in [0, 1); None = greedy
    exponentials: torch.Tensor | None = None,  # [B, V] Exp(1); required when sampling
) -> TreeVerifyResult:
    """PyTorch reference (vectorised over the batch, one step per tried node)."""
    _check(tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials)
    check_tree(parents)
    B, N = tree_tokens.shape
    dev = tree_tokens.device
    nodes = torch.arange(N, device=dev)
    rows = torch.arange(B, device=dev)
    is_child = (parents >= 0) & (nodes[None, :] > 0)
    path = torch.full((B, N - 1), -1, dtype=torch.long, device=dev)
    plen = torch.zeros(B, dtype=torch.long, device=dev)
    bonus = torch.zeros(B, dtype=torch.long, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    if uniforms is None:
        tids = target_probs.argmax(dim=-1)  # [B, N]
        while not bool(done.all()):
            t = tids[rows, cur]
            cand = is_child & (parents == cur[:, None]) & (tree_tokens == t[:, None])
            child = torch.where(cand, nodes, N).min(dim=1).values
            has = (child < N) & ~done
            fin = ~has & ~done
            bonus = torch.where(fin, t, bonus)
            path[rows[has], plen[has]] = child[has]
            plen = plen + has.long()
            cur = torch.where(has, child, cur)
            done = done | fin
        return TreeVerifyResult(path, plen, bonus)

    p = target_probs.float()
    q = None if draft_probs is None else draft_probs.float()
    e = exponentials.float()
    u_all = uniforms.float()
    cols = torch.arange(p.shape[2], device=dev)
    r = p[:, 0].clone()  # [B, V] residual
    zp = r.double().sum(dim=-1).float()  # mass of p at the current node
    z = zp.clone()  # mass of r
    last = torch.zeros(B, dtype=torch.long, device=dev)
    while not bool(done.all()):
        cand = is_child & (parents == cur[:, None]) & (nodes[None, :] > last[:, None])
        child = torch.where(cand, nodes, N).min(dim=1).values
        has = (child < N) & ~done
        fin = ~has & ~done
        if bool(fin.any()):
            bonus[fin] = (r[fin] / e[fin]).argmax(dim=-1)
        c = child.clamp(max=N - 1)
        x = tree_tokens[rows, c].clamp(min=0)
        r_x = r[rows, x]
        q_x = torch.ones_like(r_x) if q is None else q[rows, cur, x]
        acc = has & (u_all[rows, c] * q_x * z < r_x)
        rej = has & ~acc
        last = torch.where(has, child, last)
        if bool(acc.any()):
            path[rows[acc], plen[acc]] = child[acc]
            plen = plen + acc.long()
            cur = torch.where(acc, child, cur)
            r[acc] = p[rows[acc], cur[acc]]
            zp[acc] = r[acc].double().sum(dim=-1).float()
            z[acc] = zp[acc]
        if bool(rej.any()):
            rr = r[rej]
            if q is None:
                new = torch.where(cols[None, :] == x[rej][:, None], 0.0, rr)
            else:
                new = (rr - z[rej][:, None] * q[rows[rej], cur[rej]]).clamp(min=0)
            zn = new.double().sum(dim=-1).float()
            empty = ~(new > 0).any(dim=-1)
            new = torch.where(empty[:, None], p[rows[rej], cur[rej]], new)
            r[rej] = new
            z[rej] = torch.where(empty, zp[rej], zn)
        done = done | fin
    return TreeVerifyResult(path, plen, bonus)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _mass64(ptr, V, BLOCK_V: tl.constexpr):
        offs = tl.arange(0, BLOCK_V)
        acc = tl.zeros((), tl.float64)
        for start in range(0, V, BLOCK_V):
            idx = start + offs
            x = tl.load(ptr + idx, mask=idx < V, other=0.0).to(tl.float32)
            acc += tl.sum(x.to(tl.float64), 0)
        return acc.to(tl.float32)

    @triton.jit
    def _tree_verify_kernel(
        tok_ptr,
        s_tok,  # tree_tokens [B, N]
        par_ptr,
        s_par,  # parents [B, N]
        tp_ptr,
        s_tb,
        s_tn,  # target_probs [B, N, V]
        dp_ptr,
        s_qb,
        s_qn,  # draft_probs [B, N, V] (only if HAS_Q)
        u_ptr,
        s_ub,  # uniforms [B, N]
        e_ptr,
        s_eb,  # exponentials [B, V]
        ws_ptr,  # [B, V] f32 residual workspace
        path_ptr,
        plen_ptr,
        bonus_ptr,  # [B, N-1], [B], [B] int64
        pv_ptr,
        pi_ptr,  # PRE_ARGMAX: [B, N, S] partial (max, argmax) of every node's target row
        N,
        V,
        S,
        SAMPLE: tl.constexpr,
        PRE_ARGMAX: tl.constexpr,  # greedy: argmaxes precomputed in parallel (small batches)
        SP: tl.constexpr,
        HAS_Q: tl.constexpr,
        NP: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        BIG: tl.constexpr = 2147483647
        j = tl.arange(0, NP)
        par = tl.load(par_ptr + b * s_par + j, mask=j < N, other=-2).to(tl.int32)
        tok = tl.load(tok_ptr + b * s_tok + j, mask=j < N, other=-1)
        is_child = (j > 0) & (j < N) & (par >= 0)
        cur = tl.zeros((), tl.int32)
        plen = tl.zeros((), tl.int32)
        last = tl.zeros((), tl.int32)
        bonus = tl.zeros((), tl.int32)
        done = tl.zeros((), tl.int32)
        in_ws = tl.zeros((), tl.int32)
        path = tl.full((NP,), -1, tl.int64)
        ws_row = ws_ptr + b * V
        e_row = e_ptr + b * s_eb
        offs = tl.arange(0, BLOCK_V)
        zp = tl.zeros((), tl.float32)
        if SAMPLE:
            zp = _mass64(tp_ptr + b * s_tb, V, BLOCK_V)
        z = zp
        while done == 0:
            p_row = tp_ptr + b * s_tb + cur.to(tl.int64) * s_tn
            if not SAMPLE:
                if PRE_ARGMAX:
                    si = tl.arange(0, SP)
                    o = (b * N + cur) * S + si
                    pv = tl.load(pv_ptr + o, mask=si < S, other=float("-inf"))
                    pi = tl.load(pi_ptr + o, mask=si < S, other=BIG)
                    t = tl.min(tl.where(pv == tl.max(pv, 0), pi, BIG), 0)
                else:
                    _, t = row_argmax(p_row, 0, V, V, BLOCK_V)
                cand = is_child & (par == cur) & (tok == t)
                child = tl.min(tl.where(cand, j, BIG), 0)
                has = child < BIG
                path = tl.where((j == plen) & has, child.to(tl.int64), path)
                plen += has.to(tl.int32)
                cur = tl.where(has, child, cur)
                bonus = t
                done = tl.where(has, 0, 1)
            else:
                cand = is_child & (par == cur) & (j > last)
                child = tl.min(tl.where(cand, j, BIG), 0)
                if child < BIG:
                    x = tl.maximum(tl.sum(tl.where(j == child, tok, 0), 0), 0)
                    r_ws = tl.load(ws_row + x)
                    r_p = tl.load(p_row + x).to(tl.float32)
                    r_x = tl.where(in_ws != 0, r_ws, r_p)
                    if HAS_Q:
                        q_x = tl.load(dp_ptr + b * s_qb + cur.to(tl.int64) * s_qn + x).to(tl.float32)
                    else:
                        q_x = tl.full((), 1.0, tl.float32)
                    u = tl.load(u_ptr + b * s_ub + child).to(tl.float32)
                    last = child
                    if u * q_x * z < r_x:
                        path = tl.where(j == plen, child.to(tl.int64), path)
                        plen += 1
                        cur = child
                        in_ws = tl.zeros((), tl.int32)
                        zp = _mass64(tp_ptr + b * s_tb + child.to(tl.int64) * s_tn, V, BLOCK_V)
                        z = zp
                    else:
                        ws_lim = tl.where(in_ws != 0, V, 0)
                        q_row = dp_ptr + b * s_qb + cur.to(tl.int64) * s_qn
                        zn = tl.zeros((), tl.float64)
                        any_pos = tl.zeros((), tl.int32)
                        for start in range(0, V, BLOCK_V):
                            idx = start + offs
                            msk = idx < V
                            rw = tl.load(ws_row + idx, mask=idx < ws_lim, other=0.0)
                            rp = tl.load(p_row + idx, mask=msk & (idx >= ws_lim), other=0.0).to(tl.float32)
                            r = tl.where(idx < ws_lim, rw, rp)
                            if HAS_Q:
                                q = tl.load(q_row + idx, mask=msk, other=0.0).to(tl.float32)
                                new = tl.maximum(r - z * q, 0.0)
                            else:
                                new = tl.where(idx == x, 0.0, r)
                            new = tl.where(msk, new, 0.0)
                            tl.store(ws_row + idx, new, mask=msk)
                            zn += tl.sum(new.to(tl.float64), 0)
                            any_pos = tl.maximum(any_pos, tl.max((new > 0).to(tl.int32), 0))
                        # the next acceptance test reads ws[x] written by another thread
                        tl.debug_barrier()
                        in_ws = any_pos
                        z = tl.where(any_pos != 0, zn.to(tl.float32), zp)
                else:
                    if in_ws != 0:
                        bonus = sample_argmax(ws_row, e_row, V, BLOCK_V)
                    else:
                        bonus = sample_argmax(p_row, e_row, V, BLOCK_V)
                    done = tl.full((), 1, tl.int32)
        tl.store(path_ptr + b * (N - 1) + j, path, mask=j < N - 1)
        tl.store(plen_ptr + b, plen.to(tl.int64))
        tl.store(bonus_ptr + b, bonus.to(tl.int64))


def tree_verify_triton(
    tree_tokens,
    parents,
    target_probs,
    draft_probs=None,
    uniforms=None,
    exponentials=None,
    *,
    greedy_parallel: bool | None = None,
    num_splits: int | None = None,
    block_v: int | None = None,
):
    """Triton implementation of :func:`tree_verify` (no dispatch, no value checks).

    Greedy trees are walked by one program per row.  With ``greedy_parallel`` (default:
    on CUDA when B < 32) the target argmax of every node is first computed by a grid
    of (row, node, vocabulary chunk) programs, so a small batch reads all N rows in
    parallel instead of the visited rows one after the other.
    """
    _check(tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials)
    B, N = tree_tokens.shape
    V = target_probs.shape[2]
    dev = tree_tokens.device
    out = TreeVerifyResult(
        torch.empty((B, N - 1), dtype=torch.long, device=dev),
        torch.empty(B, dtype=torch.long, device=dev),
        torch.empty(B, dtype=torch.long, device=dev),
    )
    if B == 0:
        return out

    def lc(t):
        return t if t is None or t.stride(-1) == 1 else t.contiguous()

    tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials = map(
        lc, (tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials)
    )
    sample = uniforms is not None
    cuda = dev.type == "cuda"
    # one program walks a whole tree: large blocks and 16 warps keep more bytes in flight
    block = block_v or min(next_pow2(V), 8192 if cuda else 16384)
    pre = (not sample) and (greedy_parallel if greedy_parallel is not None else (cuda and B < 32))
    if pre:
        from .chain import _chain_argmax_kernel

        ablock = block_v or min(next_pow2(V), 4096 if cuda else 16384)
        S, chunk = plan_splits(V, ablock, B * N, dev, num_splits)
        pv = torch.empty((B, N, S), dtype=torch.float32, device=dev)
        pi = torch.empty((B, N, S), dtype=torch.int32, device=dev)
        all_nodes = torch.full((B,), N - 1, dtype=torch.long, device=dev)
        _chain_argmax_kernel[(B, N, S)](
            target_probs,
            target_probs.stride(0),
            target_probs.stride(1),
            all_nodes,
            pv,
            pi,
            N - 1,
            V,
            chunk,
            BLOCK_V=ablock,
            num_warps=8 if cuda else 1,
        )
    else:
        S, pv, pi = 1, out.path_len, out.path_len  # unused
    ws = torch.empty((B, V) if sample else (1, 1), dtype=torch.float32, device=dev)
    dp = draft_probs if draft_probs is not None else target_probs
    u = uniforms if sample else tree_tokens
    e = exponentials if sample else target_probs[:, 0]
    _tree_verify_kernel[(B,)](
        tree_tokens,
        tree_tokens.stride(0),
        parents,
        parents.stride(0),
        target_probs,
        target_probs.stride(0),
        target_probs.stride(1),
        dp,
        dp.stride(0),
        dp.stride(1),
        u,
        u.stride(0),
        e,
        e.stride(0),
        ws,
        out.path,
        out.path_len,
        out.bonus,
        pv,
        pi,
        N,
        V,
        S,
        SAMPLE=sample,
        PRE_ARGMAX=pre,
        SP=max(next_pow2(S), 2),
        HAS_Q=draft_probs is not None,
        NP=max(next_pow2(N), 2),
        BLOCK_V=block,
        num_warps=16 if cuda else 1,
        enable_fp_fusion=False,  # r - Z*q must round like the reference (no FMA)
    )
    return out


def tree_verify(
    tree_tokens: torch.Tensor,  # [B, N] int64; node 0 = root (current last token)
    parents: torch.Tensor,  # [B, N] int64; -1 for the root and padding, else 0 <= parent < j
    target_probs: torch.Tensor,  # [B, N, V] fp32/bf16/fp16: p after node j (greedy: logits fine)
    draft_probs: torch.Tensor | None = None,  # [B, N, V]: q node j's children were drawn from; None = one-hot
    uniforms: torch.Tensor | None = None,  # [B, N] in [0, 1): decides node j's acceptance; None = greedy
    exponentials: torch.Tensor | None = None,  # [B, V] Exp(1) samples for the bonus token
) -> TreeVerifyResult:
    """Verify B token trees; returns ``TreeVerifyResult(path [B, N-1], path_len [B], bonus [B])``.

    See the module docstring for the exact convention.  Dispatch: Triton on CUDA tensors,
    the PyTorch reference elsewhere (``LIGHTSPEC_KERNELS=torch|triton`` forces one).
    """
    _check(tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials)
    args = (tree_tokens, parents, target_probs, draft_probs, uniforms, exponentials)
    if backend_for(*args) == "triton":
        return tree_verify_triton(*args)
    return tree_verify_ref(*args)
