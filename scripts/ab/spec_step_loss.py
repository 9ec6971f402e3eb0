#!/usr/bin/env python3
"""Where a strategy's speculative steps win or lose against plain decoding under the `dynamic`
budget (batch 1, greedy, zoo models, 64 new tokens, 1 thread; docs/design/budget.md, "Cost
model").

For each strategy, over the suite's first ``--limit`` prompts per workload, ``--rounds`` times:
  * per draft length k of the cost model's own decisions, and whether the step follows a plain
    step ("p"): steps, tokens per step, the step's time in plain steps (the median plain step of
    the run) and the gain the policy expected (``Budget.estimates["gain"]``) against the one
    realised (tokens / step time in plain steps);
  * per generation: the time lost by its first speculative step (step time - tokens x plain step)
    and its set-up (the drafter reading the prompt), against what the other speculative steps
    gained.

Usage: python scripts/ab/spec_step_loss.py [--limit 3] [--rounds 2] STRATEGY...
"""
from __future__ import annotations

import argparse
import collections
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from speed_ceiling import WORKLOADS, prompts  # noqa: E402

from lightspec_core import MTPPipeline  # noqa: E402


def run(strategy: str, limit: int, rounds: int) -> None:
    pipe = MTPPipeline.from_pretrained(None, strategy=strategy)
    gens: list[list] = [[]]
    pipe.bound.sinks.append(lambda event: gens[-1].append(event) if event.kind == "step" else None)
    pipe.generate(prompts("code", 1)[0], max_new_tokens=8)  # first-use costs stay out
    gens.clear()
    for _ in range(rounds):
        for w in WORKLOADS:
            for text in prompts(w, limit):
                gens.append([])
                pipe.generate(text, max_new_tokens=64, ignore_eos=True)
    decode = [e for g in gens for e in g if e.step > 0]
    plain = st.median([e.step_time_s for e in decode if max(e.drafted) == 0])
    rows = collections.defaultdict(list)
    first = rest = setup = 0.0
    drafting = 0
    for g in gens:
        prev, seen = 0, False
        for e in g:
            if e.step == 0:
                continue
            k = max(e.drafted)
            if k and e.budget_reason == "model":
                rows[(k, prev == 0)].append(e)
            if k:
                loss = e.step_time_s - sum(e.emitted) * plain
                if seen:
                    rest += loss
                else:
                    seen, first, setup = True, first + loss, setup + e.draft_setup_s
                    drafting += 1
            prev = k
    print(f"{strategy}: plain step {plain * 1e3:.2f} ms, {len(decode)} decode steps, {sum(e.step_time_s for e in decode):.2f} s")
    print("   k  steps  tokens/step  plain steps/step  gain expected  gain realised")
    for (k, after_plain), evs in sorted(rows.items()):
        tok = st.mean(sum(e.emitted) for e in evs)
        cost = st.mean(e.step_time_s for e in evs) / plain
        expected = st.mean(e.budget_estimates.get("gain", float("nan")) for e in evs)
        print(f"  {k:2d}{'p' if after_plain else ' '} {len(evs):5d} {tok:12.2f} {cost:17.2f} {expected:14.2f} {tok / cost:14.2f}")
    print(f"  generations {len(gens)}, drafting in {drafting}: their first speculative steps lost {first * 1e3:.1f} ms "
          f"(set-up {setup * 1e3:.1f} ms); the other speculative steps lost {rest * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("strategy", nargs="+")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for s in args.strategy:
        run(s, args.limit, args.rounds)


if __name__ == "__main__":
    main()
