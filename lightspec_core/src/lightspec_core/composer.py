"""The composer: hybrid strategies built from other strategies, in YAML or Python.

Combination kinds:

* ``switch``  — per row and step, route to the first component whose draft scores at
  least ``switch_threshold`` (score = the draft's first-token confidence when the drafter
  reports one, else that component's recent acceptance rate on this row); the last
  component takes every row left.  Components are asked lazily, cheapest first.
* ``cascade`` — the first component drafts, each next one extends that draft (it sees
  it as ``ctx.prefix``) up to the row's budget.
* ``union``   — every component drafts from the same root and the drafts are merged into one
  token tree; needs a ``fusion`` component named ``tree_union`` (the lightspec-tree plugin).
  Each component drafts within its own limit: the budget's per-source cap where it gives one
  (``Budget.by_source``; a component capped at 0 is not run, so it costs nothing that step),
  and the tree holds up to the budget's looser limit for model-free drafters where it gives
  one (``Budget.free_max_draft``), so a free n-gram draft is not cut to a model drafter's k.
  With ``lazy`` a component drafts only for the rows whose drafts so far (from the components
  before it, in order) are shorter than its own limit: a model drafter listed after n-gram
  lookup then runs where the free draft left room, not on every step.

Combinations are built from YAML or specs by ``strategy_files.build_strategy``; this module
holds the combination strategy and the fusion rules, written on the public API only.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import ConfigError
from .hookspecs import hookimpl
from .interfaces import DraftProposal, SparseProbs, StepContext

COMBINATION_KINDS = ("switch", "cascade", "union")
FUSION_FOR_KIND = {"switch": "first", "cascade": "concat", "union": "tree_union"}


# --- fusion rules (registered as components of kind "fusion") -------------------------


class FirstFusion:
    """Per row, the first proposal with a non-empty draft."""

    name = "first"

    @hookimpl
    def lightspec_fuse(self, ctx: StepContext, proposals: list[DraftProposal | None]) -> DraftProposal | None:
        return fuse_rows(ctx, proposals, concat=False)


class ConcatFusion:
    """Per row, every proposal's draft one after the other (cascades)."""

    name = "concat"

    @hookimpl
    def lightspec_fuse(self, ctx: StepContext, proposals: list[DraftProposal | None]) -> DraftProposal | None:
        return fuse_rows(ctx, proposals, concat=True)


def fuse_rows(ctx: StepContext, proposals: list[DraftProposal | None], concat: bool) -> DraftProposal | None:
    """Per row, the first non-empty chain (``concat=False``) or all chains one after the
    other; tokens, probabilities, confidences and entropies travel with their tokens."""
    props = [p for p in proposals if p is not None and p.max_len > 0]
    if not props:
        return None
    if any(p.parents is not None for p in props):
        raise ValueError("the 'first' and 'concat' fusions join chains; a token tree needs the 'union' kind "
                         "(the tree_union fusion of lightspec-tree)")
    B, dev = ctx.batch, ctx.device
    lens = [p.lengths.tolist() for p in props]
    need_probs = any(p.probs is not None for p in props) and not ctx.sampling.greedy
    pieces: list[list[tuple[int, int]]] = []  # per row: (proposal index, length) in order
    for b in range(B):
        row = []
        for i in range(len(props)):
            if lens[i][b] > 0:
                row.append((i, lens[i][b]))
                if not concat:
                    break
        pieces.append(row)
    K = max((sum(n for _, n in row) for row in pieces), default=0)
    if K == 0:
        return None
    # tokens and confidences are assembled as Python lists, one tensor each at the end: a
    # per-row slice assignment costs a few microseconds, and a cascade fuses on every step
    # (float32 confidences survive the round trip through Python floats exactly)
    tok_rows = [p.tokens.tolist() for p in props]
    conf_rows = [p.confidence.tolist() if p.confidence is not None else None for p in props]
    ent_rows = [p.entropy.tolist() if p.entropy is not None else None for p in props]
    with_ent = any(e is not None for e in ent_rows)
    dense = [p.probs.dense(ctx.vocab_size) if isinstance(p.probs, SparseProbs) else p.probs for p in props]
    probs = torch.zeros(B, K, ctx.vocab_size, device=dev) if need_probs else None
    tokens, conf, ent, lengths, sources = [], [], [], [], []
    for b, row in enumerate(pieces):
        t_row: list[int] = []
        c_row: list[float] = []
        e_row: list[float] = []
        names = []
        for i, n in row:
            p = props[i]
            at = len(t_row)
            t_row += tok_rows[i][b][:n]
            c_row += conf_rows[i][b][:n] if conf_rows[i] is not None else [0.0] * n
            # a drafter without entropies (n-gram lookup) is certain of its tokens: entropy 0
            e_row += ent_rows[i][b][:n] if ent_rows[i] is not None else [0.0] * n
            if probs is not None:
                if dense[i] is not None:
                    probs[b, at : at + n, : dense[i].shape[-1]] = dense[i][b, :n]
                else:  # a drafter without probabilities: one-hot q
                    probs[b, torch.arange(at, at + n, device=dev), p.tokens[b, :n]] = 1.0
            names.append(p.source_of(b))
        lengths.append(len(t_row))
        sources.append("+".join(names))
        tokens.append(t_row + [0] * (K - len(t_row)))
        conf.append(c_row + [0.0] * (K - len(c_row)))
        ent.append(e_row + [0.0] * (K - len(e_row)))
    return DraftProposal(
        tokens=torch.tensor(tokens, dtype=torch.long, device=dev),
        lengths=torch.tensor(lengths, device=dev),
        probs=probs,
        confidence=torch.tensor(conf, dtype=torch.float32, device=dev),
        entropy=torch.tensor(ent, dtype=torch.float32, device=dev) if with_ent else None,
        source=sources,
    )


