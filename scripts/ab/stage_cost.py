#!/usr/bin/env python3
"""Time per call of a few engine stages in real generations: ``Engine._commit`` (a step's
commit), ``Batch.add_hidden`` (keeping the committed slots' hidden states for the strategy) and
``TargetRunner.commit`` (the target's KV cache), for each strategy given (the zoo models, greedy,
64 new tokens, 1 thread, the suite's first ``--batch`` prompts per workload as one batch, or the
first 2 per workload one at a time at ``--batch 1``; ``--rounds`` passes).  Prints the median
and the mean in microseconds.  docs/design/core-api.md cites it.

Usage: python scripts/ab/stage_cost.py [--batch 8] [--rounds 2] STRATEGY...
"""
from __future__ import annotations

import argparse
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lightspec_core.engine as engine  # noqa: E402
import lightspec_core.engine_parts as engine_parts  # noqa: E402
import lightspec_core.runner as runner  # noqa: E402
import torch  # noqa: E402
from speed_ceiling import WORKLOADS, prompts  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402

TIMES: dict[str, list[float]] = {"commit": [], "add_hidden": [], "runner_commit": []}


def timed(cls, name: str, key: str) -> None:
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            TIMES[key].append(time.perf_counter() - t)

    setattr(cls, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("strategies", nargs="+")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    timed(engine.Engine, "_commit", "commit")
    timed(engine_parts.Batch, "add_hidden", "add_hidden")
    timed(runner.TargetRunner, "commit", "runner_commit")
    if args.batch > 1:
        texts = [t for w in WORKLOADS for t in prompts(w, args.batch)]
        batches = [texts[i:i + args.batch] for i in range(0, len(texts), args.batch)]
    else:
        batches = [t for w in WORKLOADS for t in prompts(w, 2)]
    for name in args.strategies:
        pipe = MTPPipeline.from_pretrained(None, strategy=name)
        pipe.generate(batches[0], max_new_tokens=8)  # first-use costs stay out
        for v in TIMES.values():
            v.clear()
        for _ in range(args.rounds):
            for b in batches:
                pipe.generate(b, max_new_tokens=64, ignore_eos=True)
        print(name, "median / mean us:", {k: f"{1e6 * st.median(v):.1f} / {1e6 * st.mean(v):.1f}" for k, v in TIMES.items() if v},
              flush=True)


if __name__ == "__main__":
    main()
