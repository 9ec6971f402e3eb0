"""A seeded request's text under tree strategies does not depend on its batch.

The user guide promises it for every strategy with a fixed tree shape: a row's tree is its
own (batch-invariant drafts), and a row whose tree is a chain is verified exactly as a
chain proposal (``verify.py``), while other rows of its batch verify trees.  Before that,
a row drafting a chain in a batch with trees drew its sample by the tree rule, and its text
differed from the one it got alone.  (Adaptive shapes and the ``tree`` budget choose for
the whole batch; the user guide says so.)"""

from __future__ import annotations

import functools

import pytest
import torch

import lightspec_zoo
from lightspec_core import MTPPipeline


@functools.lru_cache(maxsize=None)
def _zoo():
    from lightspec_core.loading import load_model, load_tokenizer

    path = str(lightspec_zoo.model_path())
    return load_model(path, torch.device("cpu"), torch.float32), load_tokenizer(path)


@pytest.mark.parametrize("strategy", ["eagle3_tree:adaptive=false", "dynamic_tree:adaptive=false",
                                      "static_tree:adaptive=false"])
def test_a_seeded_request_gets_the_same_text_alone_and_in_a_batch_of_trees(strategy):
    model, tok = _zoo()
    sets = lightspec_zoo.prompt_sets()
    prompts = [sets[w][0] for w in ("code", "prose", "edit")]
    kw = dict(max_new_tokens=48, temperature=0.8, ignore_eos=True)
    pipe = MTPPipeline(model, tok, strategy=strategy, draft_model=str(lightspec_zoo.model_path("draft")),
                       budget="static:k=8")
    together = pipe.generate(prompts, seed=[5, 6, 7], **kw)
    assert sum(o.stats.accepted for o in together) > 0  # the trees were verified, not only drafted
    for prompt, seed, row in zip(prompts, [5, 6, 7], together):
        alone = pipe.generate([prompt], seed=[seed], **kw)[0]
        assert alone.token_ids == row.token_ids
