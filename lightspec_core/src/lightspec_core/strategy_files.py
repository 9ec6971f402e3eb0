"""Strategies from specs: a registered name, a name with options
(``"eagle3:max_draft=4"``, the syntax ``--budget`` takes), a mapping
``{type|name: ..., options...}``, or a YAML strategy file (``--strategy file.yaml``), built
through the plugin registry.

YAML is read with ``safe_yaml.load`` (``yaml.safe_load`` with limits on alias expansion,
size and nesting); definitions may refer to each other, and a cycle is named
(``strategy cycle: a -> b -> a``)::

    strategies:
      - name: hybrid_predict
        type: combination
        kind: switch
        components: [ngram, {type: draft_model, max_draft: 6}]
        switch_threshold: 0.5
    sinks: [log]
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

from .component_spec import parse_spec
from .composer import COMBINATION_KINDS, FUSION_FOR_KIND, Combination
from .errors import ConfigError, LightSpecError

MAX_STRATEGY_NESTING = 32  # strategies built inside strategies (references and inline mappings)


class StrategyCycleError(ConfigError):
    """Strategy definitions that refer to each other in a loop (``a -> b -> a``), or
    strategies nested deeper than ``MAX_STRATEGY_NESTING``: raised as is, not wrapped in
    each enclosing combination's message."""


def is_strategy_file(spec: Any) -> bool:
    """``spec`` names a YAML strategy file (``.yaml`` / ``.yml``)."""
    return isinstance(spec, str) and spec.strip().endswith((".yaml", ".yml"))


def strategy_spec(text: str | dict, options: dict | None = None) -> dict:
    """``text``, a registered name or ``NAME:OPTION=VALUE,...`` (each value a YAML scalar,
    as ``component_spec.parse_spec`` reads it) or already a mapping, with ``options``
    (keyword options, e.g. ``MTPPipeline(..., max_draft=4)``) as the mapping
    ``{"type": name, **options}``.

    Raises ``ConfigError`` for a malformed text and for an option given both ways."""
    spec = dict(text) if isinstance(text, dict) else parse_spec(text, "strategy")
    for option, value in (options or {}).items():
        if option in spec:
            raise ConfigError(f"strategy {text!r}: option {option!r} is given both in the strategy text and as a "
                              f"keyword ({option}={_short_repr(value)}); give it once")
        spec[option] = value
    return spec


def check_strategy_spec(spec: Any, registry) -> None:
    """Refuse, before any model loads, a strategy text whose name is not registered or
    whose inline options the strategy does not take (the error lists what is allowed).
    A YAML file, a mapping or an object is checked when it is built."""
    if not isinstance(spec, str) or is_strategy_file(spec):
        return
    parsed = strategy_spec(spec)
    name = parsed.pop("type")
    try:
        component = registry.get("strategy", name)
    except LightSpecError as exc:
        raise ConfigError(f"strategy {spec!r}: {exc}") from None
    parsed.pop("name", None)
    unknown = sorted(set(parsed) - set(component.params)) if component.params else []
    if unknown:
        raise ConfigError(f"strategy {spec!r}: strategy {name!r} has no option {unknown[0]!r}; "
                          f"allowed: {', '.join(sorted(component.params))}")


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
        lazy = spec.pop("lazy", False)
        spec.pop("budget", None)
        if spec:
            raise ConfigError(
                f"{where}: unknown key {sorted(map(str, spec))[0]!r}; allowed: name, type, kind, components, switch_threshold, "
                "lazy, budget"
            )
        if not isinstance(lazy, bool):
            raise ConfigError(f"{where}: key 'lazy' is {_short_repr(lazy)}; allowed: true or false")
        if lazy and kind != "union":
            raise ConfigError(f"{where}: key 'lazy' applies to kind 'union' only, not {_short_repr(kind)}")
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
        return Combination(name or "combination", kind, built, fusion, threshold, lazy=lazy)
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
    from . import safe_yaml

    path = Path(path)
    data = safe_yaml.load_file(path, "strategy")
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
