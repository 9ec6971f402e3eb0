#!/usr/bin/env python3
"""An experiment (docs/design/budget.md, "What `ngram` still pays, sampled"), not shipped: for a
single row of ``ngram``, look up first (up to the free limit, 16) and ask the budget policy only
when the lookup found a draft, dropping the draft when the policy says k = 0.  A/B against the
shipped order (policy, then lookup) in one process: two ``ngram`` pipelines, the zoo target,
batch 1, 64 new tokens, 1 thread, the suite's first 3 prompts per workload, ROUNDS rounds,
alternated; prints the speed ratio, the paired geometric mean with its 95% interval, and how
many outputs were identical (greedy: all must be).

Usage: python scripts/ab/lookup_first.py TEMPERATURE ROUNDS
"""
import math
import statistics as st
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speed_ceiling import WORKLOADS, prompts  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402

torch.set_num_threads(1)

def lookup_first_step(self, batch, eos_ids):
    """``Engine.step`` with the lookup before the policy (one row, a model-free strategy); the
    stages after drafting are ``Engine.step``'s own, repeated here so that only the order of
    budget and drafting differs between the two sides of the A/B."""
    prof = self.profiler.start()
    ctx = self._prepare(batch)
    rows = batch.active_rows()
    proposal, budget = None, None
    if self.bound.propose is not None and not self.failures.backing_off():
        room = rows[0].room() - 1
        free = max(0, min(16, room))
        if free > 0:
            ctx.sequences = tuple(tuple(r.tokens) for r in rows)
            ctx.max_draft_list, ctx.max_draft, ctx.free_max_draft_list = [free], torch.tensor([free]), None
            ctx.min_confidence, ctx.budget_by_source = torch.tensor([0.0]), {}
            batch.limits = [free]
            proposal = self._propose(ctx, batch)
            if proposal is not None:
                budget = self._budget(ctx, batch)
                if budget is None or max(batch.limits) == 0 or int(budget.max_draft[0]) == 0:
                    proposal = None
    prof.lap("budget")
    prof.lap("draft")
    start = self.runner.lengths
    nodes = proposal.node_rows() if proposal is not None else None
    parents = proposal.parent_rows() if proposal is not None else None
    out = self.runner.verify_forward(batch.last_tokens(), proposal, nodes, parents)
    prof.lap("verify_forward")
    accepted, emitted, paths = self._verify(ctx, batch, proposal, out)
    prof.lap("verify")
    depths = proposal.depth_rows() if proposal is not None else None
    outputs = self._commit(batch, start, depths, accepted, emitted, paths, out, eos_ids)
    prof.lap("commit")
    if budget is None:
        ctx.max_draft_list = [0]
    self._record(ctx, batch, budget, proposal, depths, accepted, outputs, out, prof)
    return outputs

temp, rounds = float(sys.argv[1]), int(sys.argv[2])
texts = [t for w in WORKLOADS for t in prompts(w, 3)]
a = MTPPipeline.from_pretrained(None, strategy="ngram")
b = MTPPipeline.from_pretrained(None, strategy="ngram")
b.engine.step = types.MethodType(lookup_first_step, b.engine)
for p in (a, b):
    p.generate(texts[0], max_new_tokens=8)
logs, ta, tb = [], 0.0, 0.0
same = 0
for r in range(rounds):
    for i, t in enumerate(texts):
        order = (a, b) if (r + i) % 2 == 0 else (b, a)
        res = {}
        for p in order:
            t0 = time.perf_counter()
            o = p.generate(t, max_new_tokens=64, ignore_eos=True, temperature=temp)
            res[id(p)] = (time.perf_counter() - t0, o.token_ids)
        da, db = res[id(a)][0], res[id(b)][0]
        ta, tb = ta + da, tb + db
        logs.append(math.log(da / db))
        same += res[id(a)][1] == res[id(b)][1]
m, se = st.mean(logs), st.stdev(logs) / math.sqrt(len(logs))
print(f"t={temp}: lookup-first / shipped speed {ta/tb:.3f}x, paired geo {math.exp(m):.3f} (95% {math.exp(m-1.96*se):.3f}-{math.exp(m+1.96*se):.3f}), identical outputs {same}/{len(logs)}")
