"""Memory and context limits (issue: the KV cache was allocated up front for prompt +
max_new_tokens; a tiny GPT-2 with 64 positions failed mid-generation with IndexError and
lost the batch; one long prompt padded seven short ones to its length)."""

from __future__ import annotations

import torch
from lightspec_core.engine_parts import length_groups
from models import ToyTokenizer, build_model, hf_greedy

from lightspec_core import KVCache, MTPPipeline


def test_rows_stop_at_the_context_length_instead_of_failing():
    """GPT-2 with 64 positions: a 40-token prompt asked for 60 tokens stops at the context
    (finish_reason "length") with HF's tokens; in a batch the other rows are unaffected."""
    model = build_model("gpt2", n_positions=64)
    pipe = MTPPipeline(model, ToyTokenizer(), strategy="ngram")
    long_prompt, short_prompt = list(range(10, 50)), list(range(60, 70))
    out = pipe.generate([long_prompt, short_prompt], max_new_tokens=60, ignore_eos=True)
    assert out[0].finish_reason == "length" and len(long_prompt) + len(out[0].token_ids) == 64
    assert out[0].token_ids == hf_greedy(model, long_prompt, 64 - len(long_prompt))
    assert out[1].finish_reason == "length" and len(short_prompt) + len(out[1].token_ids) == 64
    assert out[1].token_ids == hf_greedy(model, short_prompt, 64 - len(short_prompt))


def test_the_kv_cache_grows_on_demand(monkeypatch):
    """A large max_new_tokens does not allocate its whole length up front: slabs start at
    the prompt plus a short stretch and double as tokens arrive."""
    capacities = []
    init = KVCache.__init__

    def spy(self, model, batch, device, capacity=256, per_row=None):
        capacities.append(capacity)
        init(self, model, batch, device, capacity, per_row)

    monkeypatch.setattr(KVCache, "__init__", spy)
    model = build_model("llama", max_position_embeddings=4096)
    out = MTPPipeline(model, ToyTokenizer(), strategy="none").generate([[5, 6, 7]], max_new_tokens=4000, stop="a")
    assert capacities[0] < 400 and len(out[0].token_ids) <= 4000


def test_prompts_of_very_different_lengths_run_as_separate_batches():
    """One 300-token prompt and seven short ones: two batches (the long one's slabs are not
    given to the short rows), and the outputs are the same as decoding each alone."""
    assert length_groups([300] + [10] * 7, 96) == [[0, 1, 2], [3, 4, 5, 6, 7]]  # padding at most doubles a group
    assert length_groups([40, 35, 50, 45], 96) == [[0, 1, 2, 3]]  # similar lengths: one batch
    model = build_model("llama", layers=2)
    prompts = [list(torch.randint(3, 500, (300,), generator=torch.Generator().manual_seed(0)).tolist())]
    prompts += [[7 + i, 8, 9, 10] for i in range(7)]
    out = MTPPipeline(model, ToyTokenizer(), strategy="ngram").generate(prompts, max_new_tokens=8, ignore_eos=True)
    assert [o.token_ids for o in out] == [hf_greedy(model, p, 8) for p in prompts]
