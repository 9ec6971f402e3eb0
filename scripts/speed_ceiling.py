#!/usr/bin/env python3
"""What speculation can gain over LightSpec's own ``none`` on this machine: measured costs and
the accepted lengths each speed-up would need (docs/design/speed-ceiling.md).

For the zoo target, batch 1, greedy, the suite's first ``--limit`` prompts per workload and
``--max-new-tokens`` tokens (the bench's settings), it measures from the engine's own step
statistics (``StepStats``):

* per workload, ``none``'s prefill time P and its decode-step time t1 (one token per step);
* the target's verify-forward time per verified slot count q (``target_forward_s`` against
  ``verify_tokens``), from ``ngram`` and ``draft_model`` runs at a static budget;
* the engine's per-step overhead outside the forwards (``overhead_s``) and each drafter's
  draft time per drafted token (``draft_forward_s / drafted``), at static k.

A strategy that verifies k drafts per step and keeps ``a`` tokens per step (mean accepted
length) takes  ``P + N / a * (t_verify(k + 1) + k * c_draft + o)``  for N tokens, against
``P + N * t1`` for ``none``.  The script prints, per workload and drafter, the ``a`` a
speed-up S needs at the best k (``a <= k + 1``; "-" where no k reaches S) next to the ``a``
the drafter was measured to reach at that k.  ``--json`` writes everything.

    python scripts/speed_ceiling.py --json docs/design/speed_ceiling.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import lightspec_zoo
import torch
from tqdm import tqdm

from lightspec_core import MTPPipeline

WORKLOADS = ["code", "docstring", "edit", "prose", "spec_bench"]
DRAFTERS = ["ngram", "draft_model", "eagle3", "dspark", "mtp"]
SPEEDUPS = [1.2, 1.5, 1.6, 2.0]


def prompts(workload: str, limit: int) -> list[str]:
    path = lightspec_zoo.PROMPTS_DIR / (f"{workload}/question.jsonl" if workload == "spec_bench" else f"{workload}.jsonl")
    out = []
    for line in open(path):
        row = json.loads(line)
        out.append(row["prompt"] if "prompt" in row else row["turns"][0])
        if len(out) == limit:
            break
    return out


def run(pipe: MTPPipeline, texts: list[str], max_new: int) -> tuple[float, list]:
    """Wall seconds of generating ``texts`` one by one, and the step events."""
    events: list = []
    sink = lambda event: events.append(event) if event.kind == "step" else None  # noqa: E731
    pipe.bound.sinks.append(sink)
    try:
        t0 = time.perf_counter()
        for t in texts:
            pipe.generate(t, max_new_tokens=max_new, ignore_eos=True)
        return time.perf_counter() - t0, events
    finally:
        pipe.bound.sinks.remove(sink)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--drafters", nargs="+", default=DRAFTERS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    N = args.max_new_tokens
    texts = {w: prompts(w, args.limit) for w in WORKLOADS}

    none = MTPPipeline.from_pretrained(None, strategy="none")
    none.generate(texts["code"][0], max_new_tokens=8)
    base = {}
    for w in tqdm(WORKLOADS, desc="none", file=sys.stderr):
        wall, ev = run(none, texts[w], N)
        steps = sum(e.step_time_s for e in ev)
        base[w] = {"prefill_s": (wall - steps) / len(texts[w]), "t1_s": steps / len(ev), "wall_s": wall,
                   "prefill_share": (wall - steps) / wall}

    fwd = defaultdict(list)  # q -> target verify-forward seconds
    overhead, measured = [], {}
    for d in args.drafters:
        for k in tqdm(args.k, desc=d, file=sys.stderr):
            try:
                pipe = MTPPipeline.from_pretrained(None, strategy=d, budget={"type": "static", "k": k})
            except Exception as exc:  # noqa: BLE001 - a drafter that is not installed is reported and skipped
                print(f"{d}: skipped ({exc})", file=sys.stderr)
                break
            pipe.generate(texts["code"][0], max_new_tokens=8)
            for w in WORKLOADS:
                _, ev = run(pipe, texts[w], N)
                drafted = sum(sum(e.drafted) for e in ev)
                emitted = sum(sum(e.emitted) for e in ev)
                for e in ev:
                    fwd[int(e.verify_tokens)].append(e.target_forward_s)
                    overhead.append(e.overhead_s)
                measured[(d, k, w)] = {"accepted_length": emitted / len(ev),
                                       "draft_s_per_token": sum(e.draft_forward_s for e in ev) / max(1, drafted)}
    t_verify = {q: statistics.median(v) for q, v in sorted(fwd.items())}
    o = statistics.median(overhead)

    def tv(q: int) -> float:
        if q in t_verify:
            return t_verify[q]
        known = sorted(t_verify)
        return t_verify[min(known, key=lambda x: abs(x - q))]

    rows = []
    for w in WORKLOADS:
        P, t1 = base[w]["prefill_s"], base[w]["t1_s"]
        t_none = P + N * t1
        for d in args.drafters:
            for k in args.k:
                m = measured.get((d, k, w))
                if m is None:
                    continue
                step = tv(k + 1) + k * m["draft_s_per_token"] + o
                need = {}
                for S in SPEEDUPS:
                    budget = t_none / S - P  # seconds left for N tokens of decoding
                    a = N * step / budget if budget > 0 else float("inf")
                    need[str(S)] = a if a <= k + 1 else None
                rows.append({"workload": w, "drafter": d, "k": k, "step_s": step, "measured_a": m["accepted_length"],
                             "draft_s_per_token": m["draft_s_per_token"], "needed_a": need})
    print("target verify forward (ms) by verified slots q: " +
          ", ".join(f"q={q}: {1e3 * t:.2f}" for q, t in t_verify.items()))
    print(f"engine overhead per step outside forwards: {1e3 * o:.2f} ms")
    ceilings = {}
    for w in WORKLOADS:
        b = base[w]
        t_none = b["prefill_s"] + N * b["t1_s"]
        # a perfect drafter: free, and every one of its k drafts accepted (k + 1 tokens a step)
        best = max(((t_none / (b["prefill_s"] + N / q * (t + o)), q - 1) for q, t in t_verify.items() if q > 1),
                   default=(1.0, 0))
        ceilings[w] = {"speedup": best[0], "k": best[1]}
        print(f"\n{w}: none prefill {1e3 * b['prefill_s']:.1f} ms/prompt ({100 * b['prefill_share']:.0f}% of its time), "
              f"step {1e3 * b['t1_s']:.2f} ms; a free drafter whose drafts are all accepted reaches "
              f"{best[0]:.2f}x (at k={best[1]})")
        print(f"  {'drafter':12s} {'k':>2s} {'draft ms/tok':>12s} {'a measured':>10s}  " +
              "  ".join(f"a for {S}x" for S in SPEEDUPS))
        for r in rows:
            if r["workload"] != w:
                continue
            need = "  ".join(f"{r['needed_a'][str(S)]:9.2f}" if r["needed_a"][str(S)] else f"{'-':>9s}" for S in SPEEDUPS)
            print(f"  {r['drafter']:12s} {r['k']:2d} {1e3 * r['draft_s_per_token']:12.3f} {r['measured_a']:10.2f}  {need}")
    # overall, as the bench's "overall" column: total tokens / total seconds over the workloads
    overall = {}
    for q, t in t_verify.items():
        if q > 1:
            num = sum(b["prefill_s"] + N * b["t1_s"] for b in base.values())
            den = sum(b["prefill_s"] + N / q * (t + o) for b in base.values())
            overall[q - 1] = num / den
    if overall:
        k_best = max(overall, key=overall.get)
        print(f"\noverall (all workloads): a free drafter whose drafts are all accepted reaches {overall[k_best]:.2f}x "
              f"(at k={k_best})")
        ceilings["overall"] = {"speedup": overall[k_best], "k": k_best}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "none": base, "t_verify_s": t_verify, "overhead_s": o, "rows": rows,
                       "perfect_free_drafter": ceilings,
                       "torch_threads": torch.get_num_threads()}, f, indent=1)


if __name__ == "__main__":
    main()
