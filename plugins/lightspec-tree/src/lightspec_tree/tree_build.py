"""Token-tree bookkeeping shared by the tree strategies and the ``tree_union`` fusion:
Medusa-style choice lists, best-node selection (EAGLE-2's final rerank), packing rows
into a ``DraftProposal`` and finding which path of an earlier tree a sequence took.

A tree row is two Python lists: ``tokens[j]`` and ``parents[j]`` (``-1``: the row's last
committed token; always an earlier node).
"""

from __future__ import annotations

import torch

from lightspec_core import DraftProposal


def parse_choices(choices) -> list[tuple[int, ...]]:
    """A Medusa choice list (``[[0], [1], [0, 0], ...]``: path ``p`` is the node reached by
    taking the ``p[0]``-th best child of the root, then the ``p[1]``-th best child of that,
    ...) checked and sorted by depth, then lexicographically.  Every prefix of a path must
    be in the list (a node needs its parent)."""
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(f"choices={choices!r} is invalid: use a non-empty list of paths, e.g. [[0], [1], [0, 0]]")
    paths = set()
    for c in choices:
        if (not isinstance(c, (list, tuple)) or not c
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in c)):
            raise ValueError(f"choices: path {c!r} is invalid: use a non-empty list of integers >= 0 "
                             f"(the rank of the child taken at each depth)")
        paths.add(tuple(c))
    for p in paths:
        if len(p) > 1 and p[:-1] not in paths:
            raise ValueError(f"choices: path {list(p)!r} needs its parent path {list(p[:-1])!r} in the list too")
    return sorted(paths, key=lambda p: (len(p), p))


def select_best(scores: list[float], parents: list[int], n: int) -> list[int]:
    """Indices of at most ``n`` nodes with the highest scores, closed under parents (a node
    is kept only with its parent), in index order.  ``-inf`` scores are never kept.  Scores
    are cumulative log-probabilities, so a child never scores above its parent; ties go to
    the earlier node, which keeps parents ahead of their children."""
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
    kept: set[int] = set()
    for j in order:
        if len(kept) >= n or scores[j] == float("-inf"):
            break
        if parents[j] == -1 or parents[j] in kept:
            kept.add(j)
    return sorted(kept)


def renumber(keep: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
    """The sub-tree of nodes ``keep`` (closed under parents, increasing) with parents renumbered."""
    index = {j: i for i, j in enumerate(keep)}
    return [tokens[j] for j in keep], [index[parents[j]] if parents[j] >= 0 else -1 for j in keep]


def pack(tokens: list[list[int]], parents: list[list[int]], device, source, confidence: list[list[float]] | None = None
         ) -> DraftProposal | None:
    """Rows of trees as a ``DraftProposal`` (``None`` when every row is empty).  When every row
    is a chain (node j's parent is j - 1) the proposal is a plain chain (``parents=None``):
    the target then verifies it without a tree mask, which is cheaper."""
    n = max((len(t) for t in tokens), default=0)
    if n == 0:
        return None
    if all(p == list(range(-1, len(p) - 1)) for p in parents):
        parents = None
    pad_t = [t + [0] * (n - len(t)) for t in tokens]
    conf = None
    if confidence is not None:
        conf = torch.tensor([c + [0.0] * (n - len(c)) for c in confidence], dtype=torch.float32, device=device)
    return DraftProposal(tokens=torch.tensor(pad_t, dtype=torch.long, device=device),
                         lengths=torch.tensor([len(t) for t in tokens], dtype=torch.long, device=device),
                         parents=None if parents is None else torch.tensor(
                             [p + [-1] * (n - len(p)) for p in parents], dtype=torch.long, device=device),
                         confidence=conf, source=source)


def walk(tokens: list[int], parents: list[int], sequence, start: int) -> list[int]:
    """The nodes of a tree whose tokens ``sequence[start:]`` follows from the root, root first
    (the path the target accepted, plus any later tokens that happen to continue it)."""
    children: dict[tuple[int, int], int] = {}
    for j, (t, p) in enumerate(zip(tokens, parents)):
        children.setdefault((p, t), j)
    path, node = [], -1
    for t in sequence[start:]:
        node = children.get((node, t), -2)
        if node == -2:
            break
        path.append(node)
    return path


def depths(parents: list[int]) -> list[int]:
    """Depth of each node (1 = a child of the root)."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out
