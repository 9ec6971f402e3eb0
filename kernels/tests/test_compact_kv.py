import lightspec_kernels as lk
import pytest
import torch


def _case(B, T, M, gen, overlapping):
    keep = torch.full((B, M), -1, dtype=torch.long)
    dst = torch.zeros(B, dtype=torch.long)
    for b in range(B):
        m = int(torch.randint(0, M + 1, (), generator=gen))
        if overlapping:  # accepted-path style: dst < src, ranges overlap
            start = int(torch.randint(0, T - 2 * M, (), generator=gen))
            src = start + 1 + torch.sort(torch.randperm(2 * M - 1, generator=gen)[:m]).values
            dst[b] = start + 1
        else:  # arbitrary permutation-like gather
            src = torch.randperm(T, generator=gen)[:m]
            dst[b] = int(torch.randint(0, T - M + 1, (), generator=gen))
        keep[b, :m] = src
    # holes in the middle of the kept list
    holes = torch.rand((B, M), generator=gen) < 0.1
    keep[holes] = -1
    return keep, dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "B,H,T,D,M", [(1, 2, 40, 64, 7), (8, 4, 64, 80, 16), (64, 1, 48, 16, 3), (3, 2, 300, 128, 100)]
)
@pytest.mark.parametrize("overlapping", [True, False])
def test_matches_reference(gen, force_triton, dtype, B, H, T, D, M, overlapping):
    if T < 2 * M + 1:
        pytest.skip("shape too small for overlapping case")
    cache = torch.randn((B, H, T, D), generator=gen).to(dtype)
    keep, dst = _case(B, T, M, gen, overlapping)
    expect = cache.clone()
    lk.compact_kv_ref(expect, keep, dst)
    out = lk.compact_kv(cache, keep, dst)
    assert out is cache
    assert torch.equal(cache, expect)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_semantics_by_hand_bthd_and_scalar_dst(monkeypatch, backend):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", backend)
    T = 10
    cache = torch.arange(2 * T * 3 * 4, dtype=torch.float32).view(2, T, 3, 4)  # [B, T, H, D]
    orig = cache.clone()
    keep = torch.tensor([[3, 5, 9], [2, -1, 4]])
    lk.compact_kv(cache, keep, 3, seq_dim=1)
    assert torch.equal(cache[0, 3:6], orig[0, [3, 5, 9]])
    assert torch.equal(cache[1, 3], orig[1, 2]) and torch.equal(cache[1, 5], orig[1, 4])
    assert torch.equal(cache[1, 4], orig[1, 4])  # slot with -1 is not written
    untouched = [t for t in range(T) if t not in (3, 4, 5)]
    assert torch.equal(cache[:, untouched], orig[:, untouched])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seq_dim", [2, 1])
def test_layers_one_launch_matches_reference(gen, force_triton, dtype, seq_dim):
    B, H, T, D, M, L = 3, 2, 40, 48, 8, 4
    shape = (B, H, T, D) if seq_dim == 2 else (B, T, H, D)
    caches = [torch.randn(shape, generator=gen).to(dtype) for _ in range(L)]
    keep, dst = _case(B, T, M, gen, overlapping=True)
    expect = [c.clone() for c in caches]
    lk.compact_kv_layers_ref(expect, keep, dst, seq_dim)
    out = lk.compact_kv_layers(caches, keep, dst, seq_dim)
    assert all(o is c for o, c in zip(out, caches))
    for c, e in zip(caches, expect):
        assert torch.equal(c, e)
    # and the same as one compact_kv per cache
    single = [c.clone() for c in expect]
    for c in single:
        lk.compact_kv_ref(c, keep, dst, seq_dim)  # applying it again is the same operation on new data
    again = [c.clone() for c in caches]
    lk.compact_kv_layers(again, keep, dst, seq_dim)
    assert all(torch.equal(a, s) for a, s in zip(again, single))


def test_layers_reject_mixed_layouts(force_torch):
    keep = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"caches\[1\]: .*same layout as caches\[0\]"):
        lk.compact_kv_layers([torch.randn(1, 2, 8, 4), torch.randn(1, 2, 9, 4)], keep, 0)
    with pytest.raises(ValueError, match=r"caches\[1\]: cache: .*dtype torch.int64"):
        lk.compact_kv_layers([torch.randn(1, 2, 8, 4), torch.zeros(1, 2, 8, 4, dtype=torch.long)], keep, 0)
    with pytest.raises(ValueError, match="non-empty list"):
        lk.compact_kv_layers([], keep, 0)
