"""The composer: hybrid strategies built from other strategies, in YAML or Python.

Combination kinds:

* ``switch``  — per row and step, route to the first component whose draft scores at
  least ``switch_threshold`` (score = the draft's first-token confidence when the drafter
  reports one, else that component's recent acceptance rate on this row); the last
  component takes every row left.  Components are asked lazily, cheapest first.
* ``cascade`` — the first component drafts, each next one extends that draft (it sees
  it as ``ctx.prefix``) up to the row's budget.
* ``union``   — all drafts merged into one token tree; needs a ``fusion`` component named
  ``tree_union`` (the lightspec-tree plugin).

YAML (read with ``safe_yaml.load``: ``yaml.safe_load`` with limits)::

    strategies:
      - name: hybrid_predict
        type: combination
        kind: switch
        components: [ngram, {type: draft_model, max_draft: 6}]
        switch_threshold: 0.5
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError, LightSpecError
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
        self.hidden_layers = sorted({i for c in components for i in getattr(c, "hidden_layers", [])})
        # per (component index, request id): recent acceptance rate, for the switch score
        self.rates: dict[tuple[int, int], float] = {}

    def setup(self, env) -> None:
        for c in self.components:
            if hasattr(c, "setup"):
                c.setup(env)

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
        else:
            proposals = self._switch(ctx) if self.kind == "switch" else [c.lightspec_propose(ctx=ctx) for c in self.components]
        return self.fusion.lightspec_fuse(ctx=ctx, proposals=proposals)

    def _switch(self, ctx: StepContext) -> list[DraftProposal | None]:
        left = list(ctx.max_draft_list)
        proposals: list[DraftProposal | None] = []
        last = len(self.components) - 1
        for i, comp in enumerate(self.components):
            if max(left) <= 0:
                proposals.append(None)
                continue
            cap = ctx.budget_by_source.get(getattr(comp, "name", ""))
            mine = left if cap is None else [min(x, c) for x, c in zip(left, cap)]
            if max(mine) <= 0:
                proposals.append(None)
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
            if max(budget) <= 0:
                proposals.append(None)
                continue
            sub = ctx.with_budget(torch.tensor(budget, device=ctx.device), list(budget))
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
        for rid, src, d, a in zip(event.row_ids, event.sources, event.drafted, event.accepted):
            if d == 0 or not src:
                continue
            first = src.split("+")[0]
            if first in names:
                key = (names.index(first), rid)
                self.rates[key] = 0.7 * self.rates.get(key, 0.6) + 0.3 * (a / d)


# --- building strategies from specs ---------------------------------------------------


MAX_STRATEGY_NESTING = 32  # strategies built inside strategies (references and inline mappings)


class StrategyCycleError(ConfigError):
    """Strategy definitions that refer to each other in a loop (``a -> b -> a``), or
    strategies nested deeper than ``MAX_STRATEGY_NESTING``: raised as is, not wrapped in
    each enclosing combination's message."""


