#!/usr/bin/env python
"""Benchmark lightspec-kernels: each Triton kernel against its PyTorch reference.

    python kernels/bench.py [--json PATH] [--peak-gbps 4800]     # CUDA device
    python kernels/bench.py --cpu                                # tiny CPU sanity run (interpreter)

On CUDA it first checks every Triton kernel against the reference on the GPU, then
times both with ``triton.testing.do_bench`` (median) and prints a table; ``--json``
also writes the results.  For the kernels that stream logits/probabilities it reports
the bytes that must be read, the achieved GB/s and the time a perfect kernel would need
at ``--peak-gbps`` (H200 HBM3e: ~4800 GB/s).  Without CUDA (and without ``--cpu``) it
prints a message and exits 0.  The size grid is kept small so that compile, check and
timing fit in about three minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="write results as JSON to PATH")
    ap.add_argument("--cpu", action="store_true", help="tiny CPU sanity run through the Triton interpreter")
    ap.add_argument("--peak-gbps", type=float, default=4800.0, help="memory bandwidth used for the floor")
    ap.add_argument("--only", default="", help="comma-separated kernel names to run (default: all)")
    return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else parse_args([])
if ARGS.cpu:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
import lightspec_kernels as lk  # noqa: E402


@dataclass
class Case:
    kernel: str
    size: str
    make: Callable[[], tuple]  # -> (args, kwargs)
    triton_fn: Callable
    ref_fn: Callable
    check: Callable  # (out_triton, out_ref, args) -> (ok, detail)
    bytes_fn: Callable | None = None  # (args, out_ref) -> bytes that must be read
    inplace: bool = False  # kernel mutates its first argument (compact_kv)
    extra: dict = field(default_factory=dict)


def _probs(shape, dev, dtype=torch.float32, scale=3.0):
    return torch.softmax(torch.randn(shape, device=dev) * scale, dim=-1).to(dtype)


def _exp(B, V, dev):
    return torch.empty((B, V), device=dev).exponential_()


def _eq_tuple(a, b, args):
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if not torch.equal(x, y)]
    if not bad:
        return True, ""
    x, y = a[bad[0]], b[bad[0]]
    rows = (x != y).reshape(x.shape[0], -1).any(dim=1).sum().item() if x.dim() else 1
    return False, f"output {bad[0]} differs in {rows} rows"


def _check_conf(a, b, args):
    try:
        torch.testing.assert_close(a.lse, b.lse, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.max_prob, b.max_prob, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.entropy, b.entropy, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(a.topk_probs, b.topk_probs, rtol=1e-4, atol=1e-5)
    except AssertionError as exc:
        return False, str(exc).splitlines()[0]
    if not torch.equal(a.topk_ids, b.topk_ids):
        return False, f"topk_ids differ in {(a.topk_ids != b.topk_ids).any(1).sum().item()} rows"
    return True, ""


def confidence_cases(dev, cpu):
    grid = [
        (1, 32000, 16),
        (32, 32000, 16),
        (256, 32000, 16),
        (1, 151936, 16),
        (32, 151936, 16),
        (256, 151936, 16),
        (256, 151936, 0),
        (2048, 32000, 8),
    ]
    if cpu:
        grid = [(4, 3001, 8)]
    for N, V, k in grid:

        def make(N=N, V=V, k=k):
            return (torch.randn((N, V), device=dev).mul_(4).to(torch.bfloat16),), dict(temperature=0.8, top_k=k)

        yield Case(
            "confidence_stats",
            f"N={N} V={V} k={k} bf16",
            make,
            lk.confidence_stats_triton,
            lk.confidence_stats_ref,
            _check_conf,
            bytes_fn=lambda a, o: a[0][0].numel() * a[0][0].element_size(),
        )


def chain_cases(dev, cpu):
    grid = [(1, 4, 32000), (32, 8, 32000), (256, 4, 32000), (32, 8, 151936), (256, 16, 151936)]
    if cpu:
        grid = [(3, 4, 1000)]
    for mode in ("greedy", "sample", "sample_q"):
        for B, K, V in grid:

            def make(B=B, K=K, V=V, mode=mode):
                tp = _probs((B, K + 1, V), dev)
                dp = _probs((B, K, V), dev) if mode == "sample_q" else None
                src = tp[:, :K] if dp is None else dp
                drafts = torch.multinomial(src.reshape(-1, V), 1).view(B, K)
                if mode == "greedy":
                    drafts = torch.where(torch.rand((B, K), device=dev) < 0.9, tp[:, :K].argmax(-1), drafts)
                lens = torch.randint(0, K + 1, (B,), device=dev)
                lens[: B // 2 + 1] = K
                if mode == "greedy":
                    return (drafts, lens, tp), {}
                return (drafts, lens, tp, dp, torch.rand((B, K), device=dev), _exp(B, V, dev)), {}

            def nbytes(a, out, mode=mode):
                drafts, lens, tp = a[0][:3]
                V = tp.shape[2]
                if mode == "greedy":  # argmax of every position up to the draft length
                    return int((lens + 1).sum()) * V * tp.element_size()
                per_row = 2 + (a[0][3] is not None)  # p row, exponentials, q row
                return drafts.shape[0] * per_row * V * 4

            yield Case(
                "chain_verify",
                f"{mode} B={B} K={K} V={V}",
                make,
                lk.chain_verify_triton,
                lk.chain_verify_ref,
                _eq_tuple,
                bytes_fn=nbytes,
            )


def _tree_parents(B, N, dev, width):
    """Trees where node j hangs under node (j-1)//width: a complete `width`-ary tree."""
    j = torch.arange(N, device=dev)
    par = torch.where(j > 0, (j - 1) // width, -1)
    return par.expand(B, N).contiguous()


def tree_cases(dev, cpu):
    grid = [
        (1, 16, 32000, 4),
        (32, 16, 32000, 4),
        (32, 64, 32000, 2),
        (256, 16, 32000, 4),
        (32, 16, 151936, 4),
        (8, 64, 151936, 3),
    ]
    if cpu:
        grid = [(3, 8, 1000, 2)]
    for mode in ("greedy", "sample_q"):
        for B, N, V, width in grid:

            def make(B=B, N=N, V=V, width=width, mode=mode):
                parents = _tree_parents(B, N, dev, width)
                tp = _probs((B, N, V), dev)
                at_parent = parents.clamp(min=0)
                if mode == "greedy":
                    toks = tp.argmax(-1).gather(1, at_parent)  # every child = argmax of its parent
                    noise = torch.randint(0, V, (B, N), device=dev)
                    toks = torch.where(torch.rand((B, N), device=dev) < 0.7, toks, noise)
                    return (toks, parents, tp), {}
                dp = _probs((B, N, V), dev)
                q_par = dp[torch.arange(B, device=dev)[:, None], at_parent]  # [B, N, V]
                toks = torch.multinomial(q_par.reshape(-1, V), 1).view(B, N)
                return (toks, parents, tp, dp, torch.rand((B, N), device=dev), _exp(B, V, dev)), {}

            def nbytes(a, out, mode=mode):
                if mode != "greedy":
                    return None
                tp = a[0][2]
                return int((out.path_len + 1).sum()) * tp.shape[2] * tp.element_size()

            yield Case(
                "tree_verify",
                f"{mode} B={B} N={N} V={V} w={width}",
                make,
                lk.tree_verify_triton,
                lk.tree_verify_ref,
                _eq_tuple,
                bytes_fn=nbytes,
            )


def compact_cases(dev, cpu):
    grid = [(1, 8, 4096, 128, 16), (32, 8, 4096, 128, 16), (32, 8, 4096, 128, 64), (256, 8, 2048, 128, 16)]
    if cpu:
        grid = [(2, 2, 64, 32, 8)]
    for B, H, T, D, M in grid:

        def make(B=B, H=H, T=T, D=D, M=M):
            cache = torch.randn((B, H, T, D), device=dev, dtype=torch.bfloat16)
            start = torch.randint(0, T - 2 * M, (B,), device=dev)
            offs = torch.sort(torch.rand((B, 2 * M), device=dev), dim=1).indices[:, :M]
            keep = start[:, None] + 1 + torch.sort(offs, dim=1).values
            return (cache, keep, start + 1), {}

        def nbytes(a, out, M=M):
            cache = a[0][0]
            B, H, _, D = cache.shape
            return 2 * B * H * M * D * cache.element_size()  # read + write of the kept rows

        yield Case(
            "compact_kv",
            f"B={B} H={H} T={T} D={D} M={M} bf16",
            make,
            lk.compact_kv_triton,
            lk.compact_kv_ref,
            lambda a, b, args: (torch.equal(a, b), ""),
            bytes_fn=nbytes,
            inplace=True,
        )
    # all layers' K and V in one launch (vs one reference call per cache)
    lgrid = [(1, 8, 1024, 128, 16, 64), (32, 8, 1024, 128, 16, 64)] if not cpu else [(2, 2, 64, 32, 8, 4)]
    for B, H, T, D, M, L in lgrid:

        def make_layers(B=B, H=H, T=T, D=D, M=M, L=L):
            caches = [torch.randn((B, H, T, D), device=dev, dtype=torch.bfloat16) for _ in range(L)]
            start = torch.randint(0, T - 2 * M, (B,), device=dev)
            offs = torch.sort(torch.rand((B, 2 * M), device=dev), dim=1).indices[:, :M]
            keep = start[:, None] + 1 + torch.sort(offs, dim=1).values
            return (caches, keep, start + 1), {}

        def nbytes_layers(a, out, M=M):
            caches = a[0][0]
            B, H, _, D = caches[0].shape
            return 2 * len(caches) * B * H * M * D * caches[0].element_size()

        yield Case(
            "compact_kv_layers",
            f"L={L} B={B} H={H} T={T} D={D} M={M} bf16",
            make_layers,
            lk.compact_kv_layers_triton,
            lk.compact_kv_layers_ref,
            lambda a, b, args: (all(torch.equal(x, y) for x, y in zip(a, b)), ""),
            bytes_fn=nbytes_layers,
            inplace=True,
        )


def _clone(x):
    return [t.clone() for t in x] if isinstance(x, (list, tuple)) else x.clone()


def mask_cases(dev, cpu):
    grid = [(1, 16, 2048), (32, 64, 2048), (256, 16, 2048), (256, 64, 4096)]
    if cpu:
        grid = [(2, 8, 30)]
    for dtype in (torch.bool, torch.bfloat16):
        for B, N, P in grid:

            def make(B=B, N=N, P=P, dtype=dtype):
                return (_tree_parents(B, N, dev, 3), P, dtype), {}

            yield Case(
                "tree_attention_mask",
                f"B={B} N={N} prefix={P} {str(dtype)[6:]}",
                make,
                lk.tree_attention_mask_triton,
                lk.tree_attention_mask_ref,
                _eq_tuple,
            )


def all_cases(dev, cpu):
    for gen in (confidence_cases, chain_cases, tree_cases, compact_cases, mask_cases):
        yield from gen(dev, cpu)


def _time(fn, cpu):
    if cpu:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")


def main() -> int:
    if not ARGS.cpu and not torch.cuda.is_available():
        print("bench.py: no CUDA device; nothing to benchmark (use --cpu for a tiny interpreter sanity run).")
        return 0
    if not lk.HAS_TRITON:
        print("bench.py: triton is not installed; nothing to benchmark.")
        return 0
    dev = torch.device("cpu" if ARGS.cpu else "cuda")
    only = {s.strip() for s in ARGS.only.split(",") if s.strip()}
    torch.manual_seed(0)
    t0 = time.time()
    rows, failures = [], 0
    header = f"{'kernel':<20} {'size':<38} {'ok':<4} {'triton ms':>10} {'torch ms':>10} {'speedup':>8} {'GB/s':>8} {'floor ms':>9} {'x floor':>8}"
    print(
        f"device: {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu (interpreter)'}; "
        f"torch {torch.__version__}; peak {ARGS.peak_gbps:.0f} GB/s"
    )
    print(header)
    print("-" * len(header))
    for case in all_cases(dev, ARGS.cpu):
        if only and case.kernel not in only:
            continue
        args, kwargs = case.make()
        if case.inplace:
            ref_in = _clone(args[0])
            out_ref = case.ref_fn(ref_in, *args[1:], **kwargs)
            tri_in = _clone(args[0])
            out_tri = case.triton_fn(tri_in, *args[1:], **kwargs)
        else:
            out_ref = case.ref_fn(*args, **kwargs)
            out_tri = case.triton_fn(*args, **kwargs)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ok, detail = case.check(out_tri, out_ref, args)
        failures += not ok
        scratch = _clone(args[0]) if case.inplace else None

        first = scratch if case.inplace else args[0]

        def run_t(fn=case.triton_fn, first=first, rest=args[1:], kw=kwargs):
            return fn(first, *rest, **kw)

        def run_r(fn=case.ref_fn, first=first, rest=args[1:], kw=kwargs):
            return fn(first, *rest, **kw)

        t_tri = _time(run_t, ARGS.cpu)
        t_ref = _time(run_r, ARGS.cpu)
        nbytes = case.bytes_fn((args, kwargs), out_ref) if case.bytes_fn else None
        gbps = nbytes / (t_tri * 1e-3) / 1e9 if nbytes else None
        floor_ms = nbytes / (ARGS.peak_gbps * 1e9) * 1e3 if nbytes else None
        row = dict(
            kernel=case.kernel,
            size=case.size,
            correct=ok,
            detail=detail,
            triton_ms=t_tri,
            torch_ms=t_ref,
            speedup=t_ref / t_tri,
            bytes=nbytes,
            gbps=gbps,
            floor_ms=floor_ms,
            x_floor=(t_tri / floor_ms) if floor_ms else None,
        )
        rows.append(row)
        fmt = lambda v, f: (f % v) if v is not None else "-"  # noqa: E731
        print(
            f"{case.kernel:<20} {case.size:<38} {'yes' if ok else 'NO':<4} {t_tri:>10.4f} {t_ref:>10.4f} "
            f"{row['speedup']:>7.2f}x {fmt(gbps, '%8.0f'):>8} {fmt(floor_ms, '%9.4f'):>9} "
            f"{fmt(row['x_floor'], '%7.2f'):>7}{'x' if floor_ms else ' '}" + (f"  {detail}" if detail else ""),
            flush=True,
        )
        del args, out_ref, out_tri, scratch, first, run_t, run_r
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    total = time.time() - t0
    print(f"\n{len(rows)} cases, {failures} correctness failures, {total:.1f} s")
    if ARGS.json:
        meta = dict(
            device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            torch=torch.__version__,
            triton=__import__("triton").__version__,
            peak_gbps=ARGS.peak_gbps,
            seconds=total,
            failures=failures,
        )
        with open(ARGS.json, "w") as f:
            json.dump(dict(meta=meta, results=rows), f, indent=1)
        print(f"wrote {ARGS.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
