"""Milliseconds per decode step and tokens per step at batch 1, greedy, fixed budgets, the zoo
target and draft, 3 code prompts x 64 tokens, twice: plain decoding, the core's draft_model
chain, this plugin's chain (dynamic_tree top_k 1) and two dynamic trees, in one process.

    python plugins/lightspec-tree/scripts/step_cost.py
"""
import json
import time

import lightspec_zoo
import torch

from lightspec_core import MTPPipeline

torch.set_num_threads(1)
ps = [json.loads(line)["prompt"] for line in open(lightspec_zoo.PROMPTS_DIR / "code.jsonl")][:3]
tp, dp = lightspec_zoo.model_path(), lightspec_zoo.model_path("draft")
cfg = [("none", "none", None, {}), ("core draft_model k5", "draft_model", {"type": "static", "k": 5}, {}),
       ("tree chain k5", "dynamic_tree", {"type": "static", "k": 5}, dict(top_k=1, adaptive=False)),
       ("tree 4x5 16", "dynamic_tree", {"type": "static", "k": 16}, dict(top_k=4, adaptive=False)),
       ("tree 2x5 10", "dynamic_tree", {"type": "static", "k": 10}, dict(top_k=2, total_tokens=10, adaptive=False))]
pipes = {n: MTPPipeline.from_pretrained(tp, strategy=s, draft_model=dp, budget=b, **kw) for n, s, b, kw in cfg}
for p in pipes.values():
    p.generate(ps[0], max_new_tokens=8)
for _ in range(2):
    for n, p in pipes.items():
        t, steps, toks = time.perf_counter(), 0, 0
        for q in ps:
            o = p.generate(q, max_new_tokens=64, ignore_eos=True)
            steps += o.stats.steps
            toks += len(o.token_ids)
        dt = time.perf_counter() - t
        print(f"{n:22s} {toks/dt:7.1f} tok/s  {1000*dt/steps:6.2f} ms/step  {(toks-3)/steps:.2f} tok/step", flush=True)