def build_strategy(spec: Any, registry, defined: dict[str, dict] | None = None, where: str = "strategy",
                   _chain: tuple[str, ...] = (), _depth: int = 0) -> Any:
    """Build a strategy object from a name, or a mapping ``{type|name: ..., options...}``.

    ``defined`` holds the entries of a strategy file, which may refer to each other by
    name.  Inside its own definition a name means the registered strategy it shadows
    (``{name: ngram, type: ngram, max_draft: 3}``); a definition that reaches itself
    otherwise raises ``StrategyCycleError`` naming the loop (``a -> b -> a``).
    ``_chain``: the definitions being built, outermost first; ``_depth``: how deep this
    spec sits in the one being built (both internal).
    """
    defined = defined or {}
    if _depth > MAX_STRATEGY_NESTING:
        raise StrategyCycleError(f"strategies nest deeper than {MAX_STRATEGY_NESTING} levels (does a spec contain itself?)")
    if isinstance(spec, str):
        if spec in defined and not _shadows_registered(spec, _chain, registry):
            _check_cycle(spec, _chain)
            return build_strategy(defined[spec], registry, defined, where=f"{where} {spec!r}", _chain=_chain + (spec,),
                                  _depth=_depth + 1)
        return registry.create("strategy", spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a strategy name or a mapping, got {type(spec).__name__} {_short_repr(spec)}")
    spec = dict(spec)
    name = spec.pop("name", None)
    stype = spec.pop("type", None) or name
    if stype is None:
        raise ConfigError(f"{where}: each strategy needs 'type' (or 'name' of a registered strategy)")
    if not isinstance(stype, str):
        raise ConfigError(f"{where}: key 'type' must be a strategy name (a string), got {_short_repr(stype)}")
    if stype == "combination":
        kind = spec.pop("kind", "switch")
        comps = spec.pop("components", None)
        if not isinstance(comps, list):
            raise ConfigError(f"{where}: key 'components' must be a list of strategy names or mappings, got {_short_repr(comps)}")
        threshold = spec.pop("switch_threshold", 0.5)
        spec.pop("budget", None)
        if spec:
            raise ConfigError(
                f"{where}: unknown key {sorted(map(str, spec))[0]!r}; allowed: name, type, kind, components, switch_threshold, budget"
            )
        if kind not in COMBINATION_KINDS:
            raise ConfigError(f"{where}: key 'kind' is {_short_repr(kind)}; allowed: {', '.join(COMBINATION_KINDS)}")
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 <= threshold <= 1:
            raise ConfigError(f"{where}: key 'switch_threshold' is {_short_repr(threshold)}; allowed: a number in [0, 1]")
        built = []
        for i, c in enumerate(comps):
            try:
                built.append(build_strategy(c, registry, defined, where=f"{where} component {i}", _chain=_chain,
                                            _depth=_depth + 1))
            except StrategyCycleError:
                raise
            except LightSpecError as exc:
                raise ConfigError(f"{where}: key 'components' item {i} ({_short_repr(c)}): {exc}") from None
        fusion_name = FUSION_FOR_KIND[kind]
        try:
            fusion = registry.create("fusion", fusion_name)
        except LightSpecError:
            raise ConfigError(
                f"{where}: kind 'union' merges drafts into a token tree and needs the 'tree_union' fusion "
                "from the lightspec-tree plugin, which is not installed (pip install lightspec-tree)"
            ) from None
        return Combination(name or "combination", kind, built, fusion, threshold)
    if stype in defined and not _shadows_registered(stype, _chain, registry):
        _check_cycle(stype, _chain)
        base = dict(defined[stype])
        base.update(spec)
        return build_strategy(base, registry, defined, where, _chain=_chain + (stype,), _depth=_depth + 1)
    spec.pop("budget", None)
    try:
        obj = registry.create("strategy", stype, **spec)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except LightSpecError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return obj


_short_repr = reprlib.repr  # bounded: a spec may be large or contain itself


def _shadows_registered(name: str, chain: tuple[str, ...], registry) -> bool:
    """``name`` is used inside its own definition and a registered strategy has that name:
    the definition configures the registered one (it does not refer to itself)."""
    return name in chain and ("strategy", name) in registry.components


def _check_cycle(name: str, chain: tuple[str, ...]) -> None:
    if name in chain:
        loop = [*chain[chain.index(name):], name]
        raise StrategyCycleError(f"strategy cycle: {' -> '.join(loop)}")


def load_strategy_file(path: str | Path, registry) -> tuple[Any, dict | str | None, list | None]:
    """Load a YAML strategy file; return (strategy object, its budget spec or None, the
    file's ``sinks:`` list (sink names or mappings) or None).

    The file's ``default:`` key picks the strategy; otherwise the last one listed.  The
    YAML is read safely and within limits (``safe_yaml``: no recursive aliases, a bounded
    size once aliases are expanded, bounded nesting).
    """
    import yaml

    from . import safe_yaml

    path = Path(path)
    try:
        data = safe_yaml.load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"strategy file {str(path)!r} does not exist") from None
    except safe_yaml.YamlLimitError as exc:
        raise ConfigError(f"{path}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("strategies"), list) or not data["strategies"]:
        raise ConfigError(f"{path}: expected a mapping with a non-empty list under key 'strategies'")
    unknown = set(data) - {"strategies", "default", "sinks"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key {sorted(map(str, unknown))[0]!r}; "
                          f"allowed: strategies, default, sinks")
    sinks = data.get("sinks")
    if sinks is not None and not isinstance(sinks, list):
        raise ConfigError(f"{path}: key 'sinks' must be a list of sink names or mappings, got {sinks!r}")
    defined: dict[str, dict] = {}
    for i, entry in enumerate(data["strategies"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{path}: strategies[{i}] needs a string key 'name'")
        defined[entry["name"]] = entry
    default = data.get("default", data["strategies"][-1]["name"])
    if not isinstance(default, str) or default not in defined:
        raise ConfigError(f"{path}: key 'default' is {_short_repr(default)}; allowed: {', '.join(defined)}")
    entry = defined[default]
    try:
        strategy = build_strategy(entry, registry, defined, where=f"{path}: strategy {default!r}", _chain=(default,))
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    return strategy, entry.get("budget"), sinks


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
