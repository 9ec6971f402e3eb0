import lightspec_kernels as lk
import pytest
import torch
from kernel_helpers import poison_empty

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _compare(out, ref, dtype):
    assert torch.isfinite(out.max_prob).all() and torch.isfinite(out.entropy).all()
    torch.testing.assert_close(out.lse, ref.lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.max_prob, ref.max_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.entropy, ref.entropy, rtol=1e-4, atol=1e-4)
    assert torch.equal(out.topk_ids, ref.topk_ids)
    torch.testing.assert_close(out.topk_probs, ref.topk_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "N,V,k,temp",
    [(1, 32001, 16, 1.0), (64, 300, 5, 0.7), (3, 151936, 8, 1.3), (9, 4099, 0, 1.0), (2, 17, 16, 2.0)],
)
def test_matches_reference(gen, monkeypatch, force_triton, dtype, N, V, k, temp):
    logits = (torch.randn((N, V), generator=gen) * 4).to(dtype)
    logits[0, : V // 3] = float("-inf")  # masked vocabulary part (first block all -inf)
    ref = lk.confidence_stats_ref(logits, temp, k)
    poison_empty(monkeypatch)
    out = lk.confidence_stats(logits, temperature=temp, top_k=k)
    assert out.topk_ids.shape == (N, k) and out.topk_probs.shape == (N, k)
    _compare(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_go_to_lower_index(gen, monkeypatch, force_triton, dtype):
    # few distinct values: top-k selection must break ties by ascending index
    logits = torch.randint(0, 4, (5, 3001), generator=gen).to(dtype)
    ref = lk.confidence_stats_ref(logits, 1.0, 16)
    poison_empty(monkeypatch)
    out = lk.confidence_stats(logits, top_k=16)
    _compare(out, ref, dtype)
    top = logits.float().max(dim=1).values
    first = [int((logits[i].float() == top[i]).nonzero()[0]) for i in range(5)]
    assert out.topk_ids[:, 0].tolist() == first


def test_reference_values_by_hand(force_torch):
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, float("-inf")]])
    out = lk.confidence_stats(logits, top_k=2)
    p1 = torch.softmax(logits[1], 0)
    torch.testing.assert_close(out.max_prob, torch.tensor([0.25, float(p1[0])]))
    torch.testing.assert_close(out.entropy[0], torch.tensor(float(torch.log(torch.tensor(4.0)))))
    ent1 = -(p1[:3] * p1[:3].log()).sum()
    torch.testing.assert_close(out.entropy[1], ent1)
    assert out.topk_ids.tolist() == [[0, 1], [0, 1]]
    torch.testing.assert_close(out.lse[0], torch.log(torch.tensor(4.0)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "N,V,k,splits,block", [(3, 32001, 16, 4, 4096), (5, 4099, 8, 3, 1024), (2, 17, 16, 2, 16), (4, 3001, 0, 3, 512)]
)
def test_split_vocabulary_matches_reference(gen, monkeypatch, dtype, N, V, k, splits, block):
    """The split path (S programs per row + combine kernel, used on GPUs for small N)."""
    logits = (torch.randn((N, V), generator=gen) * 3).to(dtype)
    logits[0, : V // 2] = float("-inf")  # whole chunks of -inf
    if N > 1:
        logits[1] = torch.randint(0, 3, (V,), generator=gen).to(dtype)  # ties across chunks
    ref = lk.confidence_stats_ref(logits, 0.9, k)
    poison_empty(monkeypatch)
    out = lk.confidence_stats_triton(logits, 0.9, k, num_splits=splits, block_v=block)
    _compare(out, ref, dtype)
