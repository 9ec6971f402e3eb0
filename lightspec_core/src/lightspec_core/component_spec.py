"""Naming a component with its options: budget policies, statistics sinks and strategies
(``strategy_files.strategy_spec``; a strategy's YAML file is a strategy file, not this form).

A spec is one of:

* a name: ``"dynamic"``;
* a name with options: ``"static:k=2"``, ``"dynamic:max_draft=6,guard=false"``,
  ``"jsonl:path=steps.jsonl"``.  Each value is read as a YAML scalar: ``2`` an int,
  ``0.6`` or ``1e-3`` a float, ``true``/``false`` a bool, anything else a string;
* a YAML file path (``.yaml``/``.yml``): a mapping ``{type: static, k: 2}``, or a file
  with a top-level ``budget:`` (or ``sink:``) mapping;
* a mapping ``{"type": name, **options}`` (the API form, what the others parse into);
* for ``build_component``, also a ready component object.

``parse_spec`` turns the text forms into the mapping; ``build_component`` creates the
component through the registry (whose ``create`` rejects unknown names and options).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError, LightSpecError

SYNTAX = "NAME, NAME:OPTION=VALUE,... or a YAML file"
EXAMPLES = {"budget": "static:k=2", "sink": "jsonl:path=steps.jsonl", "strategy": "eagle3:max_draft=4"}


def _scalar(kind: str, text: str, option: str, raw: str):
    import yaml

    if not raw.strip():
        raise ConfigError(f"{kind} {text!r}: option {option!r} has no value; use {option}=VALUE")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 as a string
            return float(value) if value.lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    if value is None or not isinstance(value, (bool, int, float)):
        raise ConfigError(f"{kind} {text!r}: option {option!r} has value {raw!r}; allowed: a number, true/false or a string")
    return value


def _from_file(kind: str, path: Path) -> dict:
    from . import safe_yaml

    data = safe_yaml.load_file(path, kind)  # within limits: no recursive aliases, bounded expansion
    if isinstance(data, dict) and "type" not in data and kind in data:
        data = data[kind]  # a file with a top-level ``budget:`` mapping (other keys are not ours)
    if isinstance(data, str):
        data = {"type": data}
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ConfigError(f"{path}: expected a mapping with a string key 'type' (e.g. {{type: static, k: 2}}), "
                          f"or a top-level key {kind!r} holding one")
    return dict(data)


def parse_spec(text: str, kind: str) -> dict:
    """``text`` (a name, ``NAME:OPTION=VALUE,...`` or a YAML file path) as the mapping
    ``{"type": name, **options}``.  Raises ``ConfigError`` naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{kind} spec {text!r} is invalid; use {SYNTAX}")
    text = text.strip()
    if text.endswith((".yaml", ".yml")):
        return _from_file(kind, Path(text))
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"{kind} spec {text!r} has no name; use {SYNTAX}")
    spec: dict[str, Any] = {"type": name}
    if not sep:
        return spec
    if not rest.strip():
        raise ConfigError(f"{kind} spec {text!r} has no options after ':'; use {SYNTAX}")
    for item in rest.split(","):
        option, eq, raw = item.partition("=")
        option = option.strip()
        if not eq or not option:
            raise ConfigError(f"{kind} {text!r}: {item.strip()!r} is not OPTION=VALUE; use {SYNTAX} "
                              f"(e.g. {EXAMPLES.get(kind, 'static:k=2')})")
        if option in spec:
            raise ConfigError(f"{kind} {text!r}: option {option!r} is given twice")
        spec[option] = _scalar(kind, text, option, raw.strip())
    return spec


def spec_label(spec) -> str:
    """A short label for a spec, e.g. for a benchmark method: the text as given (a YAML
    file: its stem), a mapping's type and options."""
    if isinstance(spec, str):
        return Path(spec).stem if spec.endswith((".yaml", ".yml")) else spec
    if isinstance(spec, dict):
        opts = ",".join(f"{k}={v}" for k, v in spec.items() if k != "type")
        return f"{spec.get('type')}:{opts}" if opts else str(spec.get("type"))
    return getattr(spec, "name", type(spec).__name__)


def build_component(kind: str, spec, registry, default_type: str | None = None, where: str | None = None):
    """The component for ``spec`` (a text form, a mapping, or an object, returned as is).
    A mapping without ``type`` uses ``default_type``.  Errors are ``LightSpecError``s
    prefixed with ``where`` when given."""
    prefix = f"{where}: " if where else ""
    if isinstance(spec, str):
        try:
            spec = parse_spec(spec, kind)
        except ConfigError as exc:
            raise ConfigError(prefix + str(exc)) from None
    if not isinstance(spec, dict):  # an object (a budget object is checked when the pipeline binds it)
        if kind == "sink" and not hasattr(spec, "lightspec_on_stats"):
            raise LightSpecError(f"{prefix}sink {spec!r} does not implement lightspec_on_stats; use a sink name, "
                                 "a mapping or an object with lightspec_on_stats")
        return spec
    opts = dict(spec)
    name = opts.pop("type", default_type)
    if not isinstance(name, str):
        raise ConfigError(f"{prefix}{kind} {spec!r} needs a string key 'type'; available: {', '.join(registry.names(kind))}")
    try:
        return registry.create(kind, name, **opts)
    except LightSpecError as exc:
        raise type(exc)(prefix + str(exc)) from None
    except (TypeError, ValueError) as exc:
        params = registry.get(kind, name).params
        allowed = f"; options: {', '.join(sorted(params))}" if params else ""
        raise ConfigError(f"{prefix}{kind} {name!r}: {exc}{allowed}") from None
