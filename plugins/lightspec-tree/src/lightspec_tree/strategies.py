"""The tree strategies: ``static_tree`` (Medusa-style choice lists), ``dynamic_tree``
(EAGLE-2: expand the best frontier by cumulative log-probability, keep the best nodes) and
``eagle3_tree`` (``dynamic_tree`` over the ``eagle3`` drafter of lightspec-eagle3).

Both draw their tree through a drafter's tree expansion protocol (``expanders.py``), return
it as a ``DraftProposal`` with ``parents`` and no ``probs`` (deterministic top-k children
are verified as one-hot, which keeps sampling lossless), and at the next step tell the
drafter which of its nodes the target accepted (``tree_commit``), found by walking the
new tokens of ``ctx.sequences`` down the previous tree.
"""

from __future__ import annotations

import math
import time

import torch

from lightspec_core import LightSpecError, TargetRunner, get_registry, hookimpl

from .expanders import make_drafter
from .shaper import Shaper
from .tree_build import pack, parse_choices, renumber, select_best, walk

# timing-free cost model of a seeded run (docs/design/tree.md): one verified node costs this
# share of a target step
VERIFY_SLOPE = 0.03


class TreeStrategy:
    """What both tree strategies share: the drafter's lifecycle, the start-up check that the
    target takes tree masks, the commit of the previous tree's accepted path and the shaper."""

    name = "tree"

    def __init__(self, drafter, drafter_options, adaptive: bool, shapes: list, name: str | None = None):
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive={adaptive!r} is invalid: use true or false")
        if name is not None:
            self.name = name
        self.drafter = make_drafter(drafter, drafter_options)
        self.hidden_layers = list(getattr(self.drafter, "hidden_layers", []))
        self.adaptive = adaptive
        self._set_shapes(shapes)

    def _set_shapes(self, shapes: list) -> None:
        self.shaper = Shaper(shapes if self.adaptive else shapes[-1:])
        self.prev: tuple[list[int], list] | None = None  # (rows, per row (tokens, parents, root position))

    def setup(self, env) -> None:
        if not TargetRunner(env.target).supports_trees():
            kind = getattr(getattr(env.target, "config", None), "model_type", type(env.target).__name__)
            raise LightSpecError(f"strategy {self.name!r} drafts token trees, but this target ({kind}) does not take the "
                                 "custom attention masks trees need; use a chain strategy (e.g. draft_model, ngram)")
        if hasattr(self.drafter, "setup"):
            self.drafter.setup(env)
        self.hidden_layers = list(getattr(self.drafter, "hidden_layers", []))
        drafter = getattr(self.drafter, "name", type(self.drafter).__name__)
        # what the drafter can grow is known once it has loaded its head: refuse or fit now,
        # not at every step
        if getattr(self.drafter, "supports_tree_expansion", True) is False:
            raise LightSpecError(f"strategy {self.name!r}: drafter {drafter!r} cannot grow token trees with the head it "
                                 f"loaded; use {drafter!r} as a chain strategy")
        limit = getattr(self.drafter, "max_tree_depth", None)
        if limit is not None:
            self._fit_depth(int(limit), drafter)

    def _fit_depth(self, limit: int, drafter: str) -> None:
        """Keep the tree within the ``limit`` levels the drafter can grow: a default shape is
        cut to it, one the user gave deeper is refused."""
        raise NotImplementedError

    def reset(self) -> None:
        self.prev = None
        self.shaper.reset()
        if hasattr(self.drafter, "reset"):
            self.drafter.reset()

    def draft_cost_hints(self) -> dict[str, float]:
        hints = self.drafter.draft_cost_hints() if hasattr(self.drafter, "draft_cost_hints") else {}
        return {self.name: max(hints.values(), default=0.1)}

    def _commit_previous(self, ctx) -> None:
        """Tell the drafter which of its last tree's nodes the sequences now continue with."""
        if self.prev is None or not hasattr(self.drafter, "tree_commit"):
            return
        rows, trees = self.prev
        now = {r: seq for r, seq in zip(ctx.row_ids, ctx.sequences)}
        paths = [walk(t, p, now[r], root + 1) if r in now else [] for r, (t, p, root) in zip(rows, trees)]
        self.drafter.tree_commit(paths)

    def _remember(self, ctx, drafted: list[tuple[list[int], list[int]]]) -> None:
        self.prev = (list(ctx.row_ids), [(t, p, len(seq) - 1) for (t, p), seq in zip(drafted, ctx.sequences)])

    @hookimpl
    def lightspec_propose(self, ctx):
        limits = list(ctx.max_draft_list)
        if max(limits) <= 0:
            # a composition's zero budget hands over hidden states once: a drafter that reads
            # them (e.g. eagle3) must still get them, through its own zero-budget propose
            if self.hidden_layers and hasattr(self.drafter, "lightspec_propose"):
                self.drafter.lightspec_propose(ctx=ctx)
            return None
        t0 = time.perf_counter()
        self._commit_previous(ctx)
        k = max(limits)
        candidates = [self._effective(s, k) for s in self.shaper.shapes]
        shape = self.shaper.choose(None if not ctx.deterministic else self._cost, candidates)
        with torch.inference_mode():
            tokens, parents, conf, drafted = self._expand(ctx, limits, shape)
        self._remember(ctx, drafted)
        ctx.timer.record(self.name, time.perf_counter() - t0, max(len(t) for t in tokens))
        return pack(tokens, parents, ctx.device, self.name, conf)

    def _effective(self, shape, k: int):
        """``shape`` as it runs under a node budget of ``k`` (the shaper keeps records per
        effective shape); the shape itself unless a strategy knows better."""
        return shape

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) == "step":
            self.shaper.observe(event)
        if hasattr(self.drafter, "lightspec_on_stats"):  # a registered drafter may learn from them too
            self.drafter.lightspec_on_stats(event=event)


