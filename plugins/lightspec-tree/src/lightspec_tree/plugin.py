"""The ``tree`` entry point of the ``lightspec.plugins`` namespace: token-tree strategies
(``static_tree``, ``dynamic_tree``, ``eagle3_tree``) and the ``tree_union`` fusion that the
composer's ``union`` combination uses.  Factories import torch only when called, so
``lightspec --help`` stays light."""

from __future__ import annotations

from lightspec_core import hookimpl

_DRAFTER = ("the tree drafter: draft_model, layerskip, ngram, or a registered strategy implementing "
            "tree_start/tree_step (default: draft_model)")
_DRAFTER_OPTIONS = ("options for the drafter (a mapping): draft_model {lean, max_context}; layerskip {layers, lean, "
                    "max_context}; ngram {min_ngram, max_ngram, max_matches, max_depth}")
_ADAPTIVE = "choose the tree's shape per step from measured acceptance and cost, a chain included (true)"
_DYNAMIC = {
    "depth": "levels of the tree (5)",
    "top_k": "children expanded per frontier node, and frontier width per level (4)",
    "total_tokens": "most nodes per tree; the budget's max_draft caps it per row (16)",
    "adaptive": _ADAPTIVE,
}


def _static_tree(**options):
    from .strategies import StaticTree

    return StaticTree(**options)


def _dynamic_tree(**options):
    from .strategies import DynamicTree

    return DynamicTree(**options)


def _eagle3_tree(**options):
    from .strategies import eagle3_tree

    return eagle3_tree(**options)


def _tree_budget(**options):
    from .budget import TreeBudget

    return TreeBudget(**options)


def _tree_union(**options):
    from .fusion import TreeUnion

    return TreeUnion(**options)


@hookimpl
def lightspec_register_strategies(register):
    register("static_tree", _static_tree,
             description="a fixed token tree from a Medusa-style choice list over a drafter's top-k children",
             params={"choices": "list of paths, e.g. [[0], [1], [0, 0]]: the i-th best child at each depth "
                                "(default: 12 nodes, 5 levels)",
                     "drafter": _DRAFTER, "drafter_options": _DRAFTER_OPTIONS, "adaptive": _ADAPTIVE})
    register("dynamic_tree", _dynamic_tree,
             description="EAGLE-2 dynamic token tree: expand the best frontier by cumulative log-probability",
             params={"drafter": _DRAFTER, "drafter_options": _DRAFTER_OPTIONS, **_DYNAMIC})
    register("eagle3_tree", _eagle3_tree,
             description="dynamic_tree over the eagle3 drafter (needs the lightspec-eagle3 plugin)",
             params={"drafter_options": "options for the eagle3 drafter (a mapping)", **_DYNAMIC})
    register("tree", _tree_budget, kind="budget",
             description="node budget for token trees (the shape is the strategy's); plain decoding while "
                         "speculation measures slower than plain",
             params={"max_nodes": "draft nodes per row (16), within 2 * max_nodes for the whole batch",
                     "probe_every": "speculative steps between two plain steps that measure plain decoding (32)",
                     "patience": "speculative steps slower than plain before a hold (4)",
                     "hold": "plain steps of the first hold, doubled after each hold that speculation lost again (32)",
                     "decay": "EWMA weight of the past (0.8)"})
    register("tree_union", _tree_union, kind="fusion",
             description="unite several drafts (chains or trees) into one token tree, shared prefixes merged",
             params={})
