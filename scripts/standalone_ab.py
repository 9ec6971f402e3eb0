#!/usr/bin/env python3
"""Strategies against LightSpec's ``none`` as a user runs them: each generation alone in the
process, nothing else between its steps (docs/benchmarks.md, "Lockstep with HF's baselines").

For the zoo target, batch 1, greedy, the suite's first ``--limit`` prompts per workload and
``--max-new-tokens`` new tokens, every strategy (and ``none``) runs each prompt once per round,
one whole ``generate()`` after the other in a random order per prompt (seeded), for
``--rounds`` rounds.  Each generation is timed from call to return (prefill included, the
same for every method).  Per strategy it prints the ratio of ``none``'s total time to its
own, per workload and overall, with a bootstrap 95% interval over the prompts (each prompt's
times summed over the rounds), and the mean tokens per step.  ``none#2`` (any name with a
``#`` suffix) is a second pipeline of that strategy: a control.

    python scripts/standalone_ab.py --strategy none#2 --strategy ngram --strategy draft_model --json out.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch
from speed_ceiling import WORKLOADS, prompts

from lightspec_core import MTPPipeline


def bootstrap(pairs: list[tuple[float, float]], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of sum(a) / sum(b) over ``pairs`` (a, b) resampled with replacement."""
    rng = random.Random(seed)
    vals = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        vals.append(sum(a for a, _ in pick) / sum(b for _, b in pick))
    vals.sort()
    return vals[int(0.025 * draws)], vals[int(0.975 * draws) - 1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", action="append", required=True, help="strategy or YAML file (repeatable)")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = ["none"] + [s for s in args.strategy if s != "none"]
    pipes = {n: MTPPipeline.from_pretrained(None, strategy=n.split("#")[0]) for n in names}
    steps = {n: [0, 0] for n in names}  # (steps, tokens) over the timed runs
    texts = {w: prompts(w, args.limit) for w in WORKLOADS}
    for n, p in pipes.items():
        p.bound.sinks.append(lambda event, n=n: steps[n].__setitem__(0, steps[n][0] + 1) if event.kind == "step" else None)
        p.generate(texts["code"][0], max_new_tokens=8)  # first-use costs stay out of the timed runs
        steps[n] = [0, 0]
    seconds = {n: {w: [0.0] * len(texts[w]) for w in WORKLOADS} for n in names}
    rng = random.Random(args.seed)
    for _ in range(args.rounds):
        for w in WORKLOADS:
            for i, text in enumerate(texts[w]):
                order = list(names)
                rng.shuffle(order)
                for n in order:
                    t0 = time.perf_counter()
                    out = pipes[n].generate(text, max_new_tokens=args.max_new_tokens, ignore_eos=True)
                    seconds[n][w][i] += time.perf_counter() - t0
                    steps[n][1] += len(out.token_ids) - 1  # the prefill gives the first token
    result = {"command": " ".join(sys.argv), "rounds": args.rounds, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "strategies": {}}
    for n in names[1:]:
        per = {}
        for w in WORKLOADS:
            per[w] = sum(seconds["none"][w]) / sum(seconds[n][w])
        pairs = [(a, b) for w in WORKLOADS for a, b in zip(seconds["none"][w], seconds[n][w])]
        overall = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
        lo, hi = bootstrap(pairs)
        tps = steps[n][1] / max(1, steps[n][0])
        result["strategies"][n] = {"vs_none": per, "overall": overall, "ci95": [lo, hi], "tokens_per_step": tps}
        print(f"{n:28s} " + " ".join(f"{w} {v:.2f}x" for w, v in per.items())
              + f"  overall {overall:.3f}x ({lo:.3f}-{hi:.3f})  tokens/step {tps:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
