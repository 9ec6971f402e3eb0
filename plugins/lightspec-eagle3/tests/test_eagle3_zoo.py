"""The zoo's EAGLE-3 head: it ships in the public format within its size budget, loads
against the zoo target, is found by 'auto', and the example YAML (n-gram cascaded into
eagle3) decodes exactly what HF greedy decodes, with drafts accepted."""

from __future__ import annotations

import json
from pathlib import Path

import lightspec_zoo
import pytest
import torch
from lightspec_eagle3.checkpoint import load_head

from lightspec_core import MTPPipeline

HEAD = lightspec_zoo.MODELS_DIR / "eagle3"
EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eagle3_cascade.yaml"


@pytest.fixture(scope="module")
def zoo():
    tok, target = lightspec_zoo.load()
    return tok, target


def test_shipped_head_format_and_size():
    files = {p.name: p.stat().st_size for p in HEAD.iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "training_log.json"} <= set(files)
    # the head's share of the zoo's 40 MiB (zoo/tests/test_zoo.py checks the whole): 2.0 MB
    assert sum(files.values()) <= 2_000_000, files
    log = json.loads((HEAD / "training_log.json").read_text())
    assert log["steps"] > 0 and log["tokens"] > 0


def test_shipped_head_loads_and_auto_finds_it(zoo):
    tok, target = zoo
    head = load_head(HEAD, target)
    assert head.cfg.taps(7) == [2, 4, 6] and head.lm_head is None and head.embed_tokens is None
    from lightspec_eagle3.drafter import zoo_head_for

    assert zoo_head_for(target) == HEAD


def _hf(target, ids, n):
    x = torch.tensor([ids])
    out = target.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                          min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_example_yaml_cascade_is_lossless_on_the_zoo_target(zoo):
    from lightspec_core.plugins import get_registry
    from lightspec_core.strategy_files import load_strategy_file

    tok, target = zoo
    strategy, _, _ = load_strategy_file(EXAMPLE, get_registry())
    pipe = MTPPipeline(target, tok, strategy=strategy, budget={"type": "static", "k": 4})
    prompts = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n\ndef main():\n"]
    outs = pipe.generate(prompts, max_new_tokens=32, ignore_eos=True)
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf(target, tok(p)["input_ids"], 32)
    assert sum(o.stats.accepted for o in outs) > 0
