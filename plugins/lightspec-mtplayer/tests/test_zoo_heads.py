"""The heads shipped in lightspec-zoo (``models/mtp``): within their size budget, fp16, with a
model card, found by ``head=auto`` for the zoo target, and lossless on it (greedy output equal
to HF's at batch 1 and 2; the heads' drafts are accepted at least sometimes)."""

from __future__ import annotations

import json

import pytest
import torch

lightspec_zoo = pytest.importorskip("lightspec_zoo")

from lightspec_core import MTPPipeline  # noqa: E402

FOLDER = lightspec_zoo.MODELS_DIR / "mtp"
BUDGET_BYTES = 600_000


def test_shipped_heads_fit_their_budget_and_are_fp16():
    from safetensors import safe_open

    total = sum(f.stat().st_size for f in FOLDER.rglob("*") if f.is_file())
    assert total <= BUDGET_BYTES, total
    with safe_open(str(FOLDER / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
    card = (FOLDER / "README.md").read_text()
    for word in ("parameters", "training tokens", "mean accepted length", "lightspec mtplayer train"):
        assert word in card
    log = json.loads((FOLDER / "training_log.json").read_text())
    assert log["steps"] >= 1 and log["tokens"] > 0


def test_auto_finds_the_zoo_heads_and_output_is_the_targets():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = lightspec_zoo.model_path()
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    pipe = MTPPipeline(target, tok, strategy="mtp", budget={"type": "static", "k": 4})
    prompts = ["def add(a, b):\n    return", "To be, or not to be, that is the"]
    outs = pipe.generate(prompts, max_new_tokens=24, ignore_eos=True)
    for p, o in zip(prompts, outs):
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.inference_mode():
            ref = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                                  min_new_tokens=24, eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert o.token_ids == ref
    assert pipe.strategy.head_path.resolve() == FOLDER.resolve()
    assert sum(o.stats.accepted for o in outs) > 0
