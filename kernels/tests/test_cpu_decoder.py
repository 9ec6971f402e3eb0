"""The chained decoder block (``cpu_decoder.c``): bit for bit what the same kernels give
when called one by one from Python, and close to the PyTorch reference; keys and values
land in the right cache columns; a masked (ragged) batch and a causal one agree."""

from __future__ import annotations

import pytest
import torch
from lightspec_kernels import cpu_attention, cpu_decoder, cpu_linear, cpu_norm_rope

needs_kernel = pytest.mark.skipif(not cpu_decoder.available(),
                                  reason=f"CPU kernel unavailable: {cpu_decoder.reason()}")


def _weights(gen, hidden, H, G, D, inter, half: bool, bias: bool, n: int = 2):
    def w(rows, cols):
        t = torch.randn(rows, cols, generator=gen) / cols**0.5
        return t.half().float() if half else t

    def b(rows):
        return torch.randn(rows, generator=gen) * 0.1 if bias else None

    return [cpu_decoder.BlockWeights(
        qkv=cpu_linear.pack(w((H + 2 * G) * D, hidden)), o=cpu_linear.pack(w(hidden, H * D)),
        gate_up=cpu_linear.pack(w(2 * inter, hidden)), down=cpu_linear.pack(w(hidden, inter)),
        norm1=1 + 0.1 * torch.randn(hidden, generator=gen), norm2=1 + 0.1 * torch.randn(hidden, generator=gen),
        eps1=1e-6, eps2=1e-5, qkv_bias=b((H + 2 * G) * D)) for _ in range(n)]


def _op_by_op(blocks, final, H, G, D, scale, h, k_slabs, v_slabs, cols, cos, sin, mask):
    """The same kernels called one at a time from Python (the lean forward's way)."""
    B, q, Hd = h.shape
    act = None
    for i, w in enumerate(blocks):
        if act is None:
            x = cpu_norm_rope.rms_norm(h, w.norm1, w.eps1)
        else:
            h, x = cpu_norm_rope.rms_norm(h, w.norm1, w.eps1, cpu_linear.packed_linear(act, blocks[i - 1].down))
        qkv = cpu_linear.packed_linear(x, w.qkv, w.qkv_bias).view(B, q, H + 2 * G, D)
        qk = cpu_norm_rope.rotary(qkv[:, :, : H + G].transpose(1, 2), cos, sin)
        k_slabs[i][:, :, cols : cols + q] = qk[:, H:]
        v_slabs[i][:, :, cols : cols + q] = qkv[:, :, H + G :].transpose(1, 2)
        C = cols + q
        o = cpu_attention.attention_cpu(qk[:, :H], k_slabs[i][:, :, :C], v_slabs[i][:, :, :C],
                                        None if mask is None else mask[:, None], scale)
        h, x = cpu_norm_rope.rms_norm(h, w.norm2, w.eps2, cpu_linear.packed_linear(o.reshape(B, q, -1), w.o))
        act = cpu_decoder.activation(cpu_linear.packed_linear(x, w.gate_up, w.gate_up_bias))
    return cpu_norm_rope.rms_norm(h, final, 1e-6, cpu_linear.packed_linear(act, blocks[-1].down))


