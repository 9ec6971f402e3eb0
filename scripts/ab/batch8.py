#!/usr/bin/env python3
"""Lockstep A/B at batch 8: LightSpec strategies (built-in names or strategy YAML files)
against `none` on every workload of the default suite, all in one lockstep run per
workload (``bench.run_workload``, no HF baselines: they are batch-1 only).

Usage: python scripts/ab/batch8.py TEMPERATURE ROUNDS STRATEGIES [WORKLOADS]
  e.g. python scripts/ab/batch8.py 0.0 8 ngram,hybrid,draft_model
       python scripts/ab/batch8.py 0.8 8 hybrid,/tmp/hybrid_margin105.yaml code,edit
A name with a suffix "#N" is another pipeline of the same strategy ("none#2": a second
`none`, the control that shows this machine's noise); a suffix "@key=value" sets an option
of the dynamic budget ("hybrid@batch_margin=1.3": `hybrid` with a higher batch margin).  Prints each strategy's tokens/s
relative to `none` per workload and over all workloads ("RES" lines); docs/benchmarks.md
quotes them.
"""
import sys

import lightspec_zoo
import torch
from lightspec_core.pipeline import MTPPipeline, default_draft_path, default_model_path, load_model
from transformers import AutoTokenizer

from lightspec_core import bench

torch.set_num_threads(1)
temp, rounds, strats = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
dev = torch.device("cpu")
tok = AutoTokenizer.from_pretrained(str(default_model_path()))
target = load_model(default_model_path(), dev, torch.float32)
draft = load_model(default_draft_path(), dev, torch.float32)
sets = lightspec_zoo.prompt_sets()
wanted = sys.argv[4].split(",") if len(sys.argv) > 4 else list(sets)
names = ["none"] + [s for s in strats if s != "none"]


def make_pipe(name: str) -> MTPPipeline:
    strategy, _, option = name.split("#")[0].partition("@")
    budget = None
    if option:
        key, _, value = option.partition("=")
        budget = {"type": "dynamic", key: float(value) if "." in value else int(value)}
    return MTPPipeline(target, tok, strategy=strategy, draft_model=draft, budget=budget)


pipes = {name: make_pipe(name) for name in names}
totals = {name: [0, 0.0] for name in names}  # tokens, seconds
for wname in wanted:
    ids = [tok(p)["input_ids"] for p in sets[wname][:8]]
    results = bench.run_workload(target, draft, pipes, ids, 64, 8, temp, 10, False, dev, f"{wname} b8 t{temp}", rounds)
    by = {r.name: r for r in results}
    base = by["none"].tokens_per_s
    for name in names:
        totals[name][0] += by[name].tokens
        totals[name][1] += by[name].seconds
    print("RES", wname, " ".join(f"{n}={by[n].tokens_per_s / base:.3f}" for n in names if n != "none"), flush=True)
base = totals["none"][0] / totals["none"][1]
print("RES all", " ".join(f"{n}={totals[n][0] / totals[n][1] / base:.3f}" for n in names if n != "none"))
