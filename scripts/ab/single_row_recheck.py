#!/usr/bin/env python3
"""The `dynamic` policy with and without a single row's recheck steps, in one process
(docs/design/budget.md, "Per-step cost of the policy itself").

Without: every decision of one row is the cost model's (after a k = 0 decision the row
decides again at the next step, and every step is learned when it arrives), as before
single rows rechecked.  With: the policy as shipped.  Zoo target, batch 1, greedy, 1 thread;
for each ``--strategy`` both pipelines, and ``none``, run each of the suite's first
``--limit`` prompts per workload once per round in a random order (seeded), for
``--rounds`` rounds, each generation timed from call to return.  Prints per strategy the
paired ratio without/with (> 1: the recheck is faster) with a bootstrap 95% interval over
the prompts, each against ``none``, and the tokens per step of both.

Usage: python scripts/ab/single_row_recheck.py --strategy eagle3 --strategy ngram [--rounds 3]
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


class EveryStep(DynamicBudget):
    """``dynamic`` as it was before single rows rechecked: one row decides at every step."""

    def lightspec_budget(self, ctx):
        budget = super().lightspec_budget(ctx)
        if ctx.batch == 1:
            self.recheck = self.recheck_rows = 0
        return budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", action="append", required=True)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pipes = {"none": MTPPipeline.from_pretrained(None, strategy="none")}
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
    for s in a.strategy:
        old = s + " every step"
        lo, hi = bootstrap(list(zip(seconds[old], seconds[s])))
        print(f"{s:14s} every step / rechecking {total[old] / total[s]:.3f} (95% {lo:.3f}-{hi:.3f}); "
              f"vs none: rechecking {total['none'] / total[s]:.3f}, every step {total['none'] / total[old]:.3f}; "
              f"tokens/step {tps[s]:.2f} / {tps[old]:.2f}")


if __name__ == "__main__":
    main()