@needs_kernel
@pytest.mark.parametrize("B,q,cols,H,G,half,bias,masked", [
    (1, 1, 37, 6, 6, False, False, False),
    (1, 5, 20, 4, 2, True, False, False),
    (3, 4, 9, 4, 1, False, True, True),
    (2, 1, 0, 2, 2, False, False, True),
])
def test_decoder_matches_op_by_op_bit_for_bit(gen, B, q, cols, H, G, half, bias, masked):
    hidden, D, inter, cap = 48, 16, 80, 64
    scale = D**-0.5
    blocks = _weights(gen, hidden, H, G, D, inter, half, bias)
    final = 1 + 0.1 * torch.randn(hidden, generator=gen)
    dec = cpu_decoder.Decoder(blocks, H, G, D, scale, final, 1e-6)
    h0 = torch.randn(B, q, hidden, generator=gen)
    cos, sin = torch.randn(B, q, D, generator=gen), torch.randn(B, q, D, generator=gen)
    C = cols + q
    mask = None
    if masked:  # ragged rows: random holes in the cache, causal among the new tokens
        mask = torch.rand(B, q, C, generator=gen) > 0.3
        mask[:, :, cols:] = torch.ones(q, q, dtype=torch.bool).tril()
    slabs = [(torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)) for _ in blocks]
    k_a, v_a = [k.clone() for k, _ in slabs], [v.clone() for _, v in slabs]
    k_b, v_b = [k.clone() for k, _ in slabs], [v.clone() for _, v in slabs]

    h_want, out_want = _op_by_op(blocks, final, H, G, D, scale, h0.clone(), k_a, v_a, cols, cos, sin, mask)

    h = h0.clone()
    act = None
    records = []
    for i in range(len(blocks)):
        rec = torch.empty_like(h)
        gu = dec.front(i, h, act, k_b[i], v_b[i], cols, cos, sin, mask, record=rec)
        records.append(rec)
        act = cpu_decoder.activation(gu)
    out = dec.tail(h, act)
    assert torch.equal(out, out_want) and torch.equal(h, h_want)
    assert torch.equal(records[0], h0)
    for i in range(len(blocks)):  # the new keys/values and nothing else were written
        assert torch.equal(k_b[i], k_a[i]) and torch.equal(v_b[i], v_a[i])
        untouched = torch.ones(cap, dtype=torch.bool)
        untouched[cols:C] = False
        assert torch.equal(k_b[i][:, :, untouched], slabs[i][0][:, :, untouched])


@needs_kernel
def test_decoder_close_to_pytorch_reference(gen):
    B, q, cols, H, G, D, hidden, inter, cap = 2, 3, 11, 4, 2, 16, 64, 96, 32
    scale = D**-0.5
    blocks = _weights(gen, hidden, H, G, D, inter, half=False, bias=True, n=1)
    final = torch.ones(hidden)
    dec = cpu_decoder.Decoder(blocks, H, G, D, scale, final, 1e-6)
    h0 = torch.randn(B, q, hidden, generator=gen)
    pos = torch.arange(cols, cols + q, dtype=torch.float32)[None, :, None] * torch.rand(D, generator=gen)
    cos, sin = pos.cos().expand(B, q, D).contiguous(), pos.sin().expand(B, q, D).contiguous()
    k0, v0 = torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)
    k1, v1 = k0.clone(), v0.clone()
    h_ref, gu_ref = cpu_decoder.block_front_ref(blocks[0], None, H, G, D, scale, h0, None, k0, v0, cols, cos, sin)
    h = h0.clone()
    gu = dec.front(0, h, None, k1, v1, cols, cos, sin)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gu, gu_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)
    act = cpu_decoder.activation(gu)
    h_ref2, out_ref = cpu_decoder.block_tail_ref(blocks[0].down, None, final, 1e-6, h_ref, act)
    torch.testing.assert_close(dec.tail(h, act), out_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, h_ref2, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_decoder_rejects_mismatched_weights(gen):
    blocks = _weights(gen, 32, 2, 2, 16, 64, half=False, bias=False, n=1)
    with pytest.raises(ValueError, match="qkv"):
        cpu_decoder.Decoder(blocks, 4, 2, 16, 0.25, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="at least one block"):
        cpu_decoder.Decoder([], 2, 2, 16, 0.25, torch.ones(32), 1e-6)


@needs_kernel
def test_packed_rows_equal_the_padded_slots_and_padding_gets_zero_keys(gen):
    """``rows``: only the real tokens of a ragged verify go through the products; their
    results equal those of the padded layout, bit for bit, and the padding slots' cache
    columns get zeros."""
    B, q, cols, H, G, D, hidden, inter, cap = 3, 4, 13, 4, 2, 16, 48, 80, 32
    blocks = _weights(gen, hidden, H, G, D, inter, half=False, bias=True)
    final = 1 + 0.1 * torch.randn(hidden, generator=gen)
    dec = cpu_decoder.Decoder(blocks, H, G, D, D**-0.5, final, 1e-6)
    lengths = torch.tensor([4, 1, 2])
    real = torch.arange(q)[None, :] < lengths[:, None]  # [B, q]
    C = cols + q
    mask = torch.rand(B, q, C, generator=gen) > 0.2
    mask[:, :, cols:] = torch.ones(q, q, dtype=torch.bool).tril()
    mask &= torch.cat([torch.ones(B, cols, dtype=torch.bool), real], 1)[:, None, :]  # padding columns hidden
    mask &= real[:, :, None]  # padding queries see nothing
    rows = real.reshape(-1).nonzero().squeeze(1)
    h0 = torch.randn(B, q, hidden, generator=gen)
    cos, sin = torch.randn(B, q, D, generator=gen), torch.randn(B, q, D, generator=gen)
    slabs = [(torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)) for _ in blocks]

    def run(packed: bool):
        ks, vs = [k.clone() for k, _ in slabs], [v.clone() for _, v in slabs]
        h = h0.reshape(B * q, hidden).index_select(0, rows) if packed else h0.clone()
        act, gus = None, []
        for i in range(len(blocks)):
            gu = dec.front(i, h, act, ks[i], vs[i], cols, cos, sin, mask, rows=rows if packed else None)
            gus.append(gu.clone())
            act = cpu_decoder.activation(gu)
        return dec.tail(h, act), gus, ks, vs

    out_p, gus_p, ks_p, vs_p = run(True)
    out_u, gus_u, ks_u, vs_u = run(False)
    flat = lambda t: t.reshape(B * q, -1).index_select(0, rows)  # noqa: E731
    assert torch.equal(out_p, flat(out_u))
    for a, b in zip(gus_p, gus_u):
        assert torch.equal(a, flat(b))
    for i in range(len(blocks)):
        new_k, new_v = ks_p[i][:, :, cols:C], vs_p[i][:, :, cols:C]  # [B, G, q, D]
        assert torch.equal(new_k[real[:, None, :].expand(B, G, q)], ks_u[i][:, :, cols:C][real[:, None, :].expand(B, G, q)])
        assert torch.equal(new_v[real[:, None, :].expand(B, G, q)], vs_u[i][:, :, cols:C][real[:, None, :].expand(B, G, q)])
        assert not new_k[~real[:, None, :].expand(B, G, q)].any() and not new_v[~real[:, None, :].expand(B, G, q)].any()


