#!/usr/bin/env python3
"""How far better n-gram lookup could go on the zoo target: tokens per verify of four lookup
policies replayed offline on the target's own greedy continuations (docs/design/speed-ceiling.md,
"What it says").

For the suite's first ``--limit`` prompts per workload, ``none`` writes ``--max-new-tokens``
greedy tokens; each policy then drafts up to k tokens from the context (prompt + tokens so far),
keeps the prefix that matches the continuation, and moves on by that many tokens plus one (the
target's own), as a verify would.  No timing, no learned cut (``min_accept``): only what the
lookup itself can find.

* ``newest``: the newest occurrence of the longest suffix n-gram (n = 4 .. 1), as ``ngram`` does;
* ``longest_back``: of that n-gram's occurrences, the one whose preceding context agrees furthest back;
* ``newest8``: ``newest`` with n up to 8;
* ``vote``: the newest 16 occurrences vote token by token, weighted by how far back each agrees.

    python scripts/lookup_policies.py --json out.json
"""
from __future__ import annotations

import argparse
import collections
import json

import torch
from speed_ceiling import WORKLOADS, prompts

from lightspec_core import MTPPipeline


def occurrences(seq: list[int], n: int) -> list[int]:
    """Positions right after each earlier occurrence of ``seq[-n:]``, newest first."""
    key, out = seq[-n:], []
    for end in range(len(seq) - 1, n - 1, -1):
        if seq[end - n : end] == key:
            out.append(end)
    return out


def agreement(seq: list[int], pos: int) -> int:
    """How many tokens before ``pos`` agree with the end of ``seq`` (at most 64)."""
    L, n = len(seq), 0
    while n < 64 and pos - n - 1 >= 0 and seq[pos - n - 1] == seq[L - n - 1]:
        n += 1
    return n


def newest(seq, k, max_n=4):
    for n in range(max_n, 0, -1):
        found = occurrences(seq, n)
        if found:
            return seq[found[0] : found[0] + k]
    return []


def longest_back(seq, k, max_n=4):
    for n in range(max_n, 0, -1):
        found = occurrences(seq, n)
        if found:
            best = max(found, key=lambda e: (agreement(seq, e), e))
            return seq[best : best + k]
    return []


def vote(seq, k, max_n=4, matches=16):
    for n in range(max_n, 0, -1):
        found = occurrences(seq, n)[:matches]
        if found:
            cands, out = [(e, agreement(seq, e)) for e in found], []
            for j in range(k):
                count = collections.Counter()
                for e, w in cands:
                    if e + j < len(seq):
                        count[seq[e + j]] += w
                if not count:
                    break
                tok = count.most_common(1)[0][0]
                out.append(tok)
                cands = [(e, w) for e, w in cands if e + j < len(seq) and seq[e + j] == tok]
            return out
    return []


POLICIES = {"newest": newest, "longest_back": longest_back, "newest8": lambda s, k: newest(s, k, 8), "vote": vote}


def replay(policy, prompt: list[int], gen: list[int], k: int) -> tuple[int, int]:
    """(verify steps, tokens) of ``policy`` drafting up to ``k`` tokens over ``gen``."""
    t = steps = 0
    while t < len(gen):
        draft = policy(prompt + gen[:t], k)
        a = 0
        while a < len(draft) and t + a < len(gen) and draft[a] == gen[t + a]:
            a += 1
        steps, t = steps + 1, t + a + 1
    return steps, len(gen)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, action="append", help="draft lengths (default: 4 and 8)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    pipe = MTPPipeline.from_pretrained(None, strategy="none")
    data = {}
    for w in WORKLOADS:
        data[w] = []
        for text in prompts(w, args.limit):
            res = pipe.generate(text, max_new_tokens=args.max_new_tokens)
            data[w].append((pipe.tokenizer(text)["input_ids"], list(res.token_ids)))
    results = {}
    for k in args.k or [4, 8]:
        for name, policy in POLICIES.items():
            runs = {w: [replay(policy, p, g, k) for p, g in data[w]] for w in WORKLOADS}
            per = {w: sum(n for _, n in r) / sum(s for s, _ in r) for w, r in runs.items()}
            total = sum(n for r in runs.values() for _, n in r)
            verifies = sum(s for r in runs.values() for s, _ in r)
            results[f"k={k} {name}"] = {"overall": total / verifies, "per_workload": per}
            print(f"k={k} {name:13s} overall {total / verifies:.3f} | "
                  + " ".join(f"{w} {v:.2f}" for w, v in per.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"limit": args.limit, "max_new_tokens": args.max_new_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
