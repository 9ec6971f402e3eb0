#!/usr/bin/env python3
"""How well a zoo target copies when asked, on held-out functions that are not suite prompts.

The suite's ``edit`` workload asks the target to write a function again with one argument
renamed; speculation pays there only as far as the target really copies.  This measures
that on a set of its own, so that a fine-tuning recipe is not chosen on the suite's prompts:
functions of the held-out stdlib files (``prompts/heldout_files.txt``) that the suite's
prompts do not contain, in the suite's exact prompt format.

Per model, over the first ``--answer-tokens`` tokens of each ideal answer (the renamed
function after its first line):

* ``teacher_forced_top1``: how often the model's top-1 next token is the ideal one, given the
  ideal prefix;
* ``greedy_copy_run``: how many tokens its greedy continuation (``--new-tokens``) agrees
  with the ideal answer before the first difference (mean over examples), and
  ``greedy_exact``: the share of examples whose continuation matches it throughout.

Example:
  python zoo/scripts/eval_copy.py --model zoo/src/lightspec_zoo/models/target --model zoo/build/models/target-copy3
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_data import find_python_lib, list_source, read_text, rename_word, sized_functions  # noqa: E402

ZOO = Path(__file__).resolve().parents[1]
PROMPTS = ZOO / "src" / "lightspec_zoo" / "prompts"


def examples(tok, n: int, answer_tokens: int, seed: int, python_lib: str | None) -> list[tuple[list[int], list[int]]]:
    """Up to ``n`` (prompt ids, ideal answer ids) pairs, in the suite's edit format."""
    heldout = set((PROMPTS / "heldout_files.txt").read_text().split())
    suite = (PROMPTS / "edit.jsonl").read_text()
    cands = []
    for rel, path in list_source("code", find_python_lib(python_lib)):
        if rel not in heldout:
            continue
        text = read_text(path)
        for _f, code, args in sized_functions(text or "", 8, 30, 1400, min_uses=3):
            if not args or json.dumps(code)[1:-1] in suite:
                continue
            old = args[0]
            new = "new_" + old if not old.startswith("_") else "renamed" + old
            renamed = rename_word(code, old, new)
            first, rest = renamed.split("\n", 1)
            prompt = f"# Original:\n{code}\n\n# The same function with `{old}` renamed to `{new}`:\n{first}"
            cands.append((prompt, "\n" + rest))
    random.Random(seed).shuffle(cands)
    out = []
    for prompt, answer in cands:
        p = tok(prompt)["input_ids"]
        full = tok(prompt + answer)["input_ids"]
        if full[: len(p)] != p:  # the boundary merged into one token: not a clean example
            continue
        out.append((p, full[len(p):][:answer_tokens]))
        if len(out) == n:
            break
    return out


@torch.inference_mode()
def measure(path: str, exs, new_tokens: int) -> dict:
    from lightspec_core.pipeline import MTPPipeline

    pipe = MTPPipeline.from_pretrained(path, strategy="none", dtype="float32")
    model = pipe.target
    right = total = 0
    for p, a in exs:
        ids = torch.tensor([p + a])
        logits = model(input_ids=ids).logits[0, len(p) - 1 : -1]
        right += int((logits.argmax(-1) == torch.tensor(a)).sum())
        total += len(a)
    outs = pipe.generate([p for p, _ in exs], max_new_tokens=new_tokens, ignore_eos=True)
    runs, exact = [], 0
    for (_p, a), o in zip(exs, outs):
        got, want = o.token_ids, a[:new_tokens]
        run = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        runs.append(run)
        exact += run == min(len(got), len(want))
    return {"model": path, "examples": len(exs), "teacher_forced_top1": round(right / total, 4),
            "greedy_copy_run": round(sum(runs) / len(runs), 2), "greedy_exact": round(exact / len(exs), 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="an HF model folder (repeatable)")
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--python-lib", default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON object per model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model[0])
    exs = examples(tok, args.examples, args.answer_tokens, args.seed, args.python_lib)
    if not exs:
        sys.exit("no examples: is the Python standard library source installed?")
    for path in args.model:
        r = measure(path, exs, args.new_tokens)
        print(json.dumps(r) if args.json else
              f"{path}: {r['examples']} examples, teacher-forced top-1 {r['teacher_forced_top1']:.3f}, "
              f"greedy copy run {r['greedy_copy_run']:.1f} tokens, exact {r['greedy_exact']:.0%}")


if __name__ == "__main__":
    main()
