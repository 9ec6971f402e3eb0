"""The design's showcase (docs/examples/showcase_tree.yaml): n-gram lookup, the draft
model's dynamic tree and layer skip united into one five-level token tree on the zoo
target, token-identical to HF greedy decoding at batch 1 and 4."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

lightspec_zoo = pytest.importorskip("lightspec_zoo")

from lightspec_core import MTPPipeline, get_registry, hookimpl  # noqa: E402

SHOWCASE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "showcase_tree.yaml"
PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n\ndef main(", "To be, or not to be, that is",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self."]
N_NEW = 24


class _Depths:
    """The deepest verified tree and the drafters behind each step (from the step events)."""

    def __init__(self):
        self.sources: set[str] = set()
        self.most = 0

    @hookimpl
    def lightspec_on_stats(self, event):
        if event.kind == "step":
            self.sources.update(s for s in event.sources if s)
            self.most = max(self.most, max(event.accepted, default=0))


def test_showcase_is_lossless_on_the_zoo_target(monkeypatch):
    from transformers import AutoModelForCausalLM

    from lightspec_core import KVCache

    depths = []
    forward = KVCache.forward

    def spy(self, input_ids, input_valid=None, tree=None, **kw):
        if tree is not None and input_ids.shape[1] > 1:
            d = torch.zeros_like(tree)
            for j in range(tree.shape[1]):
                p = tree[:, j]
                d[:, j] = torch.where(p >= 0, d.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, torch.zeros_like(p))
            depths.append(int(d.max()))
        return forward(self, input_ids, input_valid, tree, **kw)

    monkeypatch.setattr(KVCache, "forward", spy)
    sink = _Depths()
    pipe = MTPPipeline.from_pretrained(lightspec_zoo.model_path(), strategy=str(SHOWCASE),
                                       draft_model=lightspec_zoo.model_path("draft"), sinks=[sink])
    assert type(pipe.strategy.fusion).__name__ == "TreeUnion" and len(pipe.strategy.components) == 3
    assert type(pipe.budget).__name__ == "TreeBudget"
    tok = pipe.tokenizer
    ref_model = AutoModelForCausalLM.from_pretrained(lightspec_zoo.model_path(), dtype=torch.float32).eval()
    refs = []
    for p in PROMPTS:
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.inference_mode():
            out = ref_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=N_NEW, min_new_tokens=N_NEW, eos_token_id=None,
                                     pad_token_id=tok.pad_token_id)
        refs.append(out[0, ids.shape[1]:].tolist())
    batch = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert [r.token_ids for r in batch] == refs
    solo = pipe.generate(PROMPTS[0], max_new_tokens=N_NEW, ignore_eos=True)
    assert solo.token_ids == refs[0]
    assert not any(r.stats.failures for r in [*batch, solo])
    # the target verified five-level trees (the verify input's slot 0 is the root: depth 5 is 5 below it)
    assert max(depths) >= 5, depths
    assert any("+" in s for s in sink.sources), sink.sources  # drafts of several drafters merged


def test_bench_accepts_the_showcase(tmp_path):
    """``lightspec bench --strategy docs/examples/showcase_tree.yaml`` runs it (one short prompt)."""
    import json

    from click.testing import CliRunner
    from lightspec_core.cli import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n    return"}) + "\n")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", "--prompts", str(prompts), "--max-new-tokens", "8", "--no-hf",
                                      "--strategy", str(SHOWCASE), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "showcase_tree" in out.read_text()
    assert get_registry()  # the registry survived the CLI run
