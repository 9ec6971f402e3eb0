"""The sampling paths are lossless: emitted tokens follow the target distribution.

vLLM-style check: with vocabulary 10, the target p and draft q the same at every
position/node, compare the empirical distribution of all emitted tokens over the first
n verification rows (n = 10 .. 1e5) with p and with 100 random reference
distributions.  The L2 distance to p must shrink at least 20x faster than the distance
to the references.  The many-row runs use the PyTorch reference (bit-identical to the
kernels, which a final check confirms on a slice with the interpreter).
"""

import lightspec_kernels as lk
import pytest
import torch
from kernel_helpers import exponentials

V = 10
SIZES = [10, 100, 1000, 10_000, 100_000]


def _assert_lossless(tokens_per_row, p, gen):
    """tokens_per_row: list over rows -> 1D tensors of emitted tokens (row order kept)."""
    refs = torch.softmax(torch.randn((100, V), generator=gen) * 2, dim=-1)
    d_target, d_ref = [], []
    for n in SIZES:
        toks = tokens_per_row(n)
        hist = torch.bincount(toks, minlength=V).double()
        emp = hist / hist.sum()
        d_target.append(float((emp - p.double()).norm()))
        d_ref.append((emp[None] - refs.double()).norm(dim=1))
    shrink_target = d_target[0] / d_target[-1]
    shrink_ref = float((d_ref[0] / d_ref[-1]).mean())
    assert shrink_target >= 20 * shrink_ref, (d_target, shrink_target, shrink_ref)
    assert d_target[-1] < 0.01, d_target  # expected ~0.003 at 1e5 rows


def _dists(gen):
    p = torch.softmax(torch.randn(V, generator=gen) * 1.5, 0)
    q = torch.softmax(torch.randn(V, generator=gen) * 1.5, 0)
    return p, q


@pytest.mark.parametrize("with_q", [True, False])
def test_chain_sampling_keeps_target_distribution(gen, with_q):
    p, q = _dists(gen)
    K, B = 3, SIZES[-1]
    tp = p.expand(B, K + 1, V).contiguous()
    dp = q.expand(B, K, V).contiguous() if with_q else None
    drafts = torch.multinomial(q, B * K, replacement=True, generator=gen).view(B, K)
    lens = torch.randint(0, K + 1, (B,), generator=gen)
    u = torch.rand((B, K), generator=gen)
    e = exponentials(B, V, gen)
    acc, emit = lk.chain_verify_ref(drafts, lens, tp, dp, u, e)
    assert 0 < float(acc.float().mean()) < K  # both acceptances and rejections happen
    _assert_lossless(lambda n: emit[:n][emit[:n] >= 0], p, gen)
    # the Triton kernel (interpreter) gives the same rows
    s = slice(0, 48)
    args = (drafts[s], lens[s], tp[s], None if dp is None else dp[s], u[s], e[s])
    acc_k, emit_k = lk.chain_verify_triton(*args)
    assert torch.equal(acc_k, acc[s]) and torch.equal(emit_k, emit[s])


@pytest.mark.parametrize("with_q", [True, False])
def test_tree_sampling_keeps_target_distribution(gen, with_q):
    p, q = _dists(gen)
    # root -> {1, 2, 3}; 1 -> {4, 5}; 2 -> {6}; 4 -> {7, 8}
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 4, 4])
    N, B = parents.numel(), SIZES[-1]
    parents = parents.expand(B, N).contiguous()
    tp = p.expand(B, N, V).contiguous()
    if with_q:  # siblings drawn i.i.d. from q, with replacement
        tokens = torch.multinomial(q, B * N, replacement=True, generator=gen).view(B, N)
        dp = q.expand(B, N, V).contiguous()
    else:  # one-hot drafts: distinct sibling tokens, e.g. a random top-k style pick
        tokens = torch.rand((B, V), generator=gen).argsort(dim=1)[:, :N]
        dp = None
    u = torch.rand((B, N), generator=gen)
    e = exponentials(B, V, gen)
    res = lk.tree_verify_ref(tokens, parents, tp, dp, u, e)
    assert 0 < float(res.path_len.float().mean()) < 3

    def emitted(n):
        path = res.path[:n]
        toks = tokens[:n].gather(1, path.clamp(min=0))[path >= 0]
        return torch.cat([toks, res.bonus[:n]])

    _assert_lossless(emitted, p, gen)
    s = slice(0, 48)
    out = lk.tree_verify_triton(tokens[s], parents[s], tp[s], None if dp is None else dp[s], u[s], e[s])
    for a, r in zip(out, res):
        assert torch.equal(a, r[s])


def test_detects_a_biased_sampler(gen):
    """The check itself has power: a sampler that ignores rejections is caught."""
    p, q = _dists(gen)
    B = SIZES[-1]
    biased = torch.multinomial(q, B, replacement=True, generator=gen)  # q instead of p
    with pytest.raises(AssertionError):
        _assert_lossless(lambda n: biased[:n], p, gen)
