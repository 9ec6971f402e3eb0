"""Adaptive verification: the selection rule on synthetic survival scores and costs, the
training-free survival, trimming chains and trees, and losslessness end to end (greedy = HF at
batch 1 and 8 around ``dspark`` and ``ngram``)."""

from __future__ import annotations

import pytest
import torch
from dspark_fixtures import ToyTok, hf_greedy, prompts, tiny_target, write_checkpoint
from lightspec_dspark.adaptive import AdaptiveStrategy, node_survival, select_top_k, trim

from lightspec_core import DraftProposal, MTPPipeline


def _brute(S, valid, draft, verify):
    """Every k, by hand: the value of keeping the k best nodes."""
    B, N = S.shape
    items = sorted([(-float(S[b, j]), j, b) for b in range(B) for j in range(N) if valid[b, j]])
    best, best_k = B / (draft + verify(1)), 0
    for k in range(1, len(items) + 1):
        counts = [0] * B
        for _, _, b in items[:k]:
            counts[b] += 1
        v = (B + sum(-s for s, _, _ in items[:k])) / (draft + verify(1 + max(counts)))
        if v > best:
            best, best_k = v, k
    return best_k


def test_selection_keeps_prefixes_and_maximises_the_rate():
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        B, N = 1 + trial % 5, 1 + trial % 7
        S = torch.rand(B, N, generator=g).cumprod(-1)  # survival: non-increasing along a row
        lengths = torch.randint(0, N + 1, (B,), generator=g)
        valid = torch.arange(N)[None] < lengths[:, None]
        slope = float(torch.rand(1, generator=g)) * 0.3
        verify = lambda w, s=slope, rows=B: 1.0 + s * rows * (w - 1)  # noqa: E731
        keep, k = select_top_k(S, valid, 0.2, verify)
        assert k == _brute(S, valid, 0.2, verify)
        assert int(keep.sum()) == k and not bool((keep & ~valid).any())
        for b in range(B):  # a prefix of every row
            n = int(keep[b].sum())
            assert keep[b, :n].all() and not keep[b, n:].any()


def test_selection_depends_on_the_costs():
    S = torch.tensor([[0.9, 0.8, 0.5, 0.2], [0.6, 0.3, 0.1, 0.05]])
    valid = torch.ones_like(S, dtype=torch.bool)
    free, k_free = select_top_k(S, valid, 0.0, lambda w: 1.0)  # verifying is free: keep everything
    assert k_free == 8 and free.all()
    _, k_dear = select_top_k(S, valid, 0.0, lambda w: 1.0 + 2.0 * (w - 1))  # each slot costs 2 steps
    assert k_dear == 0
    keep, k = select_top_k(S, valid, 0.1, lambda w: 1.0 + 0.2 * (w - 1))
    assert 0 < k < 8 and keep[0, 0] and keep[0].sum() >= keep[1].sum()


def test_training_free_survival_uses_probability_entropy_and_depth():
    p = DraftProposal(tokens=torch.zeros(1, 3, dtype=torch.long), lengths=torch.tensor([3]),
                      confidence=torch.tensor([[0.9, 0.5, 0.8]]), entropy=torch.tensor([[0.0, 0.0, 1.25]]))
    s = node_survival(p, False, [0.6] * 4)
    assert torch.allclose(s, torch.tensor([[0.9, 0.45, 0.45 * 0.5]]))  # 1 - sqrt(0.2 * 1.25) = 0.5 < 0.8
    assert torch.equal(node_survival(p, True, [0.6] * 4), p.confidence)  # the drafter's own survival
    tree = DraftProposal(tokens=torch.zeros(1, 3, dtype=torch.long), lengths=torch.tensor([3]),
                         parents=torch.tensor([[-1, -1, 1]]))
    assert torch.allclose(node_survival(tree, False, [0.5, 0.4]), torch.tensor([[0.5, 0.5, 0.2]]))


def test_trim_a_tree_keeps_an_ancestor_closed_renumbered_tree():
    tree = DraftProposal(tokens=torch.tensor([[5, 6, 7, 8]]), lengths=torch.tensor([4]),
                         parents=torch.tensor([[-1, -1, 0, 2]]), probs=torch.eye(10)[[5, 6, 7, 8]][None])
    out = trim(tree, torch.tensor([[True, False, True, True]]))
    assert out.node_rows() == [[5, 7, 8]] and out.parent_rows() == [[-1, 0, 1]]
    assert torch.equal(out.probs[0].argmax(-1), torch.tensor([5, 7, 8]))
    chain = DraftProposal(tokens=torch.tensor([[1, 2, 3], [4, 5, 6]]), lengths=torch.tensor([3, 2]))
    assert trim(chain, torch.tensor([[True, True, False], [True, False, False]])).node_rows() == [[1, 2], [4]]




@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.mark.parametrize("drafter", ["dspark", "ngram"])
def test_adaptive_is_lossless_at_batch_1_and_8(tmp_path, target, drafter):
    opts = {"checkpoint": str(write_checkpoint(tmp_path, target))} if drafter == "dspark" else {}
    strat = AdaptiveStrategy(drafter=drafter, options=opts)
    pipe = MTPPipeline(target, ToyTok(), strategy=strat, budget={"type": "static", "k": 4})
    ps = prompts(8, seed=11)
    refs = [hf_greedy(target, p, 12) for p in ps]
    assert pipe.generate([ps[1]], max_new_tokens=12, ignore_eos=True)[0].token_ids == refs[1]
    out = pipe.generate(ps, max_new_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert not any(o.stats.failures for o in out)
    assert {1, 8} <= set(strat.costs.table) <= {1, 2, 4, 8} and all(len(t) == 17 for t in strat.costs.table.values())
    assert strat.last_k is not None


def test_adaptive_refuses_a_bad_drafter():
    from lightspec_core import LightSpecError

    with pytest.raises(LightSpecError, match="adaptive"):
        AdaptiveStrategy(drafter="adaptive")
    with pytest.raises(LightSpecError, match="no_such"):
        AdaptiveStrategy(drafter="no_such")