class DynamicTree(TreeStrategy):
    """EAGLE-2's dynamic tree: the root's ``top_k`` best children are the first frontier;
    each level, every frontier node's ``top_k`` children join the candidates (score = the
    cumulative log-probability of the path) and the level's best ``top_k`` become the next
    frontier, for ``depth`` levels; the proposal is the best ``total_tokens`` candidates
    (never more than the row's budget), closed under parents.  ``adaptive``: the shaper
    picks per step among a chain, a two-wide tree and the full shape."""

    name = "dynamic_tree"

    DEPTH = 5  # levels when ``depth`` is not given

    def __init__(self, drafter="draft_model", drafter_options=None, depth: int | None = None, top_k: int = 4,
                 total_tokens: int = 16, adaptive: bool = True, name: str | None = None):
        self.depth_given = depth is not None
        depth = self.DEPTH if depth is None else depth
        for key, v in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{key}={v!r} is invalid: use an integer >= 1")
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        super().__init__(drafter, drafter_options, adaptive, self._shapes(), name)

    def _shapes(self) -> list[tuple[int, int, int]]:
        """(width, depth, nodes): a chain, a two-wide tree and the full shape."""
        depth, top_k, total_tokens = self.depth, self.top_k, self.total_tokens
        shapes = [(1, depth, depth)]
        if top_k > 2:
            shapes.append((2, depth, min(total_tokens, 2 * depth)))
        if top_k > 1:
            shapes.append((top_k, depth, total_tokens))
        return shapes

    def _fit_depth(self, limit: int, drafter: str) -> None:
        if self.depth <= limit:
            return
        if self.depth_given:
            raise LightSpecError(f"strategy {self.name!r}: depth={self.depth} is invalid with drafter {drafter!r}, "
                                 f"which grows trees at most {limit} levels deep; use depth <= {limit}")
        self.depth = limit
        self._set_shapes(self._shapes())

    def _cost(self, shape) -> float:
        k, d, t = shape
        hint = self.draft_cost_hints()[self.name]
        return 1.0 + VERIFY_SLOPE * t + hint * d

    def _effective(self, shape, k: int):
        """Under a node budget of k a tree keeps at most k nodes on at most k levels, and a
        frontier wider than k is never needed: ``(min(top_k, k), min(depth, k), min(total, k))``
        (at k = 1 every shape is the same one node)."""
        K, D, T = shape
        return (min(K, k), min(D, k), min(T, k))

    def _expand(self, ctx, limits: list[int], shape):
        K, D, T = shape
        D = min(D, max(limits))  # a row never keeps more levels than its node budget
        gate = _confidence_gate(ctx, len(limits))
        if K == 1:
            return self._expand_chain(ctx, limits, min(D, T), gate)
        lp = self.drafter.tree_start(ctx).float()  # [B, V]
        B, dev = lp.shape[0], lp.device
        score, tok = lp.topk(min(K, lp.shape[-1]), dim=-1)  # the first level: [B, K]
        pool_tok, pool_score = tok, score
        pool_par = torch.full_like(tok, -1)
        run = torch.full_like(tok, -1)  # each candidate's index among the nodes given to the drafter
        frontier = torch.arange(tok.shape[1], device=dev).expand(B, -1)  # pool indices
        given = 0
        for _ in range(D - 1):
            if gate is not None and not _any_confident(pool_score, pool_par, frontier, gate):
                break  # the budget's confidence rule, as a chain drafter applies it
            f_tok = pool_tok.gather(1, frontier)
            f_par = pool_par.gather(1, frontier)
            f_par_run = torch.where(f_par >= 0, run.gather(1, f_par.clamp(min=0)), f_par)
            child_lp = self.drafter.tree_step(f_tok, f_par_run).float()  # [B, F, V]
            F = f_tok.shape[1]
            run = run.scatter(1, frontier, torch.arange(given, given + F, device=dev).expand(B, -1))
            given += F
            c_score, c_tok = child_lp.topk(min(K, child_lp.shape[-1]), dim=-1)  # [B, F, K]
            c_score = (pool_score.gather(1, frontier)[:, :, None] + c_score).reshape(B, -1)
            c_par = frontier[:, :, None].expand(-1, -1, c_tok.shape[-1]).reshape(B, -1)
            base = pool_tok.shape[1]
            pool_tok = torch.cat([pool_tok, c_tok.reshape(B, -1)], 1)
            pool_score = torch.cat([pool_score, c_score], 1)
            pool_par = torch.cat([pool_par, c_par], 1)
            run = torch.cat([run, torch.full_like(c_par, -1)], 1)
            frontier = base + c_score.topk(min(K, c_score.shape[1]), dim=-1).indices
        toks, pars, scores, runs = pool_tok.tolist(), pool_par.tolist(), pool_score.tolist(), run.tolist()
        out_t, out_p, conf, drafted = [], [], [], []
        for b in range(B):
            keep = select_best(scores[b], pars[b], min(T, limits[b]))
            t, p = renumber(keep, toks[b], pars[b])
            out_t.append(t)
            out_p.append(p)
            conf.append([_step_prob(scores[b], pars[b], j) for j in keep])
            # the drafter's own numbering of the nodes it ran, for the commit
            order = sorted((r, j) for j, r in enumerate(runs[b]) if r >= 0)
            drafted.append(([toks[b][j] for _, j in order], [runs[b][pars[b][j]] if pars[b][j] >= 0 else -1
                                                            for _, j in order]))
        return out_t, out_p, conf, drafted


    def _expand_chain(self, ctx, limits: list[int], D: int, gate):
        """The one-wide shape: the same drafts as ``_expand`` gives it (each level's best child,
        grown until every row's newest token is below its confidence gate; a row keeps its
        first ``limits[b]`` nodes with a finite score), without a tree's bookkeeping, so a
        tree strategy that chose its chain costs what the chain drafter costs."""
        lp = self.drafter.tree_start(ctx).float()  # [B, V]
        score, tok = lp.topk(1, dim=-1)  # [B, 1]: the first level
        floor = gate[:, 0].tolist() if gate is not None else [float("-inf")] * len(limits)
        step_lp, toks = [score[:, 0].tolist()], [tok]  # per level: each row's log-probability given its parent
        for j in range(D - 1):
            # a row goes on while its newest node is finite and (with a gate) confident enough
            if not any(v >= f and v != float("-inf") for v, f in zip(step_lp[-1], floor)):
                break
            lp = self.drafter.tree_step(tok, torch.full_like(tok, j - 1)).float()[:, 0]  # [B, V]
            score, tok = lp.topk(1, dim=-1)
            step_lp.append(score[:, 0].tolist())
            toks.append(tok)
        step_lp = [list(r) for r in zip(*step_lp)]  # [B, levels]
        all_toks = torch.cat(toks, 1).tolist()
        steps = step_lp[0]
        grown = len(steps) - 1  # nodes given to the drafter (the last level is drafted, never run)
        out_t, out_p, conf, drafted = [], [], [], []
        for b, n in enumerate(limits):
            keep = 0
            while keep < min(n, len(steps)) and step_lp[b][keep] != float("-inf"):
                keep += 1
            out_t.append(all_toks[b][:keep])
            out_p.append(list(range(-1, keep - 1)))
            conf.append([math.exp(x) for x in step_lp[b][:keep]])
            drafted.append((all_toks[b][:grown], list(range(-1, grown - 1))))
        return out_t, out_p, conf, drafted


