"""Sampled tree verification keeps the target's distribution: the core's convergence
test (two-sample chi-square against plain sampling, as tests/test_sampling_distribution.py)
run on this plugin's trees: dynamic and static trees over a draft model and over n-gram
lookup, and the union of a chain drafter with a tree."""

from __future__ import annotations

import copy

import pytest
import torch
from models import ToyTokenizer, build_model
from stat_tests import chi2_sf, two_sample_chi2

from lightspec_core import MTPPipeline, get_registry

SAMPLING = dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.05)
N_ROWS = 1000
N_NEW = 4
VOCAB = 64


@pytest.fixture(scope="module")
def e2e():
    """A vocab-64 target, a draft that is a perturbed copy of it, and a prompt holding every
    token once (so n-gram lookup finds any sampled token and drafts what followed)."""
    tok = ToyTokenizer(VOCAB)
    target = build_model("llama", vocab_size=VOCAB)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    prompt = (torch.randperm(VOCAB - 3, generator=g) + 3).tolist()
    base = MTPPipeline(target, tok, strategy="none").generate([prompt] * N_ROWS, max_new_tokens=N_NEW,
                                                             seed=list(range(N_ROWS)), ignore_eos=True, **SAMPLING)
    return tok, target, draft, prompt, [tuple(o.token_ids) for o in base]


STRATEGIES = {
    "dynamic_tree": {"type": "dynamic_tree", "depth": 3, "top_k": 3, "total_tokens": 6, "adaptive": False},
    "static_tree_ngram": {"type": "static_tree", "drafter": "ngram", "drafter_options": {"min_ngram": 1},
                          "choices": [[0], [1], [0, 0], [0, 0, 0]], "adaptive": False},
    "union": {"type": "combination", "kind": "union",
              "components": [{"type": "ngram", "min_ngram": 1, "max_draft": 2}, "draft_model",
                             {"type": "static_tree", "choices": [[0], [1], [0, 0]], "adaptive": False}]},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_tree_sampling_matches_plain_sampling(e2e, name):
    from lightspec_core.strategy_files import build_strategy

    tok, target, draft, prompt, base = e2e
    strategy = build_strategy(STRATEGIES[name], get_registry())
    pipe = MTPPipeline(target, tok, strategy=strategy, draft_model=draft, budget={"type": "static", "k": 6})
    out = pipe.generate([prompt] * N_ROWS, max_new_tokens=N_NEW, seed=list(range(10_000, 10_000 + N_ROWS)),
                        ignore_eos=True, **SAMPLING)
    spec = [tuple(o.token_ids) for o in out]
    drafted = sum(o.stats.drafted for o in out)
    accepted = sum(o.stats.accepted for o in out)
    assert drafted > N_ROWS and 0 < accepted < drafted, (drafted, accepted)
    assert not any(o.stats.failures for o in out)
    for pos in range(1, N_NEW):
        stat, df = two_sample_chi2([s[pos] for s in base], [s[pos] for s in spec])
        assert chi2_sf(stat, df) > 1e-3, f"{name} position {pos}: chi2={stat:.1f} df={df}"
    for a, b in ((0, 1), (1, 2), (2, 3)):
        stat, df = two_sample_chi2([s[a:b + 1] for s in base], [s[a:b + 1] for s in spec])
        assert chi2_sf(stat, df) > 1e-3, f"{name} pairs {a},{b}: chi2={stat:.1f} df={df}"


def test_the_chi_square_check_has_power(e2e):
    """The same check rejects sampling at another temperature (it can fail)."""
    tok, target, draft, prompt, base = e2e
    other = MTPPipeline(target, tok, strategy="none").generate(
        [prompt] * N_ROWS, max_new_tokens=N_NEW, seed=list(range(N_ROWS)), ignore_eos=True,
        **{**SAMPLING, "temperature": 1.6})
    stat, df = two_sample_chi2([s[1:3] for s in base], [tuple(o.token_ids)[1:3] for o in other])
    assert chi2_sf(stat, df) < 1e-3
