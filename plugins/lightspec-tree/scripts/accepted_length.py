"""Mean accepted length (tokens emitted per decode step: accepted nodes + 1) at batch 1,
greedy, static budget k=16, fixed shapes (adaptive off): a tree vs the chain of the same drafter, on the zoo target and draft, the default suite's first 4 prompts of each
workload (spec_bench left out), 64 new tokens.  Acceptance only: timings do not enter it.

    python plugins/lightspec-tree/scripts/accepted_length.py     (one JSON line per configuration)
"""
import json

import lightspec_zoo
import torch
from lightspec_zoo import PROMPTS_DIR

from lightspec_core import MTPPipeline

torch.set_num_threads(1)
wls = ["code", "docstring", "edit", "prose"]
prompts = {w: [json.loads(line)["prompt"] for line in open(PROMPTS_DIR / f"{w}.jsonl") if line.strip()][:4] for w in wls}
tp, dp = lightspec_zoo.model_path(), lightspec_zoo.model_path("draft")
CH = [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]
TR = [[0], [1], [2], [0, 0], [1, 0], [2, 0], [0, 1], [0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0],
      [0, 0, 0, 0, 0]]
configs = [
    ("dynamic_tree chain (top_k 1, depth 5)", "dynamic_tree", dict(top_k=1, depth=5, adaptive=False)),
    ("dynamic_tree (top_k 4, depth 5, 16 nodes)", "dynamic_tree", dict(top_k=4, depth=5, total_tokens=16, adaptive=False)),
    ("dynamic_tree (top_k 2, depth 5, 10 nodes)", "dynamic_tree", dict(top_k=2, depth=5, total_tokens=10, adaptive=False)),
    ("static_tree ngram chain (depth 5)", "static_tree", dict(drafter="ngram", choices=CH, adaptive=False)),
    ("static_tree ngram (13 nodes, depth 5)", "static_tree", dict(drafter="ngram", choices=TR, adaptive=False)),
]
for label, strat, kw in configs:
    pipe = MTPPipeline.from_pretrained(tp, strategy=strat, draft_model=dp, budget={"type": "static", "k": 16}, **kw)
    row = {}
    for w in wls:
        outs = [pipe.generate(p, max_new_tokens=64, ignore_eos=True) for p in prompts[w]]
        row[w] = sum(len(o.token_ids) - 1 for o in outs) / sum(o.stats.steps for o in outs)
    row["mean"] = sum(row.values()) / len(row)
    print(json.dumps({"config": label, **{k: round(v, 2) for k, v in row.items()}}), flush=True)