def _confidence_gate(ctx, B: int) -> torch.Tensor | None:
    """The budget's ``min_confidence`` per row as log-probabilities ``[B]``, or None when it
    stops nothing."""
    mc = getattr(ctx, "min_confidence", None)
    if mc is None or not bool((mc > 0).any()):
        return None
    return torch.log(mc.float().clamp(min=1e-30)).reshape(B, 1).to(mc.device)


def _any_confident(score: torch.Tensor, parent: torch.Tensor, frontier: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether any row has a frontier node drawn with at least the row's minimum confidence
    (its probability given its parent): a chain drafter stops after a token below it, so a
    tree stops growing once every frontier node is such a token."""
    f_score = score.gather(1, frontier)
    f_par = parent.gather(1, frontier)
    up = torch.where(f_par >= 0, score.gather(1, f_par.clamp(min=0)), torch.zeros_like(f_score))
    return bool(((f_score - up) >= gate.to(f_score.device)).any())


def _step_prob(scores: list[float], parents: list[int], j: int) -> float:
    """A node's probability given its parent (its cumulative score minus its parent's)."""
    up = scores[parents[j]] if parents[j] >= 0 else 0.0
    return math.exp(scores[j] - up)


class StaticTree(TreeStrategy):
    """A fixed tree given as a Medusa choice list: path ``[i, j, ...]`` is the node reached
    by the ``i``-th best child of the root, then that node's ``j``-th best child, ... under
    the drafter's distributions.  A row proposes the first ``max_draft`` paths (in depth,
    then rank, order) that the drafter gives a token.  ``adaptive``: the shaper picks per
    step between the whole tree and its chain of best children."""

    name = "static_tree"

    DEFAULT = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0],
               [0, 0, 0, 0, 0]]

    def __init__(self, choices=None, drafter="draft_model", drafter_options=None, adaptive: bool = True,
                 name: str | None = None):
        self.choices_given = choices is not None
        self.choices = parse_choices(self.DEFAULT if choices is None else choices)
        super().__init__(drafter, drafter_options, adaptive, self._shapes(), name)

    def _shapes(self) -> list[tuple]:
        """The chain of best children (when it is not the whole tree), then the whole tree."""
        chain = tuple(p for p in self.choices if not any(p))
        return [chain, tuple(self.choices)] if chain and len(chain) < len(self.choices) else [tuple(self.choices)]

    def _fit_depth(self, limit: int, drafter: str) -> None:
        deepest = max(len(p) for p in self.choices)
        if deepest <= limit:
            return
        if self.choices_given:
            raise LightSpecError(f"strategy {self.name!r}: choices reach depth {deepest}, but drafter {drafter!r} grows "
                                 f"trees at most {limit} levels deep; use paths of at most {limit} entries")
        self.choices = [p for p in self.choices if len(p) <= limit]
        self._set_shapes(self._shapes())

    def _cost(self, shape) -> float:
        hint = self.draft_cost_hints()[self.name]
        return 1.0 + VERIFY_SLOPE * len(shape) + hint * max(len(p) for p in shape)

    def _expand(self, ctx, limits: list[int], shape):
        # a node at depth d needs d nodes of a row's budget: deeper paths are never kept
        paths = [p for p in shape if len(p) <= max(limits)]
        need = {}  # path -> how many of its best children the choices use
        for p in paths:
            need[p[:-1]] = max(need.get(p[:-1], 0), p[-1] + 1)
        dist = {(): self.drafter.tree_start(ctx).float()}
        top: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        tok, score, run = {}, {}, {}
        given = 0
        for depth in range(1, max(len(p) for p in paths) + 1):
            level = [p for p in paths if len(p) == depth]
            for p in level:
                up = p[:-1]
                if up not in top:
                    top[up] = dist[up].topk(min(need[up], dist[up].shape[-1]), dim=-1)
                vals, ids = top[up]
                if p[-1] >= ids.shape[1]:  # a vocabulary smaller than the rank asked for
                    vals, ids = vals[:, :1].clone().fill_(float("-inf")), ids[:, :1]
                    tok[p], score[p] = ids[:, 0], vals[:, 0]
                else:
                    tok[p] = ids[:, p[-1]]
                    score[p] = vals[:, p[-1]] + (score[up] if up else 0.0)
            grow = [p for p in level if p in need]
            if grow:
                f_tok = torch.stack([tok[p] for p in grow], 1)
                f_par = torch.tensor([run[p[:-1]] if p[:-1] else -1 for p in grow], device=f_tok.device)
                lp = self.drafter.tree_step(f_tok, f_par.expand(f_tok.shape[0], -1)).float()
                for i, p in enumerate(grow):
                    run[p], dist[p] = given + i, lp[:, i]
                given += len(grow)
        B = len(limits)
        toks = torch.stack([tok[p] for p in paths], 1).tolist()
        scores = torch.stack([score[p] for p in paths], 1).tolist()
        index = {p: i for i, p in enumerate(paths)}
        parents = [index[p[:-1]] if p[:-1] else -1 for p in paths]
        grown = sorted(run, key=run.get)
        out_t, out_p, conf, drafted = [], [], [], []
        for b in range(B):
            keep: list[int] = []
            for j in range(len(paths)):
                if len(keep) >= limits[b]:
                    break
                if scores[b][j] != float("-inf") and (parents[j] < 0 or parents[j] in keep):
                    keep.append(j)
            t, par = renumber(keep, toks[b], parents)
            out_t.append(t)
            out_p.append(par)
            conf.append([_step_prob(scores[b], parents, j) for j in keep])
            drafted.append(([toks[b][index[p]] for p in grown], [run[p[:-1]] if p[:-1] else -1 for p in grown]))
        return out_t, out_p, conf, drafted


def eagle3_tree(**options) -> DynamicTree:
    """``dynamic_tree`` over the ``eagle3`` drafter (the lightspec-eagle3 plugin)."""
    if "eagle3" not in get_registry().names("strategy"):
        raise LightSpecError("the 'eagle3' drafter that eagle3_tree grows its trees from is not installed; it comes "
                             "with the lightspec-eagle3 plugin: pip install lightspec-eagle3")
    return DynamicTree(drafter="eagle3", name="eagle3_tree", **options)
