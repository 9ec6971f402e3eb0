"""``KVCache.forward(..., tree=, tree_base=)``: a token tree appended one level per forward.

The logits of each level's nodes equal those of the whole tree run in one forward, which
equal a plain forward of each root-to-node path; after ``commit`` of an accepted path (not
the first branch) the cache continues exactly like one fed that path as a chain.  On both
layouts: per row (the lean chained forward, as a zoo-like draft runs) and with holes (HF's
forward with a 4D mask, and the lean forward kept on holes), batch 1 and a ragged batch 3.
"""

from __future__ import annotations

import pytest
import torch
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import LeanDecoder, lean_forward
from lightspec_core.loading import install_cpu_kernels
from lightspec_kernels import cpu_decoder
from models import build_model

CPU = torch.device("cpu")
LEN = (7, 4, 9)  # ragged prompt lengths of rows 0..2
# per row, the tree's levels as (parents since the base; -1 = the root), 9 nodes in 4 levels
LEVELS = (
    ([-1, -1, -1], [0, 0, 2], [3, 5], [6]),
    ([-1, -1, -1], [1, 2, 2], [5, 4], [7]),
    ([-1, -1, -1], [0, 1, 0], [5, 3], [6]),
)
PATHS = ([2, 5, 7], [2, 4, 7, 8], [0, 5, 6, 8])  # an accepted path per row (root first), never the first branch
NEXT = 3  # tokens fed after the commit


def _prompts(B: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 500, (LEN[b],), generator=g).tolist() for b in range(B)]


def _tokens(B: int) -> torch.Tensor:
    return torch.randint(3, 500, (B, 9), generator=torch.Generator().manual_seed(4))


def _parents(B: int) -> torch.Tensor:
    return torch.tensor([sum(LEVELS[b], []) for b in range(B)])


def _path_to(parents: list[int], j: int) -> list[int]:
    path = []
    while j >= 0:
        path.append(j)
        j = parents[j]
    return path[::-1]


def _fill(runner, prompts: list[list[int]], per_row) -> KVCache:
    """A cache holding the prompts (right-padded ragged prefill); the last token is the root."""
    B, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, width, dtype=torch.long)
    valid = torch.zeros(B, width, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, : len(p)], valid[b, : len(p)] = torch.tensor(p), True
    kv = KVCache(runner, B, CPU, capacity=8, per_row=per_row)  # small: grows during the tree
    kv.forward(ids, None if bool(valid.all()) else valid)
    return kv


def _draft_like():
    """A tiny Llama with LightSpec's CPU kernels, through the drafters' lean forward (as the
    zoo draft runs): the chained forward, so ``KVCache`` takes the per-row layout."""
    model = build_model("llama")
    install_cpu_kernels(model)
    return lean_forward(model, exact=False, fuse=True)


def _runners():
    """(name, runner factory, per_row) for each layout."""
    out = [("hf-qwen3-holes", lambda: build_model("qwen3"), None),
           ("hf-mistral-sliding-holes", lambda: build_model("mistral", sliding_window=6), None)]
    if cpu_decoder.available():
        out += [("lean-llama-per-row", _draft_like, True), ("lean-llama-holes", _draft_like, False)]
    return out


RUNNERS = _runners()


@pytest.fixture(scope="module", params=RUNNERS, ids=[r[0] for r in RUNNERS])
def layout(request):
    name, make, per_row = request.param
    return make(), per_row


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """The same values up to rounding, and the same greedy choices.  Forwards of different
    widths (a level vs the whole tree, one token vs a prefill) round SDPA's and the
    matmuls' sums differently: measured up to 9e-6 on logits of magnitude <= 8; a wrong
    mask or position moves logits by O(1)."""
    torch.testing.assert_close(a, b, rtol=0, atol=2e-5, msg=what)
    assert torch.equal(a.argmax(-1), b.argmax(-1)), f"{what}: greedy choices differ"


@pytest.mark.parametrize("B", [1, 3])
@torch.inference_mode()
def test_levels_match_the_whole_tree_and_each_path(layout, B):
    runner, per_row = layout
    prompts, toks, parents = _prompts(B), _tokens(B), _parents(B)
    kv = _fill(runner, prompts, per_row)
    base = kv.lengths
    assert base == [len(p) for p in prompts]
    assert kv.per_row == bool(per_row)
    got, n = [], 0
    for q in map(len, LEVELS[0]):
        out = kv.forward(toks[:, n : n + q], tree=parents[:, : n + q], tree_base=base)
        got.append(out.logits)
        n += q
        assert kv.lengths == [b0 + n for b0 in base]
    got = torch.cat(got, 1)  # [B, 9, V]

    whole = _fill(runner, prompts, per_row).forward(toks, tree=parents).logits
    _close(got, whole, "levels vs the whole tree in one forward")
    if isinstance(runner, LeanDecoder):  # its kernels take each query alone: bit for bit
        assert torch.equal(got, whole)
    for b in range(B):
        for j in range(9):
            path = _path_to(parents[b].tolist(), j)
            chain = _fill(runner, [prompts[b] + toks[b, path[:-1]].tolist()], per_row)
            ref = chain.forward(toks[b : b + 1, j : j + 1]).logits[0, -1]
            _close(got[b, j], ref, f"row {b} node {j} vs its path {path} as a chain")


