#!/usr/bin/env python3
"""Mean accepted length (tokens per verify step, the target's own token included) of a strategy
on the zoo target: the first ``--prompts`` suite prompts of each workload, 64 new tokens, batch 1,
greedy, a static budget of ``--k`` drafts.  Acceptance only: no timing enters it, so it may run
on a busy machine (e.g. to follow a training run's checkpoints).

    python scripts/zoo_acceptance.py --strategy eagle3 --option head=zoo/build/eagle3-op --k 6
    python scripts/zoo_acceptance.py --strategy dspark --option checkpoint=zoo/build/dspark-op --k 6 --json out.json
"""
from __future__ import annotations

import argparse
import json

import lightspec_zoo
import torch
import yaml

from lightspec_core import MTPPipeline


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", required=True)
    ap.add_argument("--option", action="append", default=[], help="KEY=VALUE strategy option (YAML value)")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r} is invalid: use KEY=VALUE")
        options[key] = yaml.safe_load(value)
    pipe = MTPPipeline.from_pretrained(None, strategy=args.strategy, budget={"type": "static", "k": args.k}, **options)
    res, total_steps, total_tokens = {}, 0, 0
    for workload, prompts in lightspec_zoo.prompt_sets().items():
        steps = tokens = 0
        for p in prompts[: args.prompts]:
            o = pipe.generate(p, max_new_tokens=args.max_new_tokens, ignore_eos=True)
            steps += o.stats.steps
            tokens += o.stats.new_tokens
        res[workload] = round(tokens / steps, 3)
        total_steps, total_tokens = total_steps + steps, total_tokens + tokens
        print(f"{workload:12s} {res[workload]:.3f}", flush=True)
    res["all"] = round(total_tokens / total_steps, 3)
    print(f"{'all':12s} {res['all']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"strategy": args.strategy, "options": options, "k": args.k, "mean_accepted_length": res}, f,
                      indent=1)


if __name__ == "__main__":
    main()