# --- the combination strategy ---------------------------------------------------------


class Combination:
    """A strategy made of other strategies (see the module docstring)."""

    def __init__(
        self,
        name: str,
        kind: str,
        components: list[Any],
        fusion: Any,
        switch_threshold: float = 0.5,
        lazy: bool = False,
    ):
        if kind not in COMBINATION_KINDS:
            raise ConfigError(f"combination {name!r}: kind={kind!r} is invalid; allowed: {', '.join(COMBINATION_KINDS)}")
        if len(components) < 2:
            raise ConfigError(f"combination {name!r}: needs at least 2 components, got {len(components)}")
        if not isinstance(switch_threshold, (int, float)) or not 0 <= switch_threshold <= 1:
            raise ConfigError(f"combination {name!r}: switch_threshold={switch_threshold!r} is invalid; use a number in [0, 1]")
        self.name = name
        self.kind = kind
        self.components = components
        self.fusion = fusion
        self.switch_threshold = float(switch_threshold)
        if lazy and kind != "union":
            raise ConfigError(f"combination {name!r}: lazy=True applies to kind 'union' only, not {kind!r}")
        self.lazy = bool(lazy)
        self.hidden_layers = sorted({i for c in components for i in getattr(c, "hidden_layers", [])})
        # per (component index, request id): recent acceptance rate, for the switch score
        self.rates: dict[tuple[int, int], float] = {}

    def setup(self, env) -> None:
        # the fusion first: a fusion that cannot work with this target (a tree fusion on a target
        # without tree masks) refuses it at start-up, before the components load their models
        for c in (self.fusion, *self.components):
            if hasattr(c, "setup"):
                c.setup(env)
        # a component may learn its hidden layers in setup (an EAGLE head reads its taps there)
        self.hidden_layers = sorted({i for c in self.components for i in getattr(c, "hidden_layers", [])})

    def _skipped(self, ctx: StepContext, comp) -> None:
        """A component left without budget this step drafts nothing, but one that reads hidden
        states is still called with a zero budget: those states are handed over only once."""
        if getattr(comp, "hidden_layers", None):
            zero = [0] * ctx.batch
            comp.lightspec_propose(ctx=ctx.with_budget(torch.zeros(ctx.batch, dtype=torch.long, device=ctx.device), zero))
        return None

    def draft_cost_hints(self) -> dict[str, float]:
        """The components' structural draft-cost estimates (see ``ModelDrafter.draft_cost_hints``)."""
        hints: dict[str, float] = {}
        for c in self.components:
            if hasattr(c, "draft_cost_hints"):
                hints.update(c.draft_cost_hints())
        return hints

    def reset(self) -> None:
        self.rates.clear()
        for c in self.components:
            if hasattr(c, "reset"):
                c.reset()

    @hookimpl
    def lightspec_propose(self, ctx: StepContext) -> DraftProposal | None:
        if self.kind == "cascade":
            proposals = self._cascade(ctx)
        elif self.kind == "switch":
            proposals = self._switch(ctx)
        else:
            proposals = self._union(ctx)
            if ctx.free_max_draft_list is not None:  # the tree may hold the free drafters' longer drafts
                free = ctx.free_max_draft_list
                ctx = ctx.with_budget(torch.tensor(free, device=ctx.device), list(free))
        return self.fusion.lightspec_fuse(ctx=ctx, proposals=proposals)

    @staticmethod
    def _limits(ctx: StepContext, comp, left: list[int]) -> list[int]:
        """``left`` cut by the budget's per-source cap for ``comp`` (``Budget.by_source``), if any."""
        cap = ctx.budget_by_source.get(getattr(comp, "name", ""))
        return left if cap is None else [min(x, c) for x, c in zip(left, cap)]

    def _union(self, ctx: StepContext) -> list[DraftProposal | None]:
        """Every component's draft from the root, each within its per-source cap; with
        ``lazy``, only for the rows the drafts before it leave short (module docstring)."""
        proposals: list[DraftProposal | None] = []
        longest = [0] * ctx.batch  # per row, the longest draft so far (lazy)
        for comp in self.components:
            mine = self._limits(ctx, comp, ctx.max_draft_list)
            if self.lazy and any(n >= m > 0 for n, m in zip(longest, mine)):
                mine = [0 if n >= m else m for n, m in zip(longest, mine)]
            if mine is ctx.max_draft_list:
                p = comp.lightspec_propose(ctx=ctx)
            elif max(mine) <= 0:
                p = self._skipped(ctx, comp)
            else:
                p = comp.lightspec_propose(ctx=ctx.with_budget(torch.tensor(mine, device=ctx.device), mine))
            if self.lazy and p is not None:
                longest = [max(n, int(x)) for n, x in zip(longest, p.lengths.tolist())]
            proposals.append(p)
        return proposals

    def _switch(self, ctx: StepContext) -> list[DraftProposal | None]:
        left = list(ctx.max_draft_list)
        proposals: list[DraftProposal | None] = []
        last = len(self.components) - 1
        for i, comp in enumerate(self.components):
            if max(left) <= 0:
                proposals.append(self._skipped(ctx, comp))
                continue
            mine = self._limits(ctx, comp, left)
            if max(mine) <= 0:
                proposals.append(self._skipped(ctx, comp))
                continue
            sub = ctx.with_budget(torch.tensor(mine, device=ctx.device), mine)
            p = comp.lightspec_propose(ctx=sub)
            if p is not None and i < last:
                lens = p.lengths.tolist()
                first_conf = p.confidence[:, 0].tolist() if p.confidence is not None and p.max_len > 0 else None
                keep = []
                for b in range(ctx.batch):
                    if lens[b] == 0:
                        keep.append(False)
                        continue
                    score = first_conf[b] if first_conf is not None else self.rates.get((i, ctx.row_ids[b]), 0.6)
                    keep.append(score >= self.switch_threshold)
                for b, k in enumerate(keep):
                    if k:
                        left[b] = 0
                if not all(k or n == 0 for k, n in zip(keep, lens)):
                    mask = torch.tensor(keep, device=ctx.device)
                    p = DraftProposal(
                        tokens=p.tokens,
                        lengths=torch.where(mask, p.lengths, 0),
                        probs=p.probs,
                        confidence=p.confidence,
                        entropy=p.entropy,
                        source=p.source,
                    )
            proposals.append(p)
        return proposals

    def _cascade(self, ctx: StepContext) -> list[DraftProposal | None]:
        proposals: list[DraftProposal | None] = []
        budget = list(ctx.max_draft_list)
        prefix = None
        prefix_len = torch.zeros(ctx.batch, dtype=torch.long, device=ctx.device)
        for comp in self.components:
            mine = self._limits(ctx, comp, budget)  # what is left, within the component's own cap
            if max(mine) <= 0:
                proposals.append(self._skipped(ctx, comp))
                continue
            sub = ctx.with_budget(torch.tensor(mine, device=ctx.device), list(mine))
            sub.prefix, sub.prefix_lengths = prefix, prefix_len if prefix is not None else None
            p = comp.lightspec_propose(ctx=sub)
            proposals.append(p)
            if p is not None and p.max_len > 0:
                budget = [max(0, x - n) for x, n in zip(budget, p.lengths.tolist())]
                fused = fuse_rows(ctx, [DraftProposal(prefix, prefix_len) if prefix is not None else None, p], concat=True)
                prefix, prefix_len = fused.tokens, fused.lengths
        return proposals

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        for c in self.components:
            if hasattr(c, "lightspec_on_stats"):
                c.lightspec_on_stats(event=event)
        names = [getattr(c, "name", "") for c in self.components]
        for rid, src, d, a in zip(event.row_ids, event.sources, event.levels, event.accepted):
            if d == 0 or not src:
                continue
            first = src.split("+")[0]
            if first in names:
                key = (names.index(first), rid)
                self.rates[key] = 0.7 * self.rates.get(key, 0.6) + 0.3 * (a / d)


