"""Fused RMSNorm and rotary embedding (``cpu_norm_rope.c``) against their PyTorch
references: the rotary kernel must equal HF's op sequence bit for bit (the target's exact
forward relies on it), the norm must agree to float32 rounding and be row-independent."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import poison_empty
from lightspec_kernels import cpu_norm_rope

needs_kernel = pytest.mark.skipif(not cpu_norm_rope.available(),
                                  reason=f"CPU kernel unavailable: {cpu_norm_rope.reason()}")


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1, 384), (2, 7, 64), (5, 24), (3, 4, 1000), (1, 1, 1)])
def test_rms_norm_matches_reference_and_rows_are_independent(gen, monkeypatch, shape):
    poison_empty(monkeypatch)
    x = torch.randn(*shape, generator=gen) * 3
    r = torch.randn(*shape, generator=gen)
    w = torch.randn(shape[-1], generator=gen)
    y = cpu_norm_rope.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(y, cpu_norm_rope.rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    s, y2 = cpu_norm_rope.rms_norm(x, w, 1e-6, r)
    s_ref, y2_ref = cpu_norm_rope.rms_norm_ref(x, w, 1e-6, r)
    assert torch.equal(s, s_ref)  # the fused add rounds as a plain add
    torch.testing.assert_close(y2, y2_ref, rtol=1e-5, atol=1e-6)
    rows = x.reshape(-1, shape[-1])
    alone = torch.cat([cpu_norm_rope.rms_norm(row[None], w, 1e-6) for row in rows])
    assert torch.equal(alone, y.reshape(-1, shape[-1]))
    bound = cpu_norm_rope.bind_rms_norm(w, 1e-6)
    assert torch.equal(bound(x), y)
    bs, by = bound(x, r)
    assert torch.equal(bs, s) and torch.equal(by, y2)


@needs_kernel
@pytest.mark.parametrize("B,N,Q,D", [(1, 6, 1, 64), (2, 12, 5, 64), (3, 2, 4, 8), (1, 4, 16, 128)])
def test_rotary_is_hf_bit_for_bit(gen, monkeypatch, B, N, Q, D):
    poison_empty(monkeypatch)
    x = torch.randn(B, Q, N, D, generator=gen).transpose(1, 2)  # HF's layout: a transposed view
    cos, sin = torch.randn(B, Q, D, generator=gen), torch.randn(B, Q, D, generator=gen)
    half = D // 2
    hf = x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin[:, None]
    got = cpu_norm_rope.rotary(x, cos, sin)
    assert got.is_contiguous() and torch.equal(got, hf)
    assert torch.equal(cpu_norm_rope.rotary(x[:1], cos[:1], sin[:1]), hf[:1])
    assert torch.equal(cpu_norm_rope.rotary(x, cos[:1], sin[:1]), x * cos[:1, None] +
                       torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin[:1, None])  # cos shared by the batch


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"weight has shape \(5,\), expected \(4,\)"):
        cpu_norm_rope.rms_norm(torch.zeros(2, 4), torch.zeros(5), 1e-6)
    with pytest.raises(ValueError, match="residual has shape"):
        cpu_norm_rope.rms_norm(torch.zeros(2, 4), torch.zeros(4), 1e-6, torch.zeros(3, 4))
    with pytest.raises(ValueError, match="do not fit"):
        cpu_norm_rope.rotary(torch.zeros(1, 2, 3, 8), torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))
    with pytest.raises(ValueError, match=r"rotary needs x \[B, N, Q, D\]"):
        cpu_norm_rope.rotary(torch.zeros(2, 3, 8), torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))


def test_forcing_torch_runs_the_references(gen, monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")
    x, w = torch.randn(3, 16, generator=gen), torch.randn(16, generator=gen)
    assert torch.equal(cpu_norm_rope.rms_norm(x, w, 1e-5), cpu_norm_rope.rms_norm_ref(x, w, 1e-5))
    assert torch.equal(cpu_norm_rope.bind_rms_norm(w, 1e-5)(x), cpu_norm_rope.rms_norm_ref(x, w, 1e-5))
