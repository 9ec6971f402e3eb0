"""The ``tree_union`` fusion: the composer's ``union`` combination unites its components'
drafts (chains or trees) into one token tree per row, shared prefixes merged."""

from __future__ import annotations

from lightspec_core import LightSpecError, TargetRunner, hookimpl

from .tree_build import depths, pack


class TreeUnion:
    """Per row, every proposal's nodes in one trie: a node is the same node when its parent
    and token are.  Nodes join level by level (all depth-1 nodes of every proposal, in
    component order, then depth 2, ...), so when the row's budget ``ctx.max_draft_list[b]``
    runs out the shallow nodes of every drafter are in and the deep ones are cut.

    The result carries no ``probs``: a node drafted by two drafters (or sampled by one and
    picked deterministically by another) has no single draft distribution, and the
    verifier's one-hot treatment is lossless whatever chose the tokens.  ``confidence`` is
    the highest any contributing drafter gave the node (0 where none gave one)."""

    name = "tree_union"

    def setup(self, env) -> None:
        """Refuse, at start-up, a target that does not take the custom attention masks trees need
        (the composer calls a fusion's ``setup`` before its components')."""
        if not TargetRunner(env.target).supports_trees():
            kind = getattr(getattr(env.target, "config", None), "model_type", type(env.target).__name__)
            raise LightSpecError(f"the 'union' combination merges drafts into a token tree, but this target ({kind}) "
                                 "does not take the custom attention masks trees need; use kind 'cascade' or 'switch'")

    @hookimpl
    def lightspec_fuse(self, ctx, proposals):
        props = [p for p in proposals if p is not None and p.max_len > 0]
        if not props:
            return None
        rows = [(p.node_rows(), p.parent_rows(), p.confidence.tolist() if p.confidence is not None else None)
                for p in props]
        out_t, out_p, out_c, sources = [], [], [], []
        for b in range(ctx.batch):
            limit = ctx.max_draft_list[b]
            entries = []
            for i, (nodes, parents, _) in enumerate(rows):
                par = parents[b] if parents is not None else list(range(-1, len(nodes[b]) - 1))
                entries += [(d, i, j) for j, d in enumerate(depths(par))]
            entries.sort()
            tokens: list[int] = []
            links: list[int] = []
            conf: list[float] = []
            trie: dict[tuple[int, int], int] = {}
            where: dict[tuple[int, int], int] = {}  # (proposal, node) -> merged node
            used: list[int] = []
            for _, i, j in entries:
                nodes, parents, confs = rows[i]
                p = parents[b][j] if parents is not None else j - 1
                up = where.get((i, p), -2) if p >= 0 else -1
                if up == -2:  # its parent was cut
                    continue
                key = (up, nodes[b][j])
                c = confs[b][j] if confs is not None else 0.0
                if key in trie:
                    n = trie[key]
                    conf[n] = max(conf[n], c)
                elif len(tokens) < limit:
                    n = trie[key] = len(tokens)
                    tokens.append(nodes[b][j])
                    links.append(up)
                    conf.append(c)
                else:
                    continue
                where[(i, j)] = n
                if i not in used:
                    used.append(i)
            out_t.append(tokens)
            out_p.append(links)
            out_c.append(conf)
            sources.append("+".join(props[i].source_of(b) for i in sorted(used)))
        return pack(out_t, out_p, ctx.device, sources, out_c)