# --- building strategies from specs ---------------------------------------------------


class HybridStrategy(Combination):
    """The built-in ``hybrid``: n-gram lookup (free when the context repeats) combined with a
    model drafter — the draft model when one is given, else layer skip.  ``kind="switch"``
    routes each row to one of them per step; ``kind="cascade"`` lets the model drafter extend
    the n-gram draft (or draft alone when there is no match).  ``max_draft`` caps the model
    drafter, ``ngram_max_draft`` the n-gram lookup, whose drafts cost only verify width and
    which sizes them itself for a single row (see ``strategies/ngram.py``)."""

    def __init__(self, registry, switch_threshold: float = 0.5, max_draft: int = 8, kind: str = "cascade",
                 ngram_max_draft: int = 16):
        if kind not in ("switch", "cascade"):
            raise ConfigError(f"hybrid: kind={kind!r} is invalid; allowed: switch, cascade")
        self.registry = registry
        self.max_draft = max_draft
        super().__init__(
            "hybrid",
            kind,
            [registry.create("strategy", "ngram", max_draft=ngram_max_draft), None],
            registry.create("fusion", FUSION_FOR_KIND[kind]),
            switch_threshold,
        )

    def setup(self, env) -> None:
        second = "draft_model" if env.draft_model is not None else "layerskip"
        self.components[1] = self.registry.create("strategy", second, max_draft=self.max_draft)
        super().setup(env)
