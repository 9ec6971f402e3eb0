"""Tree bookkeeping, the tree_union fusion and the shaper, without models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightspec_tree.fusion import TreeUnion
from lightspec_tree.shaper import Shaper
from lightspec_tree.strategies import DynamicTree
from lightspec_tree.tree_build import parse_choices, select_best, walk

from lightspec_core import DraftProposal, StepContext


def test_choices_are_sorted_and_checked():
    assert parse_choices([[0, 0], [1], [0]]) == [(0,), (1,), (0, 0)]
    with pytest.raises(ValueError, match=r"\[0, 1\].*needs its parent path \[0\]"):
        parse_choices([[1], [0, 1]])
    with pytest.raises(ValueError, match="path -1 is invalid"):
        parse_choices([[0], -1])
    with pytest.raises(ValueError, match=r"path \[0, -2\] is invalid"):
        parse_choices([[0], [0, -2]])
    with pytest.raises(ValueError, match="non-empty list of paths"):
        parse_choices([])


def test_select_best_keeps_parents_and_drops_minus_inf():
    inf = float("-inf")
    #        0     1     2     3     4     5
    scores = [-0.1, -0.5, -0.3, -0.2, inf, -2.0]
    parents = [-1, -1, 0, 0, 1, 4]
    assert select_best(scores, parents, 3) == [0, 2, 3]
    assert select_best(scores, parents, 10) == [0, 1, 2, 3]  # 4 is -inf, so 5 has no parent
    assert select_best(scores, parents, 0) == []


def test_walk_follows_the_sequence_down_the_tree():
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, 0, 0, 3]
    assert walk(tokens, parents, (1, 2, 5, 8, 9, 4), 2) == [0, 3, 4]
    assert walk(tokens, parents, (1, 2, 6, 7), 2) == [1]
    assert walk(tokens, parents, (1, 2, 3), 2) == []


def _ctx(batch, limits):
    return StepContext(step=1, sequences=[(1, 2)] * batch, row_ids=list(range(batch)), max_draft_list=limits,
                       max_draft=torch.tensor(limits), vocab_size=32)


def test_tree_union_merges_shared_prefixes_of_chains_and_trees():
    chain = DraftProposal(tokens=torch.tensor([[5, 6, 7], [9, 9, 9]]), lengths=torch.tensor([3, 1]), source="a",
                          confidence=torch.tensor([[0.9, 0.8, 0.7], [0.5, 0.0, 0.0]]))
    # row 0: a tree that shares [5, 6] with the chain and branches (5 -> 8), plus another root child 4
    tree = DraftProposal(tokens=torch.tensor([[5, 4, 6, 8], [9, 3, 0, 0]]), lengths=torch.tensor([4, 2]),
                         parents=torch.tensor([[-1, -1, 0, 0], [-1, 0, -1, -1]]), source="b")
    fused = TreeUnion().lightspec_fuse(ctx=_ctx(2, [10, 10]), proposals=[chain, None, tree])
    nodes, parents = fused.node_rows(), fused.parent_rows()
    # level by level: depth 1 (5, then 4), depth 2 (6 under 5, then 8 under 5), depth 3 (7 under 6)
    assert nodes[0] == [5, 4, 6, 8, 7] and parents[0] == [-1, -1, 0, 0, 2]
    assert nodes[1] == [9, 3] and parents[1] == [-1, 0]
    assert fused.probs is None
    assert fused.source_of(0) == "a+b" and fused.source_of(1) == "a+b"
    assert fused.confidence[0, 0].item() == pytest.approx(0.9)  # the highest any drafter gave


def test_tree_union_respects_the_budget_keeping_shallow_nodes_of_every_drafter():
    a = DraftProposal(tokens=torch.tensor([[5, 6, 7, 8]]), lengths=torch.tensor([4]), source="a")
    b = DraftProposal(tokens=torch.tensor([[9, 10, 11]]), lengths=torch.tensor([3]), source="b")
    fused = TreeUnion().lightspec_fuse(ctx=_ctx(1, [3]), proposals=[a, b])
    assert fused.node_rows() == [[5, 9, 6]] and fused.parent_rows() == [[-1, -1, 0]]
    assert TreeUnion().lightspec_fuse(ctx=_ctx(1, [3]), proposals=[None, None]) is None


def _event(accepted, drafted, seconds):
    return SimpleNamespace(kind="step", accepted=accepted, drafted=drafted, step_time_s=seconds, failure=None)


def test_shaper_probes_every_shape_then_takes_the_best_per_cost():
    shaper = Shaper(["chain", "tree"], probe=2, every=100)
    measured = {"chain": (3.0, 1.0), "tree": (3.2, 1.5)}  # the tree accepts a bit more but costs much more
    picks = []
    for _ in range(8):
        s = shaper.choose()
        picks.append(s)
        acc, t = measured[s]
        shaper.observe(_event([acc], [5], t))
    assert picks[:4] == ["chain", "chain", "tree", "tree"]
    assert picks[4:] == ["chain"] * 4  # the tree does not pay: a chain
    # where the tree's acceptance pays for its cost, it wins
    shaper.reset()  # a new generate() keeps the measurements
    assert shaper.tries == {"chain": 6, "tree": 2} and shaper.choose() == "chain"
    shaper.forget()
    measured["tree"] = (5.0, 1.1)
    for _ in range(6):
        s = shaper.choose()
        shaper.observe(_event([measured[s][0]], [8], measured[s][1]))
    assert shaper.choose() == "tree"


def test_shaper_on_seeded_runs_uses_the_timing_free_cost():
    shaper = Shaper([(1, 5, 5), (4, 5, 16)], probe=1, every=100)
    cost = lambda s: 1.0 + 0.03 * s[2]  # noqa: E731
    for s, acc in (((1, 5, 5), 2.0), ((4, 5, 16), 2.2)):
        assert shaper.choose(cost) == s
        shaper.observe(_event([acc], [5], 99.0))  # timings are ignored
    assert shaper.choose(cost) == (1, 5, 5)  # 3.0/1.15 > 3.2/1.48
    # steps without a draft, or that failed, are not credited
    shaper.observe(_event([0], [0], 1.0))
    assert shaper.tries[(1, 5, 5)] == 1



def test_shaper_keeps_records_per_candidate_as_the_step_runs_it():
    """Candidates are the shapes as they run this step: two shapes that are the same draft
    share one record, and a shape's record at one node budget does not judge it at another."""
    shaper = Shaper([(1, 5, 5), (2, 5, 10), (4, 5, 16)], probe=1, every=100)
    tree = DynamicTree(drafter="ngram")
    at = lambda k: [tree._effective(s, k) for s in shaper.shapes]  # noqa: E731
    assert at(1) == [(1, 1, 1)] * 3  # one node: every shape is the same draft
    assert at(2) == [(1, 2, 2), (2, 2, 2), (2, 2, 2)]
    assert at(8) == [(1, 5, 5), (2, 5, 8), (4, 5, 8)]
    assert shaper.choose(candidates=at(1)) == (1, 1, 1)  # nothing to choose
    shaper.observe(_event([1], [1], 1.0))
    picks = []
    for acc, t in ((1.0, 1.0), (1.5, 1.0)):  # at k = 2: the chain, then the two-wide tree, once each
        picks.append(shaper.choose(candidates=at(2)))
        shaper.observe(_event([acc], [2], t))
    assert picks == [(1, 2, 2), (2, 2, 2)]
    assert shaper.choose(candidates=at(2)) == (2, 2, 2)  # it measured better at k = 2
    shaper.pending = None
    # at k = 8 the shapes are new candidates: probed, not judged by their k = 2 records
    assert shaper.choose(candidates=at(8)) == (1, 5, 5)
    assert shaper.tries[(1, 2, 2)] == 1 and shaper.tries[(2, 2, 2)] == 1 and shaper.tries[(1, 1, 1)] == 1

