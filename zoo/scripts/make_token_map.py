#!/usr/bin/env python3
"""Write a draft model's token map: the N most frequent token ids of its training data.

With ``token_map.json`` in its folder, LightSpec's ``draft_model`` computes the draft's
logits only for these ids plus every token of the request (see the user guide): the
lm_head is 64% of the zoo draft's weights, and a draft step reads all of them.  The file
is the public format the drafter reads: ``{"token_ids": [most frequent first, ...]}``,
with the counts' source and coverage recorded beside it.

Example (the zoo's draft; ``train.bin`` comes from ``prepare_data.py``):
  python zoo/scripts/make_token_map.py --tokens zoo/build/tokens/train.bin --size 2048 \\
      --out zoo/src/lightspec_zoo/models/draft/token_map.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np


def token_map(tokens: np.ndarray, vocab: int, size: int) -> tuple[list[int], float]:
    """The ``size`` most frequent ids (ties: lower id first) and the share of ``tokens`` they cover."""
    if not 1 <= size <= vocab:
        raise SystemExit(f"--size {size} is invalid: use 1..{vocab}")
    counts = np.bincount(tokens.astype(np.int64), minlength=vocab)[:vocab]
    order = np.argsort(-counts, kind="stable")[:size]
    return [int(i) for i in order], float(counts[order].sum() / max(1, counts.sum()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", required=True, help="uint16 token file (prepare_data.py's train.bin)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--size", type=int, default=2048, help="how many token ids to keep")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    path = Path(args.tokens)
    tokens = np.fromfile(path, dtype=np.uint16)
    ids, coverage = token_map(tokens, args.vocab, args.size)
    data = {
        "token_ids": ids,
        "source": {"file": path.name, "tokens": int(tokens.size),
                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
        "coverage_of_source": round(coverage, 4),
        "how": "the most frequent token ids of the source, most frequent first (zoo/scripts/make_token_map.py)",
    }
    Path(args.out).write_text(json.dumps(data) + "\n")
    print(f"{args.out}: {len(ids)} ids covering {coverage:.1%} of {tokens.size:,} tokens")


if __name__ == "__main__":
    main()
