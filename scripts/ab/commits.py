#!/usr/bin/env python3
"""Two commits of lightspec-core in one process, interleaved: is the working tree slower?

Usage: python scripts/ab/commits.py OLD_REF OUT.json [--rounds R] [--limit N] [STRATEGY ...]

The old commit's ``lightspec_core`` package is extracted (``git archive``) into a temporary
folder and imported under another name; each version loads its own copy of the zoo target
(and draft), since each installs its own CPU-kernel modules.  For every suite prompt
(``--limit`` per workload), every strategy runs the prompt once in each version, the order
alternating from prompt to prompt, batch 1, greedy, 64 new tokens, one thread.  Reported per
strategy: the new version's speed relative to the old one (total tokens over total time),
the geometric mean of the per-prompt ratios with its 95% interval, whether every output is
identical, and each version's verify steps and drafted tokens (the dynamic budget decides
from measured times, so two versions may draft differently; ``--budget`` fixes a policy).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def import_old(ref: str):
    tmp = Path(tempfile.mkdtemp(prefix="lightspec_old_"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "lightspec_core/src/lightspec_core"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    (tmp / "lightspec_core/src/lightspec_core").rename(tmp / "lightspec_core_old")
    sys.path.insert(0, str(tmp))
    return importlib.import_module("lightspec_core_old")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old_ref")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--budget", default=None, help="a budget policy for both versions, e.g. static (default: each strategy's own)")
    ap.add_argument("strategies", nargs="*", default=["none", "ngram", "draft_model", "layerskip", "hybrid"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    import lightspec_zoo
    from lightspec_core.bench import load_prompt_sets, ratio_interval
    from transformers import AutoTokenizer

    import lightspec_core as new

    old = import_old(args.old_ref)
    importlib.import_module("lightspec_core_old.pipeline")
    target_path = lightspec_zoo.model_path(lightspec_zoo.DEFAULT_TARGET)
    draft_path = lightspec_zoo.model_path(lightspec_zoo.DEFAULT_DRAFT)
    tok = AutoTokenizer.from_pretrained(str(target_path))
    dev, dt = torch.device("cpu"), torch.float32
    versions = {}
    for label, pkg in (("old", old), ("new", new)):
        pipeline = importlib.import_module(pkg.__name__ + ".pipeline")
        target = pipeline.load_model(str(target_path), dev, dt)
        draft = pipeline.load_model(str(draft_path), dev, dt)
        budget = {"type": args.budget} if args.budget else None
        versions[label] = {s: pkg.MTPPipeline(target, tok, strategy=s, budget=budget,
                                              draft_model=draft if s in ("draft_model", "hybrid") else None)
                           for s in args.strategies}
    prompts = [p for ps in load_prompt_sets(None, "default", args.limit).values() for p in ps]
    ids = [tok(p)["input_ids"] for p in prompts]
    for label in versions:  # warm-up
        for pipe in versions[label].values():
            pipe.generate([ids[0]], max_new_tokens=16, ignore_eos=True)
    tokens = {(v, s): 0 for v in versions for s in args.strategies}
    drafted = {(v, s): 0 for v in versions for s in args.strategies}
    steps = {(v, s): 0 for v in versions for s in args.strategies}
    seconds = {(v, s): 0.0 for v in versions for s in args.strategies}
    logs: dict[str, list[float]] = {s: [] for s in args.strategies}
    identical = {s: True for s in args.strategies}
    n = 0
    for _ in range(args.rounds):
        for p in ids:
            for s in args.strategies:
                order = ("old", "new") if n % 2 == 0 else ("new", "old")
                n += 1
                took, outs = {}, {}
                for v in order:
                    t0 = time.perf_counter()
                    r = versions[v][s].generate([p], max_new_tokens=64)[0]
                    took[v] = time.perf_counter() - t0
                    outs[v] = r.token_ids
                    tokens[(v, s)] += len(r.token_ids)
                    drafted[(v, s)] += r.stats.drafted
                    steps[(v, s)] += r.stats.steps
                    seconds[(v, s)] += took[v]
                identical[s] = identical[s] and outs["old"] == outs["new"]
                logs[s].append(math.log(took["old"] / took["new"]))
    report = {"old_ref": args.old_ref, "rounds": args.rounds, "prompts": len(ids), "strategies": {}}
    print(f"{'strategy':12s} {'new/old speed':>14s} {'per-prompt geo-mean (95% CI)':>30s}  identical  "
          "steps old/new  drafted old/new")
    for s in args.strategies:
        speed = (tokens[("new", s)] / seconds[("new", s)]) / (tokens[("old", s)] / seconds[("old", s)])
        mean, lo, hi = ratio_interval(logs[s])
        report["strategies"][s] = {"speed_ratio": speed, "per_prompt_geomean": mean, "ci95": [lo, hi],
                                   "identical": identical[s],
                                   "steps": {v: steps[(v, s)] for v in versions},
                                   "drafted": {v: drafted[(v, s)] for v in versions},
                                   "tokens_per_s": {v: tokens[(v, s)] / seconds[(v, s)] for v in versions}}
        print(f"{s:12s} {speed:14.3f} {mean:12.3f} ({lo:.3f}-{hi:.3f})  {identical[s]!s:9s}  "
              f"{steps[('old', s)]}/{steps[('new', s)]}  {drafted[('old', s)]}/{drafted[('new', s)]}")
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
