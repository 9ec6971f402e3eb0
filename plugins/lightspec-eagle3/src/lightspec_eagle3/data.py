"""Training text for ``lightspec eagle3 train``: files and folders turned into one token stream.

Accepted: token-id arrays (``.bin`` as uint16, the zoo's format; ``.npy``), and text
(``.py .txt .md .rst`` read whole; ``.jsonl`` lines with a ``text`` field, or ``prompt`` +
``completion``/``response``), given as files or folders (searched recursively, sorted, so
a stream is reproducible).  Documents are separated by the tokenizer's eos token.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import numpy as np

from lightspec_core import InvalidValueError

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


def _documents(path: Path) -> list[str]:
    if path.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("text") if isinstance(row, dict) else None
            if text is None and isinstance(row, dict) and "prompt" in row:
                text = str(row["prompt"]) + str(row.get("completion", row.get("response", "")))
            if not isinstance(text, str):
                raise InvalidValueError(f"{path}:{n}: a JSONL training row needs a 'text' (or 'prompt') field")
            docs.append(text)
        return docs
    return [path.read_text(encoding="utf-8", errors="replace")]


def _files(root: Path, exclude: list[str]) -> list[Path]:
    if root.is_file():
        return [root]
    found = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix not in TEXT_SUFFIXES + (".jsonl",):
            continue
        rel = p.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(rel, pat) or rel.endswith(pat) for pat in exclude):
            continue
        found.append(p)
    return found


def load_tokens(paths: list[str], tokenizer, exclude: list[str] = (), max_tokens: int = 0) -> np.ndarray:
    """One int64 token stream from ``paths`` (module docstring); ``exclude`` are glob patterns or
    path suffixes (relative to a given folder) to leave out; ``max_tokens`` > 0 stops early."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    chunks: list[np.ndarray] = []
    total = 0
    for spec in paths:
        root = Path(spec)
        if not root.exists():
            raise InvalidValueError(f"training data {spec!r}: no such file or folder")
        if root.is_file() and root.suffix in (".bin", ".npy"):
            arr = np.fromfile(root, dtype=np.uint16) if root.suffix == ".bin" else np.load(root)
            chunks.append(arr.astype(np.int64))
            total += arr.size
            continue
        files = _files(root, list(exclude))
        if not files:
            raise InvalidValueError(f"training data {spec!r}: no {', '.join(TEXT_SUFFIXES + ('.jsonl',))} files in it")
        for f in files:
            for doc in _documents(f):
                ids = tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos]
                chunks.append(np.asarray(ids, dtype=np.int64))
                total += len(ids)
            if max_tokens and total >= max_tokens:
                break
        if max_tokens and total >= max_tokens:
            break
    if not chunks:
        raise InvalidValueError("no training data: pass --data FILE_OR_FOLDER")
    out = np.concatenate(chunks)
    return out[:max_tokens] if max_tokens else out


def draft_vocabulary(tokens: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """The ``size`` most frequent token ids of ``tokens`` (ties: lower id first), ascending, so
    that ``d2t[i] = ids[i] - i`` is non-negative as in the public checkpoints."""
    if not 0 < size <= vocab:
        raise InvalidValueError(f"draft vocabulary size {size} is invalid: use 1..{vocab} (the target's vocabulary)")
    counts = np.bincount(tokens[tokens < vocab], minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))
    return np.sort(order[:size])
