#!/usr/bin/env python3
"""Build the fine-tuning mixture that teaches the zoo target to copy when asked.

The pre-trained target rarely reproduces a function it was just shown, so copy-heavy
prompts (the suite's ``edit`` workload: "the same function with `x` renamed to
`new_x`") gave n-gram lookup little to match.  Real LLMs copy readily (summaries, RAG
answers, code edits); this mixture gives the toy model that behaviour.

* copy documents: functions of 4-40 lines from the stdlib files that are *not* held out
  (``heldout_files.txt`` lists the held-out ones; the benchmark prompts come only from
  those), each written as ``# Original:`` + the function, then an instruction and the
  function again with one argument renamed (several naming styles), or unchanged;
* window documents (``--windows N``): the same for N random windows of 6-30 lines of
  those files (any code, not only whole functions), with a word used at least twice in
  the window renamed, or unchanged, so that copying is not tied to ``def`` boundaries;
* general text: random contiguous windows of the original training tokens
  (``--general-tokens`` / ``train.bin``), so the model keeps its general ability;
* eval.bin: the original held-out tokens, unchanged (the perplexity the model card reports).

Output: ``--out`` with ``train.bin`` / ``eval.bin`` (uint16) and ``meta.json``.
Deterministic for a given ``--seed`` and input files.

Example:
  python zoo/scripts/make_copy_data.py --out zoo/build/tokens-copy
"""
from __future__ import annotations

import argparse
import hashlib
import json
import keyword
import random
import re
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_data import IDENT_RE, find_python_lib, list_source, read_text, rename_word, sized_functions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo"


def renames(old: str, rng: random.Random) -> str:
    """A new name for ``old``, in one of several styles (the suite's is ``new_x``)."""
    style = rng.randrange(5)
    if style == 0:
        return "new_" + old if not old.startswith("_") else "renamed" + old
    if style == 1:
        return old + "_value"
    if style == 2:
        return "the_" + old.lstrip("_")
    if style == 3:
        return old.upper() if len(old) < 12 else "arg_" + old
    return old + "2"


def copy_documents(files: list[tuple[str, str]], rng: random.Random) -> list[str]:
    docs = []
    for _rel, text in files:
        for _f, code, args in sized_functions(text, 4, 40, 1800, min_uses=2):
            if args and rng.random() < 0.85:
                old = rng.choice(args)
                new = renames(old, rng)
                body = rename_word(code, old, new)
                head = f"# The same function with `{old}` renamed to `{new}`:"
            else:
                body = code
                head = rng.choice(["# The same function, unchanged:", "# A copy of the function above:"])
            docs.append(f"# Original:\n{code}\n\n{head}\n{body}\n")
    rng.shuffle(docs)
    return docs


def window_documents(files: list[tuple[str, str]], rng: random.Random, n: int) -> list[str]:
    """``n`` copy documents from random 6-30-line windows of ``files`` (see the module doc)."""
    docs: list[str] = []
    tries = 0
    while len(docs) < n and tries < 20 * n:
        tries += 1
        lines = rng.choice(files)[1].split("\n")
        size = rng.randint(6, 30)
        if len(lines) <= size:
            continue
        start = rng.randrange(0, len(lines) - size)
        code = textwrap.dedent("\n".join(lines[start:start + size])).strip("\n")
        if len(code) > 1800 or sum(1 for ln in code.split("\n") if ln.strip()) < 4:
            continue
        words = [w for w in set(IDENT_RE.findall(code))
                 if not keyword.iskeyword(w) and len(re.findall(rf"\b{re.escape(w)}\b", code)) >= 2]
        if words and rng.random() < 0.7:
            old = rng.choice(sorted(words))
            new = renames(old, rng)
            body, head = rename_word(code, old, new), f"# The same code with `{old}` renamed to `{new}`:"
        else:
            body, head = code, rng.choice(["# The same code, unchanged:", "# A copy of the code above:"])
        docs.append(f"# Original:\n{code}\n\n{head}\n{body}\n")
    return docs


def training_code_files(base: Path, heldout: set[str]) -> list[tuple[str, str]]:
    """(relative name, text) of every stdlib source file that is not held out."""
    files = []
    for rel, p in list_source("code", base):
        if rel in heldout:
            continue
        text = read_text(p)
        if text and len(text.encode()) <= 300_000:
            files.append((rel, text))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ZOO / "build" / "tokens-copy"))
    ap.add_argument("--tokens", default=str(ZOO / "build" / "tokens"), help="the original tokenized corpus")
    ap.add_argument("--tokenizer", default=str(ZOO / "build" / "tokenizer"))
    ap.add_argument("--python-lib", default=None)
    ap.add_argument("--copy-fraction", type=float, default=0.5, help="share of copy documents in train.bin")
    ap.add_argument("--windows", type=int, default=0, help="window copy documents to add (module doc)")
    ap.add_argument("--general-window", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    eot = tok.eos_token_id
    heldout = set((ZOO / "src" / "lightspec_zoo" / "prompts" / "heldout_files.txt").read_text().split())
    files = training_code_files(find_python_lib(args.python_lib), heldout)
    rng = random.Random(args.seed)
    docs = copy_documents(files, rng)
    windows = window_documents(files, rng, args.windows) if args.windows else []
    if windows:
        docs += windows
        rng.shuffle(docs)
    copy_docs = [np.asarray(tok(d)["input_ids"] + [eot], dtype=np.uint16) for d in docs]
    copy_ids = sum(len(d) for d in copy_docs)
    general = np.memmap(Path(args.tokens) / "train.bin", dtype=np.uint16, mode="r")
    n_general = int(copy_ids * (1 - args.copy_fraction) / args.copy_fraction)
    w = args.general_window
    chunks = []
    for _ in range(max(1, n_general // w)):
        s = rng.randrange(0, len(general) - w)
        chunks.append(np.asarray(general[s:s + w]))
    # interleave whole copy documents and general windows at random (a document is never split)
    pieces = copy_docs + chunks
    rng.shuffle(pieces)
    train = np.concatenate(pieces).astype(np.uint16)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train.tofile(out / "train.bin")
    shutil.copyfile(Path(args.tokens) / "eval.bin", out / "eval.bin")
    meta = json.loads((Path(args.tokens) / "meta.json").read_text())
    meta["train"] = {"tokens": int(len(train)), "copy_documents": len(docs), "window_documents": len(windows),
                     "copy_fraction": args.copy_fraction, "seed": args.seed, "copy_tokens": copy_ids,
                     "general_tokens": int(sum(len(c) for c in chunks)), "source_files": len(files),
                     "sha256": hashlib.sha256(train.tobytes()).hexdigest()}
    meta["made_by"] = "zoo/scripts/make_copy_data.py"
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"{len(docs):,} copy documents from {len(files):,} files: {copy_ids:,} tokens; "
          f"{meta['train']['general_tokens']:,} general tokens; train.bin {len(train):,} tokens -> {out}")


if __name__ == "__main__":
    main()
