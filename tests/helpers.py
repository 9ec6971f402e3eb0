"""Small shared helpers for tests that need a *real* Hugging Face tokenizer (one that
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round-trip), e.g. CLI runs.

* ``tiny_tokenizer()``  a word-level ``PreTrainedTokenizerFast`` (whitespace split),
  ids 0..3 = <pad>, <bos>, <eos>, <unk>; ``TINY_VOCAB`` ids in all.
* ``tiny_model(arch="llama", vocab=TINY_VOCAB, seed=0)`` a tiny fp32 causal LM
  (built with ``tests/models.py``'s configs) whose vocabulary matches the tokenizer.
* ``save_tiny(path)`` both saved into one folder, loadable with ``from_pretrained``.
* ``hf_reference(model, tok, prompt, n)`` HF ``generate(do_sample=False)`` with an
  explicit attention mask, eos disabled: the lossless reference.
* ``ragged_steps(kv, ...)`` forwards through a ``KVCache`` of 3 rows that exercise
  padding holes, per-row rollback and ragged appends (lean-forward comparisons).
* ``run_cli(args, capsys)`` ``lightspec ARGS`` in this process: (exit code, stdout, stderr).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

TINY_VOCAB = 96
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
WORDS = (
    "the a an of to and in is it that for on with as was at by be this from or have not are but "
    "one two three four five six seven eight nine ten cat dog bird fish red green blue big small "
    "def return if else for while print x y z ( ) : = + - , . hello world"
).split()


def tiny_tokenizer(vocab: int = TINY_VOCAB):
    """A word-level fast tokenizer with exactly ``vocab`` ids (no BOS added on encode)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(WORDS))
    names = SPECIALS + words
    names += [f"w{i}" for i in range(vocab - len(names))]
    names = names[:vocab]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def tiny_model(arch: str = "llama", vocab: int = TINY_VOCAB, seed: int = 0, layers: int | None = 2):
    """A tiny randomly initialised fp32 causal LM in eval mode (deterministic per seed).

    Its generation config has eos 2 and pad 0 (like the tokenizer)."""
    from models import build_model

    model = build_model(arch, layers=layers, seed=seed, vocab_size=vocab)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


@functools.lru_cache(maxsize=None)
def cached_tiny(arch: str = "llama", vocab: int = TINY_VOCAB, seed: int = 0):
    """``(model, tokenizer)``, built once per process (do not modify them)."""
    return tiny_model(arch, vocab, seed), tiny_tokenizer(vocab)


def save_tiny(path, arch: str = "llama", seed: int = 0) -> Path:
    """Save a tiny model and its tokenizer into ``path``; return the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model, tok = cached_tiny(arch, TINY_VOCAB, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@torch.inference_mode()
def hf_reference(model, tokenizer, prompt, max_new_tokens: int) -> list[int]:
    """Greedy HF ``generate`` for one prompt (text or ids), explicit attention mask, no eos."""
    ids = tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
    x = torch.tensor([ids])
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids):].tolist()


EXAMPLE_PLUGIN = Path(__file__).resolve().parent / "example_plugin"


def ensure_example_plugin() -> bool:
    """pip-install ``tests/example_plugin`` (editable, no deps) into the running
    interpreter's environment unless it is already installed from this folder, and make
    it importable in this process (a fresh ``.pth`` is only read at interpreter start).
    Returns whether it installed it (then ``remove_example_plugin`` takes it out again)."""
    import importlib
    import importlib.metadata as md
    import subprocess
    import sys

    try:
        url = md.distribution("lightspec-example-plugin").read_text("direct_url.json") or ""
        installed = EXAMPLE_PLUGIN.as_uri() in url
    except md.PackageNotFoundError:
        installed = False
    if not installed:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(EXAMPLE_PLUGIN)]
        # offline-friendly first (uses the environment's setuptools); else let pip fetch the build backend
        if subprocess.run(cmd[:-2] + ["--no-build-isolation"] + cmd[-2:]).returncode != 0:
            subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
        forget_discovered_plugins()
    try:
        import lightspec_example  # noqa: F401
    except ImportError:
        sys.path.append(str(EXAMPLE_PLUGIN / "src"))
        importlib.invalidate_caches()
    return not installed


def remove_example_plugin() -> None:
    """Uninstall what ``ensure_example_plugin`` installed: a test run leaves no plugin behind
    in the environment (every pipeline there would load its statistics sink)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "lightspec-example-plugin"], check=True)
    forget_discovered_plugins()


