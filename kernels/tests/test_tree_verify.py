import lightspec_kernels as lk
import pytest
import torch
from kernel_helpers import exponentials, poison_empty, random_parents, softmax_probs


def _inputs(B, N, V, mode, dtype, gen):
    parents = random_parents(B, N, gen)
    tp = softmax_probs((B, N, V), gen, dtype=dtype)
    dp = softmax_probs((B, N, V), gen, dtype=dtype) if mode == "sample_q" else None
    at_parent = parents.clamp(min=0)[:, :, None].expand(B, N, V)
    src = (dp if dp is not None else tp).float().gather(1, at_parent)
    tokens = torch.multinomial(src.reshape(-1, V), 1, generator=gen).view(B, N)
    if mode == "greedy":
        tokens = torch.where(
            torch.rand((B, N), generator=gen) < 0.6, tp.float().gather(1, at_parent).argmax(-1), tokens
        )
    noise = torch.randint(0, V, (B, N), generator=gen)
    tokens = torch.where(torch.rand((B, N), generator=gen) < 0.85, tokens, noise)
    if mode == "greedy":
        return tokens, parents, tp, None, None, None
    return tokens, parents, tp, dp, torch.rand((B, N), generator=gen), exponentials(B, V, gen)


def _check_structure(res, tokens, parents, V):
    B, N = tokens.shape
    for b in range(B):
        n = int(res.path_len[b])
        path = res.path[b].tolist()
        assert all(x == -1 for x in path[n:])
        prev = 0
        for node in path[:n]:
            assert int(parents[b, node]) == prev  # a root-to-leaf chain
            prev = node
        assert 0 <= int(res.bonus[b]) < V


@pytest.mark.parametrize("mode", ["greedy", "sample", "sample_q"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,N,V", [(1, 8, 32001), (16, 15, 100), (4, 32, 1000), (64, 5, 40), (3, 1, 20)])
def test_matches_reference(gen, monkeypatch, force_triton, mode, dtype, B, N, V):
    args = _inputs(B, N, V, mode, dtype, gen)
    ref = lk.tree_verify_ref(*args)
    poison_empty(monkeypatch)
    out = lk.tree_verify(*args)
    assert out.path.shape == (B, N - 1)
    for name, a, r in zip(out._fields, out, ref):
        assert torch.equal(a, r), name
    _check_structure(out, args[0], args[1], V)


def test_greedy_by_hand(force_triton):
    # root -> {1: tok 5, 2: tok 7}; 2 -> {3: tok 1, 4: tok 2}; 4 -> {5: tok 3}
    V = 8
    parents = torch.tensor([[-1, 0, 0, 2, 2, 4]])
    tokens = torch.tensor([[0, 5, 7, 1, 2, 3]])
    argmax = [7, 0, 2, 0, 6, 0]  # target argmax at each node
    logits = torch.zeros(1, 6, V)
    for j, t in enumerate(argmax):
        logits[0, j, t] = 1.0
    res = lk.tree_verify(tokens, parents, logits)
    assert res.path.tolist() == [[2, 4, -1, -1, -1]]
    assert res.path_len.tolist() == [2]
    assert res.bonus.tolist() == [6]


def test_sampling_siblings_by_hand(force_triton):
    # one-hot drafts: child 1 (token 0, p = 0) is rejected, child 2 (token 1) is accepted
    # iff u[2] < r(1)/Z = 0.5 / 1; node 2 is a leaf so the bonus is argmax(p_2 / e)
    parents = torch.tensor([[-1, 0, 0]])
    tokens = torch.tensor([[0, 0, 1]])
    tp = torch.tensor([[[0.0, 0.5, 0.5], [1, 0, 0], [0.2, 0.3, 0.5]]])
    e = torch.tensor([[1.0, 1.0, 1.0]])
    res = lk.tree_verify(tokens, parents, tp, None, torch.tensor([[0.0, 0.3, 0.4]]), e)
    assert res.path.tolist() == [[2, -1]] and res.path_len.tolist() == [1] and res.bonus.tolist() == [2]
    res = lk.tree_verify(tokens, parents, tp, None, torch.tensor([[0.0, 0.3, 0.6]]), e)
    # u = 0.6 rejects token 1 too: residual p with tokens 0 and 1 removed -> token 2
    assert res.path_len.tolist() == [0] and res.bonus.tolist() == [2]


@pytest.mark.parametrize("B,N,V,splits,block", [(1, 8, 32001, 3, 4096), (5, 15, 1000, 4, 128), (3, 1, 20, 2, 16)])
def test_greedy_parallel_argmax_matches_reference(gen, monkeypatch, B, N, V, splits, block):
    """Small-batch greedy path: all node argmaxes first (split vocabulary), then the walk."""
    args = _inputs(B, N, V, "greedy", torch.bfloat16, gen)
    ref = lk.tree_verify_ref(*args)
    poison_empty(monkeypatch)
    out = lk.tree_verify_triton(*args, greedy_parallel=True, num_splits=splits, block_v=block)
    for name, a, r in zip(out._fields, out, ref):
        assert torch.equal(a, r), name


@pytest.mark.parametrize("mode", ["greedy", "sample_q"])
def test_qwen_vocabulary(gen, monkeypatch, force_triton, mode):
    """V = 151936 (Qwen2), fp16."""
    args = _inputs(2, 6, 151936, mode, torch.float16, gen)
    ref = lk.tree_verify_ref(*args)
    poison_empty(monkeypatch)
    out = lk.tree_verify(*args)
    for name, a, r in zip(out._fields, out, ref):
        assert torch.equal(a, r), name
