#!/usr/bin/env python3
"""What the `dynamic` policy's own per-step work costs end to end, in one process
(docs/design/budget.md, "Per-step cost of the policy itself"):

* ``none+learning``: ``none`` that also feeds an unused `dynamic` policy every step, as every
  pipeline did before a strategy without a drafter stopped feeding its policy; the line
  prints its time over plain ``none``'s (> 1: the learning cost that much);
* for each ``--strategy``: the shipped policy against ``every step``, the policy as it was
  before single rows rechecked (after a k = 0 decision one row decides again at the next
  step, and every step is learned when it arrives); the line prints every step / shipped
  (> 1: the recheck is faster), each against ``none``, and the tokens per step of both.

Zoo target, batch 1, greedy, 1 thread: every pipeline runs each of the suite's first
``--limit`` prompts per workload once per round in a random order (seeded), for
``--rounds`` rounds, each generation timed from call to return; paired ratios come with a
bootstrap 95% interval over the prompts.

Usage: python scripts/ab/policy_ab.py [--strategy eagle3 --strategy ngram ...] [--rounds 3]
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

LEARNING = "none+learning"


class EveryStep(DynamicBudget):
    """``dynamic`` as it was before single rows rechecked: one row decides at every step."""

    def lightspec_budget(self, ctx):
        budget = super().lightspec_budget(ctx)
        if ctx.batch == 1:
            self.recheck = self.recheck_rows = 0
        return budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", action="append", default=[])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pipes = {"none": MTPPipeline.from_pretrained(None, strategy="none"),
             LEARNING: MTPPipeline.from_pretrained(None, strategy="none")}
    pipes[LEARNING].bound.sinks.insert(0, DynamicBudget().lightspec_on_stats)
    for s in a.strategy:
        pipes[s] = MTPPipeline.from_pretrained(None, strategy=s)
        pipes[s + " every step"] = MTPPipeline.from_pretrained(None, strategy=s, budget=EveryStep())
    steps = {n: [0, 0] for n in pipes}
    for n, p in pipes.items():
        p.bound.sinks.append(lambda event, n=n: steps[n].__setitem__(0, steps[n][0] + 1) if event.kind == "step" else None)
    texts = [t for w in WORKLOADS for t in prompts(w, a.limit)]
    for n, p in pipes.items():
        p.generate(texts[0], max_new_tokens=8)
        steps[n] = [0, 0]
    seconds = {n: [0.0] * len(texts) for n in pipes}
    rng = random.Random(a.seed)
    for _ in range(a.rounds):
        for i, text in enumerate(texts):
            order = list(pipes)
            rng.shuffle(order)
            for n in order:
                t0 = time.perf_counter()
                out = pipes[n].generate(text, max_new_tokens=a.max_new_tokens, ignore_eos=True)
                seconds[n][i] += time.perf_counter() - t0
                steps[n][1] += len(out.token_ids) - 1
    total = {n: sum(v) for n, v in seconds.items()}
    tps = {n: steps[n][1] / max(1, steps[n][0]) for n in pipes}
    lo, hi = bootstrap(list(zip(seconds[LEARNING], seconds["none"])))
    print(f"{LEARNING} / none {total[LEARNING] / total['none']:.3f} (95% {lo:.3f}-{hi:.3f}) "
          f"over {len(texts)} prompts x {a.rounds} rounds")
    for s in a.strategy:
        old = s + " every step"
        lo, hi = bootstrap(list(zip(seconds[old], seconds[s])))
        print(f"{s:14s} every step / rechecking {total[old] / total[s]:.3f} (95% {lo:.3f}-{hi:.3f}); "
              f"vs none: rechecking {total['none'] / total[s]:.3f}, every step {total['none'] / total[old]:.3f}; "
              f"tokens/step {tps[s]:.2f} / {tps[old]:.2f}")


if __name__ == "__main__":
    main()
