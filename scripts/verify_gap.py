#!/usr/bin/env python3
"""How much slower the target's verify forward runs when other work came just before it
(docs/design/speed-ceiling.md, "Time away from the target").

A drafter runs between two verifies; on this machine the verify that follows is slower than
the same verify run back to back.  The script isolates that effect from the drafter's own
cost: the ``draft_model`` strategy at a static budget k, with its proposal replaced by k free
tokens (the last token repeated), and before each verify ``--gaps`` milliseconds of a busy
Python loop (no memory traffic to speak of) or, for ``model``, the real draft model's
drafting.  It reports the mean verify-forward time per gap (the forward alone, timed around
``TargetRunner.verify_forward``), batch 1, greedy, 1 thread, the suite's ``prose`` prompts.

    python scripts/verify_gap.py --json docs/design/verify_gap.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from speed_ceiling import prompts

import lightspec_core.runner as runner_module
from lightspec_core import DraftProposal, MTPPipeline


def measure(k: int, gap: str, texts: list[str], max_new: int) -> float:
    """Mean seconds of the verify forwards over k + 1 slots after ``gap`` ('model' or ms)."""
    times: list[float] = []
    original = runner_module.TargetRunner.verify_forward

    def timed(self, last, proposal, *args, **kwargs):
        t0 = time.perf_counter()
        out = original(self, last, proposal, *args, **kwargs)
        if proposal is not None and proposal.max_len == k:
            times.append(time.perf_counter() - t0)
        return out

    pipe = MTPPipeline.from_pretrained(None, strategy="draft_model", budget={"type": "static", "k": k})
    model_propose = pipe.bound.propose

    def propose(ctx):
        if gap == "model":
            proposal = model_propose(ctx=ctx)  # the real drafting, then the same free draft
        else:
            end = time.perf_counter() + float(gap) / 1000
            while time.perf_counter() < end:
                pass
        n = min(k, ctx.max_draft_list[0])  # the budget's room (the request's end)
        if n == 0:
            return None
        return DraftProposal(tokens=torch.tensor([[ctx.sequences[0][-1]] * n]), lengths=torch.tensor([n]), source="free")

    pipe.bound.propose = propose
    runner_module.TargetRunner.verify_forward = timed
    try:
        pipe.generate(texts[0], max_new_tokens=8)
        times.clear()
        for t in texts:
            pipe.generate(t, max_new_tokens=max_new, ignore_eos=True)
    finally:
        runner_module.TargetRunner.verify_forward = original
    return sum(times) / len(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3, 6])
    ap.add_argument("--gaps", nargs="+", default=["0", "0.5", "1", "2", "4", "model"])
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    texts = prompts("prose", args.limit)
    result = {}
    print("k | " + " | ".join(f"gap {g}" for g in args.gaps))
    for k in args.k:
        row = {g: measure(k, g, texts, args.max_new_tokens) for g in args.gaps}
        result[k] = {g: round(1000 * s, 3) for g, s in row.items()}
        print(f"{k} | " + " | ".join(f"{1000 * s:.2f} ms" for s in row.values()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python scripts/verify_gap.py " + " ".join(sys.argv[1:]),
                       "verify_forward_ms": result}, f, indent=1)


if __name__ == "__main__":
    main()
