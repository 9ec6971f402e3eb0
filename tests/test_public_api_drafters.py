"""A tree drafter and a hidden-state drafter written only against the public API
(``tests/public_api_drafters.py``) are lossless: greedy output token-identical to HF's at
batch 1 and 8, the tree one through a real tree mask (its verify forwards carry parents),
with accepted paths that are not the first branch; tree sampling keeps the distribution."""

from __future__ import annotations

import pytest
from models import ToyTokenizer, build_model, cached_model, hf_greedy, make_prompts
from public_api_drafters import FeatureHeadDrafter, TreeLookupDrafter

from lightspec_core import KVCache, MTPPipeline

N_NEW = 16
PROMPTS = make_prompts(8, seed=2)


@pytest.fixture
def tree_forwards(monkeypatch):
    """Counts the KV-cache forwards that carried a token tree (``tree=``)."""
    seen = []
    forward = KVCache.forward

    def spy(self, input_ids, input_valid=None, tree=None, **kw):
        if tree is not None:
            seen.append(int((tree[:, 1:] == 0).sum()))  # nodes hanging directly under the root, beyond the first
        return forward(self, input_ids, input_valid, tree, **kw)

    monkeypatch.setattr(KVCache, "forward", spy)
    return seen


def _check(arch, drafter, budget, lean=True, prompts=PROMPTS):
    model = cached_model(arch)
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=drafter, budget=budget, lean_target=lean)
    batch = pipe.generate(prompts, max_new_tokens=N_NEW, ignore_eos=True)
    refs = [hf_greedy(model, p, N_NEW) for p in prompts]
    assert [r.token_ids for r in batch] == refs, f"{arch}: batch of {len(prompts)} differs from HF greedy"
    if getattr(drafter, "hidden_layers", None) and hasattr(drafter, "check_states"):
        for rid, r in enumerate(batch):  # every committed token's final hidden state, as a full forward gives
            drafter.check_states(rid, prompts[rid] + r.token_ids[:-1])
    solo = pipe.generate([prompts[1]], max_new_tokens=N_NEW, ignore_eos=True)[0]
    assert solo.token_ids == refs[1]
    return pipe, batch


@pytest.mark.parametrize("arch,lean", [("llama", True), ("llama", False), ("qwen3", True), ("mistral", False),
                                       ("gemma", False), ("phi3", False)])
def test_tree_drafter_is_lossless_through_a_real_tree_mask(arch, lean, tree_forwards):
    model = cached_model(arch)
    drafter = TreeLookupDrafter(model, width=3, depth=3)
    pipe, batch = _check(arch, drafter, {"type": "static", "k": 6}, lean)
    assert pipe.engine.runner.supports_trees()
    assert drafter.trees > 0 and tree_forwards, "no multi-branch tree reached the target"
    accepted = sum(r.stats.accepted for r in batch)
    assert accepted > 0
    # the reference branch is the last one: accepted paths ran through later branches (compaction)
    assert any(r.stats.mean_accepted_length > 1.5 for r in batch)


def test_tree_drafter_under_the_dynamic_budget_gets_every_hidden_state():
    """Plain steps between drafts (the dynamic budget decides): the states of tokens committed
    meanwhile are handed over at the next propose, with no gap (the drafter asserts it)."""
    drafter = TreeLookupDrafter(cached_model("llama"))
    _check("llama", drafter, None)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_feature_head_drafter_is_lossless(arch):
    model = cached_model(arch)
    drafter = FeatureHeadDrafter(model, max_draft=3)
    pipe, batch = _check(arch, drafter, {"type": "static", "k": 3})
    assert sum(r.stats.drafted for r in batch) > 0
    # every committed token's feature arrived once (prompts, then each step's kept slots)
    assert drafter.received >= sum(len(p) + N_NEW - 1 for p in PROMPTS)


def test_tree_sampling_keeps_the_distribution():
    """Sampled tree verification (SpecInfer's recursive rejection over siblings, one-hot
    drafts): the output's token distribution equals plain sampling's (chi-square)."""
    from collections import Counter

    vocab = 24
    model = build_model("llama", vocab_size=vocab, seed=5)
    tok = ToyTokenizer(vocab)
    prompt = [5, 9, 5, 9, 5, 9, 5]
    n = 500
    params = dict(temperature=1.0, ignore_eos=True, max_new_tokens=6)
    plain = MTPPipeline(model, tok, strategy="none").generate([prompt] * n, seed=list(range(n)), **params)
    drafter = TreeLookupDrafter(model, width=3, depth=2, check_hidden=False)
    spec = MTPPipeline(model, tok, strategy=drafter, budget={"type": "static", "k": 4}).generate(
        [prompt] * n, seed=list(range(10_000, 10_000 + n)), **params)
    assert drafter.trees > 0 and sum(r.stats.accepted for r in spec) > 0
    for pos in range(1, 6):
        a, b = Counter(r.token_ids[pos] for r in plain), Counter(r.token_ids[pos] for r in spec)
        cats = [c for c in set(a) | set(b) if a[c] + b[c] >= 10]
        stat = sum((a[c] - b[c]) ** 2 / (a[c] + b[c]) for c in cats)  # equal sample sizes
        df = max(1, len(cats) - 1)
        assert stat < df + 4 * (2 * df) ** 0.5 + 10, f"position {pos}: chi2 {stat:.1f} on {df} df"


def test_hf_forward_hidden_states_leave_no_hooks_on_the_model():
    """On HF's forward, hidden states are captured with hooks that exist only during the
    target runner's forwards: a model passed in carries none of them afterwards."""
    model = build_model("llama", seed=3)
    drafter = FeatureHeadDrafter(model)
    out = MTPPipeline(model, ToyTokenizer(), strategy=drafter, budget={"type": "static", "k": 2},
                      lean_target=False).generate(PROMPTS[:2], max_new_tokens=6, ignore_eos=True)
    assert [o.token_ids for o in out] == [hf_greedy(model, p, 6) for p in PROMPTS[:2]]
    assert drafter.received > 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
