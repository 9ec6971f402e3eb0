#!/usr/bin/env python3
"""Lockstep A/B of the sampling noise: -log(U) (``exponential_noise``, new) against
``Tensor.exponential_`` (old), one pipeline of each per strategy, switched per thread.

Usage: python scripts/ab/sampling_noise.py TEMPERATURE ROUNDS STRATEGIES BATCH
  e.g. python scripts/ab/sampling_noise.py 0.8 4 none,hybrid,ngram 8
Prints speed relative to the first strategy with the old noise ("RES" lines).
"""
import collections
import sys
import threading

import torch
from lightspec_core.pipeline import MTPPipeline, default_draft_path, default_model_path, load_model
from lightspec_core.strategies import model_drafter
from transformers import AutoTokenizer

from lightspec_core import bench, sampling, verify

torch.set_num_threads(1)
tls = threading.local()
new_fn = sampling.exponential_noise


def old_fn(generators, vocab, device):
    return torch.stack([torch.empty(vocab, device=device).exponential_(generator=g) for g in generators])


def switch(generators, vocab, device):
    return (old_fn if getattr(tls, "old", False) else new_fn)(generators, vocab, device)


verify.exponential_noise = model_drafter.exponential_noise = switch
temp, reps, strats, bs = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
dev = torch.device("cpu")
tok = AutoTokenizer.from_pretrained(str(default_model_path()))
target = load_model(default_model_path(), dev, torch.float32)
draft = load_model(default_draft_path(), dev, torch.float32)
pipes = {}
for s in strats:
    for v in ("old", "new"):
        p = MTPPipeline(target, tok, strategy=s, draft_model=draft)
        if v == "old":  # this pipeline's generations (each in its lockstep thread) use the old noise
            def gen(*a, _orig=p.generate, **k):
                tls.old = True
                try:
                    return _orig(*a, **k)
                finally:
                    tls.old = False
            p.generate = gen
        pipes[f"{s}_{v}"] = p
sets = bench.load_prompt_sets(None, "default", 8)
inverse = collections.defaultdict(float)
base = strats[0] + "_old"
for w, ps in sets.items():
    ids = [tok(p)["input_ids"] for p in ps[:8 if bs > 1 else 5]]
    res = bench.run_workload(target, draft, pipes, ids, 64, bs, temp, 10, False, dev, w, reps)
    r = {x.name: x.tokens_per_s for x in res}
    for k, v in r.items():
        inverse[k] += 1 / v
    print(f"RES t={temp} {w:10}", " ".join(f"{k} {v / r[base]:.3f}" for k, v in r.items()), flush=True)
print(f"RES t={temp} overall(harmonic)", " ".join(f"{k} {inverse[base] / v:.3f}" for k, v in inverse.items()), flush=True)