def forget_discovered_plugins() -> None:
    """Drop stevedore's per-process entry-point caches, so that the next plugin
    discovery sees distributions installed since the first one."""
    from stevedore import ExtensionManager

    ExtensionManager.ENTRY_POINT_CACHE.pop("lightspec.plugins", None)
    try:
        from stevedore import _cache

        _cache._c._internal.clear()
    except (ImportError, AttributeError):
        pass


def ragged_steps(kv, seed: int = 0, one_token_steps: int = 1, wide: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Through ``kv`` (a ``KVCache`` of 3 rows): a ragged prefill, a per-row rollback, a
    ragged append, ``one_token_steps`` one-token steps and, if ``wide``, a ``wide``-token
    step; returns (logits, which positions are real) for each forward."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (3, 9), generator=g)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, 6:] = False
    valid[2, 4:] = False
    out = [(kv.forward(ids, valid).logits, valid)]
    kv.truncate(torch.tensor([5, 3, 4]))
    valid2 = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    out.append((kv.forward(ids[:, :3], valid2).logits, valid2))
    for j in range(one_token_steps):
        out.append((kv.forward(ids[:, j : j + 1]).logits, torch.ones(3, 1, dtype=torch.bool)))
    if wide:
        out.append((kv.forward(ids[:, :wide]).logits, torch.ones(3, wide, dtype=torch.bool)))
    return out


def ragged_append(batch: int, rnd: int, g: torch.Generator) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
    """A ragged "verify" block for round ``rnd``: row b gets ``1 + (b + rnd) % 4`` new random
    tokens, then padding.  Returns (real tokens per row, ids ``[B, Q]``, which slots are
    real ``[B, Q]`` or ``None`` when all are)."""
    q = [1 + (b + rnd) % 4 for b in range(batch)]
    Q = max(q)
    new = torch.randint(3, 500, (batch, Q), generator=g)
    v = torch.arange(Q)[None, :] < torch.tensor(q)[:, None]
    return q, new, None if bool(v.all()) else v


def run_cli(args, capsys) -> tuple[int, str, str]:
    """``lightspec ARGS`` in this process: (exit code, stdout, stderr)."""
    from lightspec_core.cli import main

    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def put_in_hub_cache(cache: Path, repo: str, src: Path) -> Path:
    """Copy the files of folder ``src`` into HF hub cache ``cache`` as repository ``repo``, laid
    out as ``hf download`` lays it out: ``models--org--name/{blobs/<sha256>, refs/main,
    snapshots/<commit>/<file> -> blob}``.  Returns the snapshot folder."""
    import hashlib
    import os

    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / HUB_COMMIT
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(HUB_COMMIT)
    for f in Path(src).iterdir():
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return snap


def offline_hub_cache(tmp_path: Path, monkeypatch) -> Path:
    """An empty HF hub cache in ``tmp_path``, offline.  huggingface_hub reads its settings at
    import, so its constants are set as the environment says."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def fake_online_hub(tmp_path: Path, monkeypatch) -> dict:
    """huggingface_hub "online" with its ``snapshot_download`` replaced by a recorder, so no
    test reaches the network.  The returned dict's ``calls`` gets each call's ``(repo,
    revision, allow_patterns, local_files_only)``; its ``answer`` is what the fake does: a
    folder to return (default ``tmp_path``), or an exception to raise."""
    import huggingface_hub
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    state = {"calls": [], "answer": tmp_path}

    def fake(repo_id, revision=None, allow_patterns=None, local_files_only=False, **kw):
        state["calls"].append((repo_id, revision, allow_patterns, local_files_only))
        if isinstance(state["answer"], BaseException):
            raise state["answer"]
        return str(state["answer"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return state