@needs_kernel
@pytest.mark.parametrize("inter", [16, 80, 1024])
def test_c_swiglu_rounds_as_pytorch_and_run_equals_the_block_loop(gen, inter):
    """``ls_silu_mul`` (the activation in C, one call per step) against PyTorch's silu and
    product, over magnitudes from 1e-6 to 1e4: the Decoder's probe says whether they agree
    bit for bit, and says it truthfully (PyTorch's vectorised exp is SLEEF's, which the C
    code reproduces; a size that leaves a scalar tail, such as 80 or 16, goes through the C
    library's exp there).  At the zoo target's size (1024) they agree on this machine."""
    B, q, cols, H, G, D, hidden, cap = 2, 3, 9, 2, 2, 16, 32, 16
    blocks = _weights(gen, hidden, H, G, D, inter, half=False, bias=False)
    dec = cpu_decoder.Decoder(blocks, H, G, D, D**-0.5, torch.ones(hidden), 1e-6)
    agree = True
    for scale in (1e-6, 0.3, 3.0, 30.0, 1e4):
        gate_up = torch.randn(5, 2 * inter, generator=gen) * scale
        got = torch.empty(5, inter)
        dec._silu_mul(gate_up.data_ptr(), 5, inter, got.data_ptr())
        agree = agree and torch.equal(got, cpu_decoder.activation(gate_up))
    assert dec.fused_activation == agree
    if inter == 1024:
        assert agree
    h0 = torch.randn(B, q, hidden, generator=gen)
    cos, sin = torch.randn(B, q, D, generator=gen), torch.randn(B, q, D, generator=gen)
    slabs = [(torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)) for _ in blocks]
    outs = []
    for fused in (agree, False):
        dec.fused_activation = fused
        ks, vs = [k.clone() for k, _ in slabs], [v.clone() for _, v in slabs]
        h = h0.clone()
        rec = {1: torch.empty_like(h)}
        outs.append((dec.run(h, ks, vs, cols, cos, sin, records=rec), h, rec[1], ks, vs))
    (o1, h1, r1, k1, v1), (o2, h2, r2, k2, v2) = outs
    assert torch.equal(o1, o2) and torch.equal(h1, h2) and torch.equal(r1, r2)
    assert all(torch.equal(a, b) for a, b in zip(k1 + v1, k2 + v2))