class _CountingDrafter:
    """A tree drafter whose root is sure (p = 0.9) and whose later nodes are not (uniform)."""

    def __init__(self, vocab: int = 10):
        self.vocab, self.steps = vocab, 0

    def tree_start(self, ctx):
        p = torch.full((1, self.vocab), 0.1 / (self.vocab - 1))
        p[0, 3] = 0.9
        return p.log()

    def tree_step(self, tokens, parents):
        self.steps += 1
        return torch.full((*tokens.shape, self.vocab), 1.0 / self.vocab).log()


@pytest.mark.parametrize("limit, min_conf, steps", [(16, 0.0, 4), (3, 0.0, 2), (1, 0.0, 0), (16, 0.5, 1)])
def test_dynamic_tree_grows_no_deeper_than_the_budget_and_its_confidence_rule(limit, min_conf, steps):
    from lightspec_tree.strategies import DynamicTree

    drafter = _CountingDrafter()
    tree = DynamicTree(drafter=drafter, depth=5, top_k=2, total_tokens=16, adaptive=False)
    ctx = SimpleNamespace(min_confidence=torch.tensor([min_conf]))
    tokens, parents, _, _ = tree._expand(ctx, [limit], (2, 5, 16))
    # depth d needs d - 1 tree_steps; below min_confidence a chain drafter stops, so a tree does too
    assert drafter.steps == steps
    assert len(tokens[0]) <= limit and tokens[0][0] == 3


