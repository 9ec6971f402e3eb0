#!/usr/bin/env python3
"""Per-step statistics of one strategy on one workload (batch 1, greedy, 64 new tokens, 1 thread):
tokens per verify, drafted and accepted per step, milliseconds per step split into target and draft
forwards, and, for n-gram lookup, why steps went without a draft (no match, or a match its learned
statistics cut to nothing).

Usage: python scripts/ab/step_log.py WORKLOAD STRATEGY [PROMPTS]
  e.g. python scripts/ab/step_log.py edit ngram 16
"""
import collections
import sys

import lightspec_zoo
import torch
from lightspec_core.pipeline import MTPPipeline, default_draft_path, default_model_path, load_model
from lightspec_core.strategies import ngram
from transformers import AutoTokenizer

workload, strategy = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else 16
why = collections.Counter()
lookup, cut = ngram._RowIndex.lookup, ngram.NgramDrafter._cut


def counted_lookup(self, seq, limit, committed):
    n, draft = lookup(self, seq, limit, committed)
    why["lookup: no match" if not draft else f"lookup: match class {n}"] += 1
    return n, draft


def counted_cut(self, n, draft, learned=True):
    kept = cut(self, n, draft, learned)
    if not kept:
        why[f"cut to nothing: match class {n}"] += 1
    return kept


ngram._RowIndex.lookup, ngram.NgramDrafter._cut = counted_lookup, counted_cut
torch.set_num_threads(1)
dev = torch.device("cpu")
tok = AutoTokenizer.from_pretrained(str(default_model_path()))
target = load_model(default_model_path(), dev, torch.float32)
draft = load_model(default_draft_path(), dev, torch.float32)
steps = []
pipe = MTPPipeline(target, tok, strategy=strategy, draft_model=draft)
pipe.bound.sinks.append(lambda event: steps.append(event) if getattr(event, "kind", None) == "step" else None)
prompts = lightspec_zoo.prompt_sets()[workload][:limit]
pipe.generate(prompts[0], max_new_tokens=16)  # warm-up
steps.clear()
why.clear()
for p in prompts:
    pipe.generate(p, max_new_tokens=64)
n = len(steps)
emitted = sum(sum(s.emitted) for s in steps)
seconds = sum(s.step_time_s for s in steps)
print(f"{workload} {strategy}: {n} steps, {emitted} tokens, {emitted / n:.2f} tokens/verify, "
      f"drafted {sum(s.drafted[0] for s in steps) / n:.2f}/step, accepted {sum(s.accepted[0] for s in steps) / n:.2f}/step, "
      f"{seconds / n * 1e3:.2f} ms/step (target {sum(s.target_forward_s for s in steps) / n * 1e3:.2f}, "
      f"draft {sum(s.draft_forward_s for s in steps) / n * 1e3:.2f}), {emitted / seconds:.0f} tokens/s")
by_len = collections.defaultdict(list)
for s in steps:
    by_len[s.drafted[0]].append(s.accepted[0])
print("drafted: steps, mean accepted |", "  ".join(f"{k}: {len(v)}, {sum(v) / len(v):.1f}" for k, v in sorted(by_len.items())))
print("sources |", dict(collections.Counter(s.sources[0] or "(none)" for s in steps)))
if why:
    print("n-gram lookups |", dict(why))
