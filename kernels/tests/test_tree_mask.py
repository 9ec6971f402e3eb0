import lightspec_kernels as lk
import pytest
import torch
from kernel_helpers import poison_empty, random_parents


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,N,P", [(1, 1, 0), (2, 8, 5), (4, 33, 100), (64, 6, 17), (2, 64, 1000)])
def test_matches_reference(gen, monkeypatch, force_triton, dtype, B, N, P):
    parents = random_parents(B, N, gen)
    ref_mask, ref_pos = lk.tree_attention_mask_ref(parents, P, dtype)
    # bool: poison with both values, so an unwritten element cannot hide (NaN suffices for floats)
    for poison in (True, False) if dtype == torch.bool else (True,):
        with monkeypatch.context() as m:
            poison_empty(m, bool_value=poison)
            mask, pos = lk.tree_attention_mask(parents, P, dtype)
        assert mask.shape == (B, 1, N, P + N) and mask.dtype == dtype
        assert torch.equal(mask, ref_mask)
        assert torch.equal(pos, ref_pos)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_by_hand(monkeypatch, backend):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", backend)
    parents = torch.tensor([[-1, 0, 0, 1, -1]])  # node 4 is padding
    mask, pos = lk.tree_attention_mask(parents, 2)
    expect = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 0, 1, 0, 0],
            [1, 1, 1, 1, 0, 1, 0],
            [1, 1, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0, 0], expect)
    assert pos.tolist() == [[2, 3, 3, 4, 2]]
    fmask, _ = lk.tree_attention_mask(parents, 2, torch.bfloat16)
    assert (fmask[0, 0][expect] == 0).all()
    assert (fmask[0, 0][~expect] == torch.finfo(torch.bfloat16).min).all()
