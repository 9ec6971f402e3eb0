"""The CPU attention kernel (``cpu_attention.c``) against its PyTorch reference, and the
exactness properties the target's forward relies on: one query's result does not depend
on the other queries, on the batch, or on how the mask is given (``torch.equal``)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import poison_empty
from lightspec_kernels import cpu_attention

needs_kernel = pytest.mark.skipif(not cpu_attention.available(),
                                  reason=f"CPU kernel unavailable: {cpu_attention.reason()}")

SHAPES = [  # B, H, H_kv, Q, C, D
    (1, 6, 6, 1, 401, 64),
    (1, 6, 6, 4, 404, 64),
    (2, 4, 2, 3, 37, 16),
    (1, 8, 2, 5, 20, 8),
    (3, 4, 4, 1, 1, 24),
    (2, 2, 1, 16, 130, 128),
    (4, 12, 4, 2, 33, 80),
    (1, 2, 2, 37, 60, 64),  # more queries than one group of 16 (the kernel's blocking)
    (2, 2, 1, 18, 18, 96),  # a head size with a 64-wide slice group and two single slices
    (1, 3, 3, 9, 41, 32),
]


def qkv(gen, B, H, Hkv, Q, C, D, strided=True):
    q = torch.randn(B, Q, H, D, generator=gen).transpose(1, 2)  # HF's layout: a transposed view
    if strided:  # a cache slab with spare capacity, viewed up to C columns
        k = torch.randn(B, Hkv, C + 7, D, generator=gen)[:, :, :C]
        v = torch.randn(B, Hkv, C + 7, D, generator=gen)[:, :, :C]
    else:
        k, v = torch.randn(B, Hkv, C, D, generator=gen), torch.randn(B, Hkv, C, D, generator=gen)
    return q, k, v


def causal_bool(B, Q, C):
    cols = torch.arange(C)
    return (cols[None, :] <= torch.arange(Q)[:, None] + C - Q)[None, None].expand(B, 1, Q, C)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(gen, monkeypatch, shape):
    poison_empty(monkeypatch)
    B, H, Hkv, Q, C, D = shape
    q, k, v = qkv(gen, B, H, Hkv, Q, C, D)
    padded = torch.rand(B, 1, 1, C, generator=gen) > 0.2  # padding holes, per row
    masks = [None, causal_bool(B, Q, C) & padded,
             torch.zeros(B, 1, Q, C).masked_fill(~(causal_bool(B, Q, C) & padded), float("-inf")),
             torch.randn(B, H, Q, C, generator=gen)]  # a general additive bias, per head
    for mask in masks:
        for causal in (True, False):
            got = cpu_attention.attention(q, k, v, mask, scale=0.3, causal=causal)
            ref = cpu_attention.attention_ref(q, k, v, mask, scale=0.3, causal=causal)
            assert got.shape == (B, Q, H, D) and not got.isnan().any()
            torch.testing.assert_close(got, ref, rtol=2e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_verify_reproduces_one_token_steps_and_mask_forms_agree(gen, shape):
    B, H, Hkv, Q, C, D = shape
    q, k, v = qkv(gen, B, H, Hkv, Q, C, D)
    wide = cpu_attention.attention(q, k, v, None, causal=True)
    as_bool = cpu_attention.attention(q, k, v, causal_bool(B, Q, C))
    as_float = cpu_attention.attention(q, k, v, torch.zeros(B, 1, Q, C).masked_fill(~causal_bool(B, Q, C), float("-inf")))
    assert torch.equal(wide, as_bool) and torch.equal(wide, as_float)
    for i in range(Q):  # query i alone over the columns it sees, as a one-token step would run it
        cols = C - Q + i + 1
        one = cpu_attention.attention(q[:, :, i : i + 1], k[:, :, :cols], v[:, :, :cols], None, causal=True)
        assert torch.equal(one[:, 0], wide[:, i]), i
    for b in range(B):  # a batch row alone
        assert torch.equal(cpu_attention.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1]), wide[b : b + 1])


@needs_kernel
def test_rows_that_see_nothing_get_zeros_and_contiguous_inputs_work(gen):
    q, k, v = qkv(gen, 2, 4, 2, 3, 10, 16, strided=False)
    mask = torch.ones(2, 1, 3, 10, dtype=torch.bool)
    mask[1, 0, 2] = False
    out = cpu_attention.attention(q.contiguous(), k, v, mask)
    assert torch.equal(out[1, 2], torch.zeros(4, 16))
    torch.testing.assert_close(out, cpu_attention.attention_ref(q, k, v, mask), rtol=2e-5, atol=2e-6)


def test_bad_inputs_are_named():
    q, k = torch.zeros(1, 6, 1, 8), torch.zeros(1, 4, 5, 8)
    with pytest.raises(ValueError, match="6 query heads cannot share 4"):
        cpu_attention.attention(q, k, k)
    with pytest.raises(ValueError, match="differ in shape"):
        cpu_attention.attention(torch.zeros(1, 4, 1, 8), k, torch.zeros(1, 4, 6, 8))
    with pytest.raises(ValueError, match="mask must be 4-D"):
        cpu_attention.attention(torch.zeros(1, 4, 1, 8), k, k, torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        cpu_attention.attention(torch.zeros(1, 4, 2, 8), k, k, torch.ones(1, 1, 3, 5, dtype=torch.bool))


def test_forcing_torch_runs_the_reference(gen, monkeypatch):
    q, k, v = qkv(gen, 1, 2, 2, 2, 9, 16)
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")
    assert torch.equal(cpu_attention.attention(q, k, v), cpu_attention.attention_ref(q, k, v))


def test_reference_agrees_with_sdpa(gen):
    q, k, v = qkv(gen, 2, 4, 2, 3, 12, 16)
    mask = causal_bool(2, 3, 12)
    ref = cpu_attention.attention_ref(q, k, v, mask)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(ref, sdpa, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_threads_do_not_change_the_numbers(gen):
    q, k, v = qkv(gen, 2, 4, 2, 64, 300, 64)  # a prefill: big enough to be split over threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_attention.attention(q, k, v)
        torch.set_num_threads(3)
        three = cpu_attention.attention(q, k, v)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, three)
