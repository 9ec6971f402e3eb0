"""EAGLE-3's draft layer in one C call (``cpu_two_stream``): close to its PyTorch reference
(outputs, and the keys and values written into the slabs) for one and several rows, one
and several new tokens, causal or masked, with and without ``norm_before_residual``; bad
ids, positions and weights are refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from lightspec_kernels import cpu_decoder, cpu_linear, cpu_two_stream

needs_kernel = pytest.mark.skipif(not cpu_two_stream.available(),
                                  reason=f"CPU kernel unavailable: {cpu_decoder.reason()}")

HIDDEN, VOCAB, N_POS = 48, 50, 64


def _layer_args(gen, H, G, D, inter, half, bias, nbr):
    def w(rows, cols):
        t = torch.randn(rows, cols, generator=gen) / cols**0.5
        return t.half().float() if half else t

    block = cpu_decoder.BlockWeights(
        qkv=cpu_linear.pack(w((H + 2 * G) * D, 2 * HIDDEN)), o=cpu_linear.pack(w(HIDDEN, H * D)),
        gate_up=cpu_linear.pack(w(2 * inter, HIDDEN)), down=cpu_linear.pack(w(HIDDEN, inter)),
        norm1=1 + 0.1 * torch.randn(HIDDEN, generator=gen), norm2=1 + 0.1 * torch.randn(HIDDEN, generator=gen),
        eps1=1e-6, eps2=1e-5, o_bias=torch.randn(HIDDEN, generator=gen) * 0.1 if bias else None)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(N_POS).float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return (block, H, G, D, D ** -0.5, 1 + 0.1 * torch.randn(HIDDEN, generator=gen), 1e-6,
            1 + 0.1 * torch.randn(HIDDEN, generator=gen), 1e-5, nbr, torch.randn(VOCAB, HIDDEN, generator=gen),
            ang.cos().contiguous(), ang.sin().contiguous())


@needs_kernel
@pytest.mark.parametrize("B,q,cols,H,G,half,bias,nbr,masked", [
    (1, 1, 17, 2, 1, False, False, False, False),
    (1, 4, 0, 4, 2, True, False, True, False),
    (3, 3, 9, 4, 4, False, True, False, True),
    (2, 1, 5, 2, 2, True, False, True, True),
])
def test_layer_equals_the_reference(B, q, cols, H, G, half, bias, nbr, masked):
    gen = torch.Generator().manual_seed(B * 100 + q * 10 + cols)
    D, inter, cap = 16, 32, 40
    args = _layer_args(gen, H, G, D, inter, half, bias, nbr)
    layer = cpu_two_stream.TwoStreamLayer(*args)
    ids = torch.randint(0, VOCAB, (B, q), generator=gen)
    positions = cols + torch.arange(q)[None].expand(B, q).contiguous() + torch.arange(B)[:, None]
    g = torch.randn(B, q, HIDDEN, generator=gen)
    slabs = [torch.randn(B, G, cap, D, generator=gen) for _ in range(2)]
    mask = None
    if masked:  # each row sees a random subset of the cache, and the new tokens causally (itself always)
        mask = torch.rand(B, q, cols + q, generator=gen) < 0.7
        mask[:, :, cols:] = torch.ones(q, q, dtype=torch.bool).tril()
    k_c, v_c = (s.clone() for s in slabs)
    k_r, v_r = (s.clone() for s in slabs)
    h, out = layer.run(ids, positions, g, k_c[:, :, : cols + q], v_c[:, :, : cols + q], cols, mask)
    h_ref, out_ref = cpu_two_stream.two_stream_layer_ref(*args, ids, positions, g, k_r, v_r, cols, mask)
    torch.testing.assert_close(h, h_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out, out_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(k_c, k_r, atol=1e-6, rtol=1e-6)  # new columns written, the rest untouched
    torch.testing.assert_close(v_c, v_r, atol=1e-6, rtol=1e-6)
    assert torch.equal(k_c[:, :, cols + q:], slabs[0][:, :, cols + q:])


@needs_kernel
def test_a_4d_mask_reads_as_the_3d_one():
    gen = torch.Generator().manual_seed(1)
    args = _layer_args(gen, 2, 1, 16, 32, False, False, False)
    layer = cpu_two_stream.TwoStreamLayer(*args)
    ids, positions = torch.tensor([[3, 4]]), torch.tensor([[6, 7]])
    g = torch.randn(1, 2, HIDDEN, generator=gen)
    mask = torch.rand(1, 2, 8, generator=gen) < 0.6
    mask[:, :, 6:] = torch.tensor([[True, False], [True, True]])
    outs = []
    for m in (mask, mask[:, None]):
        k, v = torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16)
        outs.append(layer.run(ids, positions, g, k, v, 6, m)[0])
    assert torch.equal(outs[0], outs[1])


@needs_kernel
def test_bad_ids_positions_and_weights_are_refused_before_anything_is_written():
    gen = torch.Generator().manual_seed(2)
    args = _layer_args(gen, 2, 1, 16, 32, False, False, False)
    layer = cpu_two_stream.TwoStreamLayer(*args)
    g = torch.randn(1, 1, HIDDEN)
    k, v = torch.zeros(1, 1, 4, 16), torch.zeros(1, 1, 4, 16)
    with pytest.raises(IndexError, match="token id"):
        layer.run(torch.tensor([[VOCAB]]), torch.tensor([[0]]), g, k, v, 0)
    with pytest.raises(IndexError, match="position"):
        layer.run(torch.tensor([[1]]), torch.tensor([[N_POS]]), g, k, v, 0)
    assert not k.any() and not v.any()
    with pytest.raises(ValueError, match="slab view"):
        layer.run(torch.tensor([[1]]), torch.tensor([[0]]), g, k, v, 4)  # no column left for the new token
    with pytest.raises(ValueError, match="mask"):
        layer.run(torch.tensor([[1]]), torch.tensor([[0]]), g, k, v, 0, torch.ones(1, 1, 3, dtype=torch.bool))
    block = args[0]
    wrong = cpu_decoder.BlockWeights(cpu_linear.pack(torch.randn(64, HIDDEN)), block.o, block.gate_up, block.down,
                                     block.norm1, block.norm2, 1e-6, 1e-6)
    with pytest.raises(ValueError, match=r"qkv is \[64, 48\], expected \[64, 96\]"):
        cpu_two_stream.TwoStreamLayer(wrong, *args[1:])
    odd = cpu_decoder.BlockWeights(block.qkv, block.o, cpu_linear.pack(torch.randn(2 * 24, HIDDEN)),
                                   cpu_linear.pack(torch.randn(HIDDEN, 24)), block.norm1, block.norm2, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="intermediate size 24"):
        cpu_two_stream.TwoStreamLayer(odd, *args[1:])
