#!/usr/bin/env python3
"""The suite's batch-1 greedy cell only, for one target/draft pair: a quick A/B between models.

Usage: python scripts/ab/b1_slice.py MODEL DRAFT OUT.json [STRATEGY ...]
  e.g. python scripts/ab/b1_slice.py zoo/build/models/target-copy3 zoo/src/lightspec_zoo/models/draft /tmp/new.json

Runs `lightspec bench --suite default --limit 5 --threads 1` restricted to batch 1, temperature 0
(HF vanilla, prompt lookup and assisted generation included, all in lockstep), writes the bench
JSON and prints each strategy's speed-up over HF vanilla per workload and over all of them.
Different models run in different processes, so compare ratios, not tokens/s.
"""
import json
import sys

import lightspec_core.bench as bench
import torch

model, draft, out = sys.argv[1:4]
strategies = tuple(sys.argv[4:]) or ("none", "ngram", "draft_model", "hybrid")
torch.set_num_threads(1)
bench.SUITE_CONFIGS = [(1, 0.0)]
bench.main(model=model, draft_model=draft, strategies=strategies, suite="default", limit=5, repeat=1,
           json_out=out, max_new_tokens=64)
tokens: dict[str, int] = {}
seconds: dict[str, float] = {}
for wname, w in json.load(open(out))["runs"][0]["workloads"].items():
    rows = {r["name"]: r for r in w["results"] if not r["error"]}
    for name, r in rows.items():
        tokens[name] = tokens.get(name, 0) + r["tokens"]
        seconds[name] = seconds.get(name, 0.0) + r["seconds"]
    print(f"{wname:11s}", "  ".join(f"{s} {rows[s]['speedup_vs_hf']:.2f}x" for s in strategies if s in rows))
base = tokens["hf_vanilla"] / seconds["hf_vanilla"]
print(f"{'overall':11s}", "  ".join(f"{s} {tokens[s] / seconds[s] / base:.2f}x" for s in strategies if s in tokens))
