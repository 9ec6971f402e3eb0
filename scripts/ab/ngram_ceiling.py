#!/usr/bin/env python3
"""How many tokens per verify n-gram lookup could get at best, replayed offline on the target's own
greedy output (no timing): the zoo target writes N tokens greedily after each prompt of a workload,
then at every step of a greedy speculative decode the drafts are checked against what it wrote.

- latest: the latest earlier occurrence of the context's last n tokens (n = 4..1, longest first),
  a draft of up to K tokens (what `ngram` looks up, without its learned cut);
- longest_back: of the occurrences of that n-gram, the one whose preceding context agrees
  furthest back;
- latest8: latest, with n = 8..1;
- vote: the latest 16 occurrences of that n-gram vote token by token, each weighted by how far
  back it agrees (a draft stops where no occurrence is left);
- oracle: the best of *every* earlier occurrence of the last 1..4 tokens (an upper bound for any
  lookup drafter, even one verifying several candidates at once).

Usage: python scripts/ab/ngram_ceiling.py [WORKLOAD ...] [--new-tokens N] [--k K] [--limit N] [--json F]
"""
import argparse
import collections
import json

import lightspec_zoo
import torch
from lightspec_core.pipeline import default_model_path
from transformers import AutoModelForCausalLM, AutoTokenizer


def occurrences(seq: list[int], n: int) -> list[int]:
    """Positions right after each earlier occurrence of seq's last n tokens, latest first."""
    L, key = len(seq), seq[len(seq) - n :]
    return [p + n for p in range(L - n - 1, -1, -1) if seq[p : p + n] == key]


def matched(draft: list[int], truth: list[int]) -> int:
    a = 0
    while a < len(draft) and a < len(truth) and draft[a] == truth[a]:
        a += 1
    return a


def agreement(seq: list[int], pos: int) -> int:
    """How many tokens before ``pos`` agree with the end of ``seq`` (at most 64)."""
    L, n = len(seq), 0
    while n < 64 and pos - n - 1 >= 0 and seq[pos - n - 1] == seq[L - n - 1]:
        n += 1
    return n


def vote(seq: list[int], occ: list[int], k: int) -> list[int]:
    """A draft of up to ``k`` tokens voted by the occurrences ``occ``, weighted by agreement."""
    cands, out = [(o, agreement(seq, o)) for o in occ[:16]], []
    for j in range(k):
        count: collections.Counter = collections.Counter()
        for o, w in cands:
            if o + j < len(seq):
                count[seq[o + j]] += w
        if not count:
            break
        tok = count.most_common(1)[0][0]
        out.append(tok)
        cands = [(o, w) for o, w in cands if o + j < len(seq) and seq[o + j] == tok]
    return out


def draft(seq: list[int], k: int, policy: str) -> list[int]:
    """A lookup policy's draft of up to ``k`` tokens after ``seq`` (module docstring)."""
    for n in range(8 if policy == "latest8" else 4, 0, -1):
        occ = occurrences(seq, n)
        if not occ:
            continue
        if policy == "vote":
            return vote(seq, occ, k)
        o = max(occ, key=lambda p: (agreement(seq, p), p)) if policy == "longest_back" else occ[0]
        return seq[o : o + k]
    return []


POLICIES = ("latest", "longest_back", "latest8", "vote", "oracle")


def tokens_per_verify(prompt: list[int], out: list[int], k: int, oracle: bool = False,
                      policy: str = "latest") -> tuple[int, int]:
    """(tokens, verifies) of a greedy speculative decode of ``out`` after ``prompt``."""
    i = steps = 0
    while i < len(out):
        seq = prompt + out[:i]
        if oracle or policy == "oracle":
            best = 0
            for n in range(4, 0, -1):
                best = max([best] + [matched(seq[o : o + k], out[i:]) for o in occurrences(seq, n)])
        else:
            best = matched(draft(seq, k, policy), out[i:])
        i += best + 1
        steps += 1
    return len(out), steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["edit"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--json", default=None, help="write tokens per verify per workload and policy here")
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = str(default_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    sets = lightspec_zoo.prompt_sets()
    report, overall = {}, {name: [0, 0] for name in POLICIES}
    for w in args.workloads:
        totals = {name: [0, 0] for name in POLICIES}
        for p in sets[w][: args.limit]:
            ids = tok(p)["input_ids"]
            with torch.no_grad():
                g = model.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False)
            out = g[0, len(ids):].tolist()
            for name in totals:
                t, s = tokens_per_verify(ids, out, args.k, policy=name)
                for acc in (totals[name], overall[name]):
                    acc[0] += t
                    acc[1] += s
        report[w] = {name: t / s for name, (t, s) in totals.items()}
        print(f"{w:11s} " + "  ".join(f"{name} {v:.2f}" for name, v in report[w].items()) + "  (tokens/verify)")
    report["overall"] = {name: t / s for name, (t, s) in overall.items()}
    print(f"{'overall':11s} " + "  ".join(f"{name} {v:.2f}" for name, v in report["overall"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": args.k, "new_tokens": args.new_tokens, "limit": args.limit, "tokens_per_verify": report},
                      f, indent=1)


if __name__ == "__main__":
    main()