@pytest.mark.parametrize("B", [1, 3])
@torch.inference_mode()
def test_commit_after_levels_continues_like_the_path_as_a_chain(layout, B):
    runner, per_row = layout
    prompts, toks, parents = _prompts(B), _tokens(B), _parents(B)
    kv = _fill(runner, prompts, per_row)
    base, n = kv.lengths, 0
    for q in map(len, LEVELS[0]):
        kv.forward(toks[:, n : n + q], tree=parents[:, : n + q], tree_base=base)
        n += q
    paths = [PATHS[b] for b in range(B)]
    for b, p in enumerate(paths):  # each path is a root-to-node chain of this row's tree
        assert p == _path_to(parents[b].tolist(), p[-1])
    kv.commit(base, paths)
    assert kv.lengths == [b0 + len(p) for b0, p in zip(base, paths)]
    nxt = torch.randint(3, 500, (B, NEXT), generator=torch.Generator().manual_seed(5))
    got = [kv.forward(nxt[:, i : i + 1]).logits[:, -1] for i in range(NEXT)]
    got.append(kv.forward(nxt).logits[:, -1])  # and a wider forward on top
    ref_kv = _fill(runner, [prompts[b] + toks[b, paths[b]].tolist() for b in range(B)], per_row)
    ref = [ref_kv.forward(nxt[:, i : i + 1]).logits[:, -1] for i in range(NEXT)]
    ref.append(ref_kv.forward(nxt).logits[:, -1])
    for i, (a, r) in enumerate(zip(got, ref)):
        _close(a, r, f"forward {i} after the commit")


@torch.inference_mode()
def test_a_chain_appended_plainly_then_branching_levels(layout):
    """The tree's first slots appended as a plain chain (a drafter's fast path), then a
    branching level with ``tree_base``: the chain's slots count as the tree's."""
    runner, per_row = layout
    prompts, toks = _prompts(3), _tokens(3)
    parents = torch.tensor([[-1, 0, 1, 1, 0]] * 3)
    kv = _fill(runner, prompts, per_row)
    base = kv.lengths
    first = kv.forward(toks[:, :2]).logits  # nodes 0 and 1: a chain
    last = kv.forward(toks[:, 2:5], tree=parents, tree_base=base).logits
    whole = _fill(runner, prompts, per_row).forward(toks[:, :5], tree=parents).logits
    _close(torch.cat([first, last], 1), whole, "chain then a level vs the whole tree")
    kv.commit(base, [[0, 4]] * 3)
    nxt = torch.tensor([[7], [8], [9]])
    ref_kv = _fill(runner, [prompts[b] + toks[b, [0, 4]].tolist() for b in range(3)], per_row)
    _close(kv.forward(nxt).logits, ref_kv.forward(nxt).logits, "after the commit")


@torch.inference_mode()
def test_tree_base_errors_name_the_bad_value():
    model = build_model("qwen3")
    kv = _fill(model, _prompts(2), None)
    base = kv.lengths
    ids = torch.tensor([[5, 6], [7, 8]])
    with pytest.raises(ValueError, match="tree_base needs tree="):
        kv.forward(ids, tree_base=base)
    with pytest.raises(ValueError, match="does not fit"):  # says 1 slot cached since the base, there are none
        kv.forward(ids, tree=torch.tensor([[-1, -1, 0]] * 2), tree_base=base)
    with pytest.raises(ValueError, match="one per row"):
        kv.forward(ids, tree=torch.tensor([[-1, -1]] * 2), tree_base=base[:1])
    with pytest.raises(ValueError, match="parent must be -1"):
        kv.forward(ids, tree=torch.tensor([[-1, 1]] * 2), tree_base=base)
    with pytest.raises(ValueError, match="no padding"):
        kv.forward(ids, torch.tensor([[True, False], [True, True]]), tree=torch.tensor([[-1, 0]] * 2), tree_base=base)
    assert kv.lengths == base  # nothing appended by a refused call
