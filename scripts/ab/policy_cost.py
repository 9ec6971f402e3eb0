#!/usr/bin/env python3
"""What the budget policy costs per decode step in a generation (batch 1, greedy, zoo models,
64 new tokens, 1 thread, the suite's first ``--limit`` prompts per workload; docs/design/budget.md,
"Per-step cost of the policy itself").

Wraps the pipeline's bound ``budget`` and statistics sinks with timers and prints, per
strategy, the time per decision (``lightspec_budget``, by ``Budget.reason``) and per event for
each sink (the policy's ``lightspec_on_stats`` is its learning).  In a generation these run
right after a target forward, on cold CPU caches, several times slower than in a tight loop
(``policy_replay.py`` measures the same code off-line).

Usage: python scripts/ab/policy_cost.py [--limit 2] STRATEGY...
"""
from __future__ import annotations

import argparse
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from speed_ceiling import WORKLOADS, prompts  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402


def measure(strategy: str, limit: int) -> None:
    pipe = MTPPipeline.from_pretrained(None, strategy=strategy)
    bound = pipe.bound
    decisions: list[tuple[str, float]] = []
    learned: dict[str, list[float]] = {}
    decide = bound.budget

    def budget(ctx):
        t = time.perf_counter()
        b = decide(ctx=ctx)
        decisions.append((b.reason, time.perf_counter() - t))
        return b

    def timed(sink):
        name = getattr(sink, "__qualname__", repr(sink)).split(".")[0]

        def wrapper(event):
            t = time.perf_counter()
            sink(event=event)
            learned.setdefault(name, []).append(time.perf_counter() - t)
        return wrapper

    bound.budget = budget
    bound.sinks[:] = [timed(s) for s in bound.sinks]
    pipe.generate(prompts("code", 1)[0], max_new_tokens=8)  # first-use costs stay out
    decisions.clear()
    learned.clear()
    for w in WORKLOADS:
        for text in prompts(w, limit):
            pipe.generate(text, max_new_tokens=64, ignore_eos=True)
    steps = max(len(v) for v in learned.values())
    total = sum(t for _, t in decisions)
    print(f"{strategy}: {steps} steps; deciding {1e6 * total / steps:.1f} us a step"
          + "".join(f", {name} {1e6 * sum(ts) / steps:.1f} us" for name, ts in learned.items()))
    by_reason: dict[str, list[float]] = {}
    for reason, t in decisions:
        by_reason.setdefault(reason, []).append(t)
    for reason, ts in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        print(f"  {reason:12s} {len(ts):5d} decisions, median {1e6 * st.median(ts):.1f} us, mean {1e6 * st.mean(ts):.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("strategy", nargs="+")
    ap.add_argument("--limit", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for s in a.strategy:
        measure(s, a.limit)


if __name__ == "__main__":
    main()
