#!/usr/bin/env python3
"""Lockstep A/B of the CPU weight layout: the zoo models loaded as HF stores them
(``cpu_layout=False``) against LightSpec's column-major layout, HF vanilla (batch 1) and
LightSpec strategies on each, all in one lockstep run (``bench.run_lockstep``).

Usage: python scripts/ab/weight_layout.py TEMPERATURE ROUNDS BATCH STRATEGIES
  e.g. python scripts/ab/weight_layout.py 0.0 2 1 none,ngram,hybrid
Prints tokens/s per workload ("RES" lines); docs/benchmarks.md quotes the ratios.
"""
import sys

import torch
from lightspec_core.pipeline import MTPPipeline, default_draft_path, default_model_path, load_model
from transformers import AutoTokenizer

from lightspec_core import bench

torch.set_num_threads(1)
temp, reps, bs, strats = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
dev = torch.device("cpu")
tok = AutoTokenizer.from_pretrained(str(default_model_path()))
models = {lay: (load_model(default_model_path(), dev, torch.float32, cpu_layout=lay == "t"),
                load_model(default_draft_path(), dev, torch.float32, cpu_layout=lay == "t")) for lay in ("std", "t")}
methods = []
for lay, (t, d) in models.items():
    if bs == 1:
        methods.append(bench.HFMethod(t, f"hf_{lay}", {}, temp, dev))
    for s in strats:
        methods.append(bench.LightSpecMethod(MTPPipeline(t, tok, strategy=s, draft_model=d), f"{s}_{lay}", temp))
sets = bench.load_prompt_sets(None, "default", 8)
for w, ps in sets.items():
    ids = [tok(p)["input_ids"] for p in ps[:5 if bs == 1 else 8]]
    for m in methods:
        m.result.tokens, m.result.seconds = 0, 0.0
        m.warm_up(ids[0])
    chunks = [ids[i:i + bs] for i in range(0, len(ids), bs)]
    rounds = [(r, c) for r in range(reps) for c in chunks]
    for i, (r, chunk) in enumerate(rounds):
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        bench.run_lockstep(order, chunk, 64, None, r == 0, dev, {})
    print(f"RES {w:10}", " ".join(f"{m.result.name} {m.result.tokens_per_s:.1f}" for m in methods), flush=True)
