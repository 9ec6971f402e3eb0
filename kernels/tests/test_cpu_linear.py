"""The packed CPU linear kernel (``cpu_linear.c``) against its PyTorch reference.

The kernel must be exact in a stronger sense than "close": a row's result may not depend
on how many rows were computed with it (a verify over q tokens must give a one-token step's
numbers), so those checks are ``torch.equal``; against ``F.linear`` only the summation
order differs, so those are ``allclose``.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import poison_empty
from lightspec_kernels import _cpu_build, cpu_linear

needs_kernel = pytest.mark.skipif(not cpu_linear.available(), reason=f"CPU kernel unavailable: {cpu_linear.reason()}")


def weight(gen, n, k, half):
    w = torch.randn(n, k, generator=gen) * k**-0.5
    return w.half().float() if half else w


@needs_kernel
@pytest.mark.parametrize("half", [True, False], ids=["f16", "f32"])
@pytest.mark.parametrize("n,k", [(1, 1), (15, 7), (16, 384), (17, 100), (1000, 384), (384, 1024), (8192, 384), (32001, 64)])
def test_matches_reference_and_rows_are_independent(gen, monkeypatch, half, n, k):
    poison_empty(monkeypatch)  # an output element the kernel forgets stays NaN
    w = weight(gen, n, k, half)
    packed = cpu_linear.pack(w)
    assert packed.data.dtype == (torch.float16 if half else torch.float32)
    assert torch.equal(packed.unpack(), w)
    bias = torch.randn(n, generator=gen) if n % 2 else None
    x = torch.randn(21, k, generator=gen)
    full = cpu_linear.packed_linear(x, packed, bias)
    ref = F.linear(x, w, bias)
    assert full.shape == (21, n) and not full.isnan().any()
    torch.testing.assert_close(full, ref, rtol=1e-4, atol=1e-4 * k**0.5)
    torch.testing.assert_close(full, cpu_linear.packed_linear_ref(x, packed, bias), rtol=1e-4, atol=1e-4 * k**0.5)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 20):  # every row tile and remainder
        assert torch.equal(cpu_linear.packed_linear(x[:m], packed, bias), full[:m]), m
    assert torch.equal(cpu_linear.packed_linear(x[5:6], packed, bias), full[5:6])


@needs_kernel
def test_threads_do_not_change_the_numbers(gen):
    w = weight(gen, 1000, 384, True)
    packed = cpu_linear.pack(w)
    x = torch.randn(64, 384, generator=gen)  # big enough to be split over threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, bound_one = cpu_linear.packed_linear(x, packed), cpu_linear.bind(packed)(x)
        torch.set_num_threads(3)
        three, bound_three = cpu_linear.packed_linear(x, packed), cpu_linear.bind(packed)(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, three) and torch.equal(one, bound_one) and torch.equal(one, bound_three)
    assert torch.equal(one[:3], cpu_linear.packed_linear(x[:3], packed))


@needs_kernel
def test_batched_and_strided_inputs(gen):
    w = weight(gen, 48, 32, True)
    packed = cpu_linear.pack(w)
    x = torch.randn(3, 5, 64, generator=gen)[..., ::2]  # [3, 5, 32], not contiguous
    y = cpu_linear.packed_linear(x, packed)
    assert y.shape == (3, 5, 48)
    torch.testing.assert_close(y, F.linear(x, w))
    rows = x.reshape(-1, 32)
    assert torch.equal(y.reshape(-1, 48), torch.cat([cpu_linear.packed_linear(r[None], packed) for r in rows]))
    assert cpu_linear.packed_linear(torch.zeros(0, 32), packed).shape == (0, 48)


@needs_kernel
def test_bind_equals_the_dispatcher(gen, monkeypatch):
    w = weight(gen, 100, 64, False)
    bias = torch.randn(100, generator=gen)
    packed = cpu_linear.pack(w)
    poison_empty(monkeypatch)
    fn = cpu_linear.bind(packed, bias)
    for shape in [(1, 64), (4, 64), (2, 3, 64)]:
        x = torch.randn(*shape, generator=gen)
        assert torch.equal(fn(x), cpu_linear.packed_linear(x, packed, bias))


def test_pack_chooses_half_only_when_exact(gen):
    exact = weight(gen, 32, 8, True)
    assert cpu_linear.pack(exact).data.dtype == torch.float16
    assert cpu_linear.pack(exact, half=False).data.dtype == torch.float32
    inexact = exact + 1e-7
    assert cpu_linear.pack(inexact).data.dtype == torch.float32
    with pytest.raises(ValueError, match="half=True"):
        cpu_linear.pack(inexact, half=True)
    with pytest.raises(ValueError, match="2-D"):
        cpu_linear.pack(torch.zeros(4))
    with pytest.raises(ValueError, match="float64"):
        cpu_linear.pack(torch.zeros(4, 4, dtype=torch.float64))


def test_cat_and_adjacent(gen):
    parts = [cpu_linear.pack(weight(gen, n, 24, True)) for n in (32, 16, 40)]
    whole = cpu_linear.cat(parts)
    assert torch.equal(whole.unpack(), torch.cat([p.unpack() for p in parts]))
    assert cpu_linear.adjacent(parts) is None  # separate buffers: no view possible
    views, start = [], 0
    for p in parts:  # the parts as views of the whole, the way lightspec_core lays them out
        b = p.data.shape[0]
        views.append(cpu_linear.PackedWeight(whole.data[start : start + b], p.out_features, p.in_features))
        start += b
    joined = cpu_linear.adjacent(views)
    assert joined is not None and joined.data.data_ptr() == whole.data.data_ptr()
    assert torch.equal(joined.unpack(), whole.unpack()) and joined.out_features == 88
    assert cpu_linear.adjacent(views[::-1]) is None
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_linear.cat([parts[2], parts[0]])


def test_bad_inputs_are_named():
    packed = cpu_linear.pack(torch.zeros(16, 8))
    with pytest.raises(ValueError, match="x has 9 features, the weight expects 8"):
        cpu_linear.packed_linear(torch.zeros(2, 9), packed)
    with pytest.raises(ValueError, match=r"bias has shape \(15,\), expected \(16,\)"):
        cpu_linear.packed_linear(torch.zeros(2, 8), packed, torch.zeros(15))


def test_forcing_torch_runs_the_reference(gen, monkeypatch):
    w = weight(gen, 40, 16, False)
    packed = cpu_linear.pack(w)
    x = torch.randn(3, 16, generator=gen)
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")
    assert torch.equal(cpu_linear.packed_linear(x, packed), F.linear(x, w))
    assert torch.equal(cpu_linear.bind(packed)(x), F.linear(x, w))


def test_float64_input_takes_the_reference(gen):
    w = weight(gen, 16, 8, False)
    x = torch.randn(2, 8, dtype=torch.float64, generator=gen)
    y = cpu_linear.packed_linear(x, cpu_linear.pack(w))
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, F.linear(x, w.double()))


def test_build_failures_are_reported_not_raised(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LIGHTSPEC_CPU_KERNEL", "0")
    assert _cpu_build.build(cpu_linear._SOURCE) == (None, "disabled by LIGHTSPEC_CPU_KERNEL=0")
    monkeypatch.delenv("LIGHTSPEC_CPU_KERNEL")
    monkeypatch.setattr(_cpu_build, "compiler", lambda: None)
    lib, why = _cpu_build.build(cpu_linear._SOURCE)
    assert lib is None and "no C compiler" in why
    monkeypatch.setattr(_cpu_build, "compiler", lambda: "false")  # a "compiler" that always fails
    lib, why = _cpu_build.build(cpu_linear._SOURCE)
    assert lib is None and "failed" in why


@needs_kernel
def test_build_is_cached_by_source_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTSPEC_CACHE_DIR", str(tmp_path))
    lib, why = _cpu_build.build(cpu_linear._SOURCE)
    assert lib is not None and why is None
    built = list(tmp_path.glob("cpu_linear-*.so"))
    assert len(built) == 1
    stamp = os.stat(built[0]).st_mtime_ns
    assert _cpu_build.build(cpu_linear._SOURCE)[0] is not None
    assert os.stat(built[0]).st_mtime_ns == stamp  # reused, not rebuilt


@needs_kernel
def test_the_source_compiles_for_avx2_as_well(tmp_path):
    """The AVX2 + F16C path (no AVX-512), compiled and run here: the same numbers."""
    cc = _cpu_build.compiler()
    out = tmp_path / "avx2.so"
    flags = [f for f in _cpu_build.FLAGS if f != "-march=native"]
    subprocess.run([cc, *flags, "-mavx2", "-mf16c", "-mfma", "-o", str(out), str(cpu_linear._SOURCE), "-lpthread"],
                   check=True)
    import ctypes

    lib = ctypes.CDLL(str(out))
    assert lib.ls_isa() == 1
    lib.ls_linear_f16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    gen = torch.Generator().manual_seed(1)
    w = weight(gen, 50, 40, True)
    packed = cpu_linear.pack(w)
    x = torch.randn(5, 40, generator=gen)
    y = torch.full((5, 50), float("nan"))
    lib.ls_linear_f16(x.data_ptr(), 5, 40, 40, packed.data.data_ptr(), 50, None, y.data_ptr(), 50, 1)
    assert torch.equal(y, cpu_linear.packed_linear(x, packed))


def test_every_source_compiles_for_both_instruction_sets(tmp_path):
    """Each C source has an AVX2 and an AVX-512 branch (``LS_VW``); a machine runs only one
    of them, so both are compiled here (not run: the CPU may lack AVX-512)."""
    import platform

    cc = _cpu_build.compiler()
    if platform.machine() != "x86_64" or cc is None:
        pytest.skip("no x86-64 C compiler here")
    src = cpu_linear._SOURCE.parent
    flags = [f for f in _cpu_build.FLAGS if f != "-march=native"] + ["-Werror", "-Wall", "-Wno-psabi"]
    for isa in (["-mavx2", "-mf16c", "-mfma"], ["-mavx512f", "-mavx2", "-mf16c", "-mfma"]):
        for source in sorted(src.glob("cpu_*.c")):
            out = tmp_path / f"{source.stem}{len(isa)}.so"
            run = subprocess.run([cc, *flags, *isa, "-o", str(out), str(source), "-lpthread"], capture_output=True, text=True)
            assert run.returncode == 0, f"{source.name} {' '.join(isa)}:\n{run.stderr}"


def test_every_cpu_kernel_builds_where_it_can():
    """Where a C compiler and AVX2 exist (CI here), a kernel that fails to compile must fail
    the suite: otherwise every test of it would only be skipped."""
    import platform

    from lightspec_kernels import cpu_attention, cpu_norm_rope

    if platform.machine() != "x86_64" or _cpu_build.compiler() is None or " avx2" not in _cpu_build.cpu_flags():
        pytest.skip("no x86-64 CPU with AVX2 and a C compiler here")
    for module in (cpu_linear, cpu_attention, cpu_norm_rope):
        assert module.available(), module.reason()


@needs_kernel
@pytest.mark.parametrize("half", [True, False], ids=["f16", "f32"])
@pytest.mark.parametrize("n,k,m", [(1, 5, 1), (17, 7, 3), (191, 64, 2), (193, 64, 9), (8192, 384, 3), (8192, 384, 24)])
def test_the_fused_argmax_is_the_argmax_of_the_kernels_own_outputs(gen, half, n, k, m):
    """``bind(...).argmax(x)`` equals ``argmax`` over ``bind(...)(x)``: the first maximum in
    column order, across strip boundaries and thread counts (also for rows with ties and
    NaNs, which count as the largest value, as in torch.argmax)."""
    w = weight(gen, n, k, half)
    bias = torch.randn(n, generator=gen) if n % 2 else None
    fn = cpu_linear.bind(cpu_linear.pack(w), bias)
    x = torch.randn(2, m, k, generator=gen)
    assert torch.equal(fn.argmax(x), fn(x).argmax(-1))
    assert fn.argmax(x).shape == (2, m) and fn.argmax(x).dtype == torch.int64
    assert torch.equal(fn.argmax(x), cpu_linear.linear_argmax_ref(x, cpu_linear.pack(w), bias))
    # ties: the same best value in several columns (a zero weight row ties every column at the bias)
    wt = w.clone()
    wt[:] = 0.0
    flat = cpu_linear.bind(cpu_linear.pack(wt))
    assert torch.equal(flat.argmax(x), torch.zeros(2, m, dtype=torch.int64))
    # NaN: the first NaN wins over any number, later columns too
    if n > 2:
        xn = x.clone()
        wn = w.clone()
        wn[n - 1, 0] = float("nan")
        wn[n // 2, 0] = float("nan")
        nan_fn = cpu_linear.bind(cpu_linear.pack(wn, half=False))
        assert torch.equal(nan_fn.argmax(xn), torch.full((2, m), n // 2, dtype=torch.int64))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(fn.argmax(x), fn(x).argmax(-1))
    finally:
        torch.set_num_threads(old)