@needs_kernel
@pytest.mark.parametrize("fused", [True, False])
def test_row_offsets_equal_each_row_run_alone(gen, fused):
    """``offsets``: rows of different lengths, each packed from column 0, new keys and values
    written at each row's own offset.  Every row's output and cache must be what that row
    alone gives with its length as ``cols`` (causal, no mask), bit for bit."""
    hidden, H, G, D, inter, cap = 48, 4, 2, 32, 96, 64
    scale = D**-0.5
    blocks = _weights(gen, hidden, H, G, D, inter, half=True, bias=False)
    final = 1 + 0.1 * torch.randn(hidden, generator=gen)
    dec = cpu_decoder.Decoder(blocks, H, G, D, scale, final, 1e-6)
    if not fused:
        dec.fused_activation = False  # the per-block path passes the offsets too
    offsets = [13, 30, 0, 21]
    B, q = len(offsets), 3
    cols = max(offsets)
    h0 = torch.randn(B, q, hidden, generator=gen)
    cos, sin = torch.randn(B, q, D, generator=gen), torch.randn(B, q, D, generator=gen)
    slabs = [(torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)) for _ in blocks]
    C = cols + q
    off = torch.tensor(offsets)
    mask = (torch.arange(C)[None, None, :] <= off[:, None, None] + torch.arange(q)[None, :, None]).contiguous()
    ks, vs = [k.clone() for k, _ in slabs], [v.clone() for _, v in slabs]
    h = h0.clone()
    out = dec.run(h, ks, vs, cols, cos, sin, mask, offsets=off)
    for b, o in enumerate(offsets):
        k1, v1 = [k[b : b + 1].clone() for k, _ in slabs], [v[b : b + 1].clone() for _, v in slabs]
        h1 = h0[b : b + 1].clone()
        want = dec.run(h1, k1, v1, o, cos[b : b + 1].contiguous(), sin[b : b + 1].contiguous())
        assert torch.equal(out[b : b + 1], want), f"row {b}"
        assert torch.equal(h[b : b + 1], h1)
        for i in range(len(blocks)):
            assert torch.equal(ks[i][b, :, : o + q], k1[i][0, :, : o + q])
            assert torch.equal(vs[i][b, :, : o + q], v1[i][0, :, : o + q])
            # nothing written past the row's own new columns
            assert torch.equal(ks[i][b, :, o + q :], slabs[i][0][b, :, o + q :])


@needs_kernel
def test_row_offsets_reference(gen):
    """block_front_ref with offsets writes each row's keys at its own columns, as the kernel."""
    hidden, H, G, D, inter, cap = 48, 4, 2, 32, 96, 64
    blocks = _weights(gen, hidden, H, G, D, inter, half=False, bias=True, n=1)
    offsets = [5, 17]
    B, q, cols = 2, 2, 17
    h0 = torch.randn(B, q, hidden, generator=gen)
    cos, sin = torch.randn(B, q, D, generator=gen), torch.randn(B, q, D, generator=gen)
    k0, v0 = torch.randn(B, G, cap, D, generator=gen), torch.randn(B, G, cap, D, generator=gen)
    off = torch.tensor(offsets)
    C = cols + q
    mask = (torch.arange(C)[None, None, :] <= off[:, None, None] + torch.arange(q)[None, :, None]).contiguous()
    dec = cpu_decoder.Decoder(blocks, H, G, D, D**-0.5, torch.ones(hidden), 1e-6)
    kk, vk = k0.clone(), v0.clone()
    h = h0.clone()
    gate_up = dec.front(0, h, None, kk, vk, cols, cos, sin, mask, offsets=off).clone()
    kr, vr = k0.clone(), v0.clone()
    h_ref, gate_up_ref = cpu_decoder.block_front_ref(blocks[0], None, H, G, D, D**-0.5, h0.clone(), None, kr, vr,
                                                     cols, cos, sin, mask, offsets=offsets)
    torch.testing.assert_close(kk, kr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vk, vr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gate_up, gate_up_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
