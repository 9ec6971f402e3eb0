#!/usr/bin/env python3
"""What one target forward over q new tokens costs against a one-token step (the zoo target, exact
lean path, batch 1, 1 thread, over a 400-token cache; q = 1..16 interleaved in random order).

Usage: python scripts/ab/verify_width.py [ROUNDS]
Prints the median milliseconds and c(q) = cost / cost(q=1) per width; docs/benchmarks.md quotes them.
"""
import random
import sys
import time

import torch
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target
from lightspec_core.pipeline import default_model_path, load_model

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
model = load_model(default_model_path(), torch.device("cpu"), torch.float32)
lean = exact_lean_target(model)
kv = KVCache(lean if lean is not None else model, 1, torch.device("cpu"), capacity=1024)
CTX = 400
with torch.inference_mode():
    kv.forward(torch.randint(0, model.config.vocab_size, (1, CTX)))
    widths = list(range(1, 17))
    times: dict[int, list[float]] = {q: [] for q in widths}
    for _ in range(rounds):
        random.shuffle(widths)
        for q in widths:
            ids = torch.randint(0, model.config.vocab_size, (1, q))
            for _ in range(3):
                t = time.perf_counter()
                kv.forward(ids)
                times[q].append(time.perf_counter() - t)
                kv.truncate(torch.tensor([CTX]))
median = {q: sorted(v)[len(v) // 2] for q, v in times.items()}
for q in sorted(median):
    print(f"q={q:2d} {median[q] * 1e3:6.2f} ms  c={median[q] / median[1]:.2f}")