def test_a_zero_budget_still_hands_a_hidden_state_drafter_its_states():
    """Inside a composition a skipped tree strategy is called with a zero budget so that a
    drafter reading the target's hidden states gets them (they are handed over once); a
    drafter without hidden states is not called."""
    from lightspec_tree.strategies import DynamicTree

    class Reader(_CountingDrafter):
        hidden_layers = [1]

        def __init__(self):
            super().__init__()
            self.handed = []

        def lightspec_propose(self, ctx):
            self.handed.append(list(ctx.max_draft_list))
            return None

    reader = Reader()
    tree = DynamicTree(drafter=reader, adaptive=False)
    ctx = SimpleNamespace(max_draft_list=[0, 0])
    assert tree.lightspec_propose(ctx=ctx) is None and reader.handed == [[0, 0]]
    plain = _CountingDrafter()
    plain.lightspec_propose = lambda ctx: pytest.fail("called without hidden states")
    assert DynamicTree(drafter=plain, adaptive=False).lightspec_propose(ctx=ctx) is None


def test_pack_sends_chains_as_chains_and_trees_with_parents():
    from lightspec_tree.tree_build import pack

    chain = pack([[4, 5, 6], [7]], [[-1, 0, 1], [-1]], "cpu", "t")
    assert chain.parents is None and chain.lengths.tolist() == [3, 1] and chain.tokens[0].tolist() == [4, 5, 6]
    tree = pack([[4, 5, 6], [7]], [[-1, -1, 0], [-1]], "cpu", "t")
    assert tree.parents.tolist() == [[-1, -1, 0], [-1, -1, -1]]
    assert pack([[], []], [[], []], "cpu", "t") is None


class _TableDrafter:
    """A tree drafter over a fixed transition table: the children of a node with token t are
    ``logp[t]`` (V = 6), the root's are ``logp[0]``.  Records what it was given."""

    def __init__(self):
        inf = float("-inf")
        p = torch.full((6, 6), 0.02)
        p[0, 2], p[2, 4], p[4, 1], p[1, 5] = 0.9, 0.8, 0.3, 0.9  # the greedy chain 2, 4, 1, 5
        self.logp = p.log()
        self.logp[5] = inf  # nothing follows token 5
        self.given = []

    def tree_start(self, ctx):
        self.given = []
        return self.logp[[0] * ctx.batch]

    def tree_step(self, tokens, parents):
        self.given.append((tokens.tolist(), parents.tolist()))
        return self.logp[tokens]


@pytest.mark.parametrize("limits, min_conf, want, runs", [
    ([8], 0.0, [[2, 4, 1, 5]], 4),       # the chain ends where the drafter has no next token
    ([2], 0.0, [[2, 4]], 1),             # the budget cuts it (and the growth)
    ([8], 0.5, [[2, 4, 1]], 2),          # 1 has p = 0.3 < 0.5: kept, then the chain stops, as a chain drafter does
    ([8, 1], 0.0, [[2, 4, 1, 5], [2]], 4),
])
def test_the_one_wide_shape_drafts_the_greedy_chain_without_tree_bookkeeping(limits, min_conf, want, runs):
    drafter = _TableDrafter()
    tree = DynamicTree(drafter=drafter, depth=6, top_k=4, total_tokens=16)
    ctx = SimpleNamespace(batch=len(limits), min_confidence=torch.tensor([min_conf] * len(limits)))
    tokens, parents, conf, drafted = tree._expand(ctx, limits, (1, 6, 6))
    assert tokens == want
    assert parents == [list(range(-1, len(t) - 1)) for t in want]
    assert conf[0] == pytest.approx([0.9, 0.8, 0.3, 0.9][: len(want[0])], rel=1e-5)
    # `runs` tree_steps, one node per row each, each the child of the one before
    assert [g[1] for g in drafter.given] == [[[j - 1]] * len(limits) for j in range(runs)]
    assert drafted[0] == ([2, 4, 1, 5][:runs], list(range(-1, runs - 1)))
