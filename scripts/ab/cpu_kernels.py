#!/usr/bin/env python3
"""LightSpec's CPU kernels against PyTorch on the zoo target (1 thread, float32).

1. products: all the target's projections for one step (7 blocks of q/k/v, o, gate/up,
   down, and the lm_head), M rows at once, through ``torch.mm`` on column-major float32
   weights (the layout LightSpec used before) and through ``cpu_linear`` on packed weights;
2. steps: the exact lean target forward over a 400-token cache for q = 1, 2, 4, 8 new
   tokens, on the model with the kernels installed (``load_model``'s default) and on the
   model as LightSpec loaded it before them (column-major weights, SDPA, PyTorch norms),
   interleaved in random order; median milliseconds.

Usage: python scripts/ab/cpu_kernels.py [ROUNDS]     (docs/benchmarks.md quotes it)
"""
import random
import statistics
import sys
import time

import torch
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target
from lightspec_core.pipeline import default_model_path, load_model
from lightspec_core.weight_layout import use_cpu_layout
from lightspec_kernels import cpu_linear

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
print(f"kernel ISA: {cpu_linear.isa()} ({cpu_linear.reason() or 'available'})")

# 1. products
base = load_model(default_model_path(), torch.device("cpu"), torch.float32, cpu_layout=False)
use_cpu_layout(base, packed=False)
linears = [m for m in base.modules() if isinstance(m, torch.nn.Linear)]
pairs = [(m.weight, cpu_linear.bind(cpu_linear.pack(m.weight.detach()))) for m in linears]
print(f"products of one step: {len(pairs)} matrices, {sum(w.numel() for w, _ in pairs) / 1e6:.1f}M weights")
with torch.inference_mode():
    for M in (1, 2, 4, 8, 16, 64, 256):
        xs = {k: torch.randn(M, k) for k in {w.shape[1] for w, _ in pairs}}
        torch_ms, packed_ms = [], []
        for _ in range(max(3, rounds // (1 + M // 16))):
            t = time.perf_counter()
            for w, _ in pairs:
                torch.mm(xs[w.shape[1]], w.t())
            torch_ms.append(time.perf_counter() - t)
            t = time.perf_counter()
            for w, fn in pairs:
                fn(xs[w.shape[1]])
            packed_ms.append(time.perf_counter() - t)
        a, b = statistics.median(torch_ms) * 1e3, statistics.median(packed_ms) * 1e3
        print(f"  M={M:3d}  torch.mm {a:7.2f} ms  packed {b:7.2f} ms  x{a / b:.2f}")

# 2. steps
models = {"kernels": load_model(default_model_path(), torch.device("cpu"), torch.float32), "before": base}
caches = {}
with torch.inference_mode():
    for name, model in models.items():
        lean = exact_lean_target(model)
        assert lean is not None, name
        kv = KVCache(lean, 1, torch.device("cpu"), capacity=1024)
        kv.forward(torch.randint(0, model.config.vocab_size, (1, 400)))
        caches[name] = kv
    times = {(n, q): [] for n in caches for q in (1, 2, 4, 8)}
    for _ in range(rounds):
        keys = list(times)
        random.shuffle(keys)
        for n, q in keys:
            ids = torch.randint(0, 8192, (1, q))
            for _ in range(3):
                t = time.perf_counter()
                caches[n].forward(ids)
                times[(n, q)].append(time.perf_counter() - t)
                caches[n].truncate(torch.tensor([400]))
print("lean target step over 400 cached tokens (median ms; c = cost / cost at q=1):")
for q in (1, 2, 4, 8):
    before, after = statistics.median(times[("before", q)]), statistics.median(times[("kernels", q)])
    c_before = before / statistics.median(times[("before", 1)])
    c_after = after / statistics.median(times[("kernels", 1)])
    print(f"  q={q}  before {before * 1e3:6.2f} ms (c={c_before:.2f})  kernels {after * 1e3:6.2f} ms (c={c_after:.2f})"
          f"  x{before / after:.2f}")
