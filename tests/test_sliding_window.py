"""Sliding-window attention stays lossless in ragged batches (issue: batched decoding of
Mistral and Gemma2 with a window differed from HF greedy from the 2nd token, even with
`none`).  Mistral (every layer slides), Gemma2 (sliding and full layers alternate) and Qwen2
with ``use_sliding_window``, windows of 16 with prompts and outputs longer than that, at
batch 1 and 8: every row equals HF greedy of its prompt alone."""

from __future__ import annotations

import random

import pytest
import torch
from models import ToyTokenizer, build_model, hf_greedy

from lightspec_core import MTPPipeline

WINDOW = 16
N_NEW = 24
ARCHS = {
    "mistral": ("mistral", dict(sliding_window=WINDOW)),
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "gemma2": ("gemma2", dict(sliding_window=WINDOW)),
}


def _model(name: str, layers: int | None = None, seed: int = 0):
    import transformers
    from models import ARCHS as BASE

    if name == "gemma2":
        cfg = transformers.Gemma2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers or 4,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                                        initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        attn_implementation="eager")  # transformers has no SDPA path for Gemma2
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        return model
    arch, extra = ARCHS[name]
    assert arch in BASE
    return build_model(arch, layers=layers, seed=seed, **extra)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        L = [20, 37, 5, 28, 44, 17, 31, 9][i % 8]
        motif = [rng.randrange(3, 512) for _ in range(rng.choice([3, 5, 7]))]
        out.append((motif * 10)[:L] if i % 2 == 0 else [rng.randrange(3, 512) for _ in range(L)])
    return out


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request):
    model = _model(request.param)
    prompts = _prompts(8)
    refs = [hf_greedy(model, p, N_NEW) for p in prompts]
    return request.param, model, prompts, refs


@pytest.mark.parametrize("strategy", ["none", "ngram", "draft_model"])
def test_sliding_window_rows_equal_hf_greedy_alone(arch, strategy):
    name, model, prompts, refs = arch
    draft = _model(name, layers=1, seed=1) if strategy == "draft_model" else None
    for budget in (None, {"type": "static", "k": 4}):
        pipe = MTPPipeline(model, ToyTokenizer(), strategy=strategy, draft_model=draft, budget=budget)
        batch = pipe.generate(prompts, max_new_tokens=N_NEW, ignore_eos=True)
        for i, (r, ref) in enumerate(zip(batch, refs)):
            assert r.token_ids == ref, f"{name}/{strategy}/budget={budget}: batch-8 row {i} (prompt {len(prompts[i])})"
        solo = pipe.generate([prompts[4]], max_new_tokens=N_NEW, ignore_eos=True)[0]
        assert solo.token_ids == refs[4]
