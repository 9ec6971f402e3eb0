#!/usr/bin/env python3
"""``none`` against ``none`` that also feeds an unused `dynamic` policy every step, as
pipelines did before a strategy without a drafter stopped feeding its budget policy
(docs/design/budget.md, "Per-step cost of the policy itself").

Zoo target, batch 1, greedy, 1 thread, the suite's first ``--limit`` prompts per workload,
``--max-new-tokens`` new tokens; each prompt runs once per round on both pipelines in a random
order (seeded), for ``--rounds`` rounds; each generation is timed from call to return.  Prints
the ratio of the learning pipeline's total time to plain ``none``'s (> 1: the learning cost
that much), with a bootstrap 95% interval over the prompts.

Usage: python scripts/ab/none_learning.py [--limit 3] [--rounds 3] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from speed_ceiling import WORKLOADS, prompts  # noqa: E402
from standalone_ab import bootstrap  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402
from lightspec_core.budget import DynamicBudget  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pipes = {"none": MTPPipeline.from_pretrained(None, strategy="none"),
             "none+learning": MTPPipeline.from_pretrained(None, strategy="none")}
    policy = DynamicBudget()
    pipes["none+learning"].bound.sinks.insert(0, policy.lightspec_on_stats)
    texts = [t for w in WORKLOADS for t in prompts(w, a.limit)]
    for p in pipes.values():
        p.generate(texts[0], max_new_tokens=8)
    seconds = {n: [0.0] * len(texts) for n in pipes}
    rng = random.Random(a.seed)
    for _ in range(a.rounds):
        for i, text in enumerate(texts):
            order = list(pipes)
            rng.shuffle(order)
            for n in order:
                t0 = time.perf_counter()
                pipes[n].generate(text, max_new_tokens=a.max_new_tokens, ignore_eos=True)
                seconds[n][i] += time.perf_counter() - t0
    pairs = list(zip(seconds["none+learning"], seconds["none"]))
    lo, hi = bootstrap(pairs)
    print(f"none+learning / none: {sum(seconds['none+learning']) / sum(seconds['none']):.3f} "
          f"(95% {lo:.3f}-{hi:.3f}) over {len(texts)} prompts x {a.rounds} rounds")


if __name__ == "__main__":
    main()
