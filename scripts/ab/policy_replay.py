#!/usr/bin/env python3
"""The `dynamic` budget policy's own cost per step, replayed off-line (docs/design/budget.md,
"The policy's own cost").

``record``: runs STRATEGY under the budget policy ``--budget`` (default: the pipeline's)
(batch 1, greedy or ``--temperature T`` unseeded, zoo models, 64 new tokens, one warm-up generation, then the suite's first
``--limit`` prompts per workload, or ``--batch`` prompts at once) and saves every decision's
inputs (the parts of ``StepContext`` the policy reads) and every step's ``StepStats``, in
order, to a pickle.

``replay``: feeds a recording to a new policy built from the same spec (so that a
recording made with one version of the code replays on another) ``--repeat`` times and prints the
median time per decision (``lightspec_budget``) and per step learned (``lightspec_on_stats``),
and a digest of every decision (k per row, per-source limits, reason, estimates): two code
versions that decide alike print the same digest.  Replaying takes the model out of the
timing, so a change of a few microseconds is visible on a noisy machine.  A decode step's
forward evicts the policy's code and data from the CPU caches, which makes a decision several
times slower in a generation than in a tight loop: ``--thrash MB`` (default 64) writes a buffer
that large between calls (untimed), which puts the replay's times near the ones measured in
generations (the engine's "budget" stage).

Usage:
  python scripts/ab/policy_replay.py record STRATEGY OUT.pkl [--limit 2] [--batch 1] [--budget SPEC] [--temperature T]
  python scripts/ab/policy_replay.py replay IN.pkl [--repeat 20] [--thrash 64]
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import pickle
import statistics as st
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def record(strategy: str, out: str, limit: int, batch: int, budget_spec: str | None, temperature: float = 0.0) -> None:
    import torch
    from speed_ceiling import WORKLOADS, prompts

    from lightspec_core import MTPPipeline

    torch.set_num_threads(1)
    pipe = MTPPipeline.from_pretrained(None, strategy=strategy, budget=budget_spec)
    policy, bound = pipe.budget, pipe.bound
    calls: list[tuple[str, object]] = []
    decide = bound.budget

    def budget(ctx):
        calls.append(("budget", SimpleNamespace(
            batch=ctx.batch, deterministic=ctx.deterministic, draft_cost_hints=dict(ctx.draft_cost_hints or {}),
            sampling=ctx.sampling, row_ids=list(ctx.row_ids), history=[copy.copy(h) for h in ctx.history],
            device=ctx.device)))
        return decide(ctx=ctx)

    bound.budget = budget
    bound.sinks.append(lambda event: calls.append(("stats", copy.copy(event))))
    policy_reset = policy.reset

    def reset():
        calls.append(("reset", None))
        policy_reset()

    policy.reset = reset
    pipe.generate(prompts("code", 1)[0], max_new_tokens=8)  # first-use costs
    texts = [t for w in WORKLOADS for t in prompts(w, limit)]
    for i in range(0, len(texts), batch):
        pipe.generate(texts[i:i + batch] if batch > 1 else texts[i], max_new_tokens=64, ignore_eos=True,
                      temperature=temperature)
    with open(out, "wb") as f:
        pickle.dump({"strategy": strategy, "batch": batch, "budget": budget_spec, "calls": calls}, f)
    print(f"{strategy}: {sum(c[0] == 'budget' for c in calls)} decisions, "
          f"{sum(c[0] == 'stats' for c in calls)} events -> {out}")


def replay(path: str, repeat: int, thrash_mb: int) -> None:
    import torch

    from lightspec_core.component_spec import build_component
    from lightspec_core.plugins import get_registry

    with open(path, "rb") as f:
        rec = pickle.load(f)
    spec = rec["budget"] or "dynamic"
    buf = torch.zeros(thrash_mb * 2 ** 18) if thrash_mb > 0 else None  # float32: MB * 2^20 / 4
    decide_s, learn_s, digest = [], [], None
    for _ in range(repeat):
        policy = build_component("budget", spec, get_registry(), default_type="dynamic")
        h = hashlib.sha256()
        td = tl = 0.0
        nd = nl = 0
        for kind, payload in rec["calls"]:
            if buf is not None:
                buf.add_(1.0)
            if kind == "reset":
                policy.reset()
            elif kind == "budget":
                t = time.perf_counter()
                b = policy.lightspec_budget(ctx=payload)
                td += time.perf_counter() - t
                nd += 1
                h.update(repr((b.max_draft.tolist(), sorted(b.by_source.items()), b.free_max_draft, b.reason,
                               sorted((k, round(v, 9)) for k, v in b.estimates.items() if v is not None))).encode())
            else:
                t = time.perf_counter()
                policy.lightspec_on_stats(event=payload)
                tl += time.perf_counter() - t
                nl += 1
        decide_s.append(td / max(nd, 1))
        learn_s.append(tl / max(nl, 1))
        digest = h.hexdigest()[:16]
    print(f"{rec['strategy']} batch {rec['batch']}: {nd} decisions {1e6 * st.median(decide_s):.1f} us, "
          f"{nl} events learned {1e6 * st.median(learn_s):.1f} us (median of {repeat}); decisions digest {digest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("strategy")
    r.add_argument("out")
    r.add_argument("--limit", type=int, default=2)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--budget", default=None)
    r.add_argument("--temperature", type=float, default=0.0)
    p = sub.add_parser("replay")
    p.add_argument("path")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--thrash", type=int, default=64)
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.strategy, a.out, a.limit, a.batch, a.budget, a.temperature)
    else:
        replay(a.path, a.repeat, a.thrash)


if __name__ == "__main__":
    main()
