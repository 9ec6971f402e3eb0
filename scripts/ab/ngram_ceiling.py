#!/usr/bin/env python3
"""How many tokens per verify n-gram lookup could get at best, replayed offline on the target's own
greedy output (no timing): the zoo target writes N tokens greedily after each prompt of a workload,
then at every step of a greedy speculative decode the drafts are checked against what it wrote.

- latest: the latest earlier occurrence of the context's last n tokens (n = 4..1, longest first),
  a draft of up to K tokens (what `ngram` looks up, without its learned cut);
- oracle: the best of *every* earlier occurrence of the last 1..4 tokens (an upper bound for any
  lookup drafter, even one verifying several candidates at once).

Usage: python scripts/ab/ngram_ceiling.py [WORKLOAD ...] [--new-tokens N] [--k K]
"""
import argparse

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


def tokens_per_verify(prompt: list[int], out: list[int], k: int, oracle: bool) -> tuple[int, int]:
    """(tokens, verifies) of a greedy speculative decode of ``out`` after ``prompt``."""
    i = steps = 0
    while i < len(out):
        seq = prompt + out[:i]
        best = 0
        for n in range(4, 0, -1):
            occ = occurrences(seq, n)
            if not occ:
                continue
            if not oracle:
                best = matched(seq[occ[0] : occ[0] + k], out[i:])
                break
            best = max([best] + [matched(seq[o : o + k], out[i:]) for o in occ])
        i += best + 1
        steps += 1
    return len(out), steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["edit"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--limit", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = str(default_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    sets = lightspec_zoo.prompt_sets()
    for w in args.workloads:
        totals = {"latest": [0, 0], "oracle": [0, 0]}
        for p in sets[w][: args.limit]:
            ids = tok(p)["input_ids"]
            with torch.no_grad():
                g = model.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False)
            out = g[0, len(ids):].tolist()
            for name in totals:
                t, s = tokens_per_verify(ids, out, args.k, oracle=name == "oracle")
                totals[name][0] += t
                totals[name][1] += s
        print(f"{w:11s} " + "  ".join(f"{name} {t / s:.2f} tokens/verify" for name, (t, s) in totals.items()))


if __name__ == "__main__":
    main()
