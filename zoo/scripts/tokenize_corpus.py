#!/usr/bin/env python3
"""Tokenize data/corpus/{train,eval}_*.txt once into flat uint16 token files (np.memmap-able).

Output (default zoo/build/tokens/): train.bin, eval.bin, meta.json.  Documents are separated by
the `<|endoftext|>` token (id 0).  Together with zoo/build/tokenizer/ this folder is all that
train.py needs, so it is what gets carried to a GPU machine that has no corpus.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
EOT = "<|endoftext|>"


def encode_files(tok: Tokenizer, files: list[str]) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    parts = []
    for fn in files:
        docs = [d for d in Path(fn).read_text(encoding="utf-8").split(EOT) if d]
        for enc in tok.encode_batch(docs):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.asarray([eot], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default=str(ROOT / "data" / "corpus"))
    ap.add_argument("--tokenizer", default=str(ROOT / "zoo" / "build" / "tokenizer"))
    ap.add_argument("--out", default=str(ROOT / "zoo" / "build" / "tokens"))
    args = ap.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    assert tok.get_vocab_size() <= 65535
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"tokenizer_sha256": hashlib.sha256(
        Path(args.tokenizer, "tokenizer.json").read_bytes()).hexdigest(),
        "vocab_size": tok.get_vocab_size(), "dtype": "uint16", "eot_id": tok.token_to_id(EOT)}
    for split in ("train", "eval"):
        files = sorted(glob.glob(os.path.join(args.corpus, f"{split}_*.txt")))
        if not files:
            raise SystemExit(f"no {split}_*.txt in {args.corpus}")
        arr = encode_files(tok, files)
        arr.tofile(out / f"{split}.bin")
        nbytes = sum(os.path.getsize(f) for f in files)
        meta[split] = {"tokens": int(arr.size), "text_bytes": nbytes,
                       "bytes_per_token": round(nbytes / max(1, arr.size), 3),
                       "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
        print(f"{split}: {arr.size:,} tokens from {nbytes:,} bytes ({nbytes / arr.size:.2f} B/token)")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
