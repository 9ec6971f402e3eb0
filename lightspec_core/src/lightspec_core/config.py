"""Project defaults from ``lightspec.toml`` or ``[tool.lightspec]`` in ``pyproject.toml``.

Looked up in the current directory.  Known keys and their types: ``model``, ``strategy``,
``draft_model``, ``device``, ``dtype`` (strings), ``budget`` (a policy name or a table with
``type`` and its options) and ``max_new_tokens`` (an integer >= 1).  An unknown key or a
value of the wrong type raises ``ConfigError`` naming the file and the key.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# key -> (accepts(value), what is allowed)
_RULES = {
    "model": (lambda v: isinstance(v, str) and v != "", "a non-empty string (a local model folder)"),
    "strategy": (lambda v: isinstance(v, str) and v != "", "a non-empty string (a registered strategy name or a YAML file path)"),
    "draft_model": (lambda v: isinstance(v, str) and v != "", "a non-empty string (a local model folder)"),
    "budget": (lambda v: (isinstance(v, str) and v != "") or isinstance(v, dict),
               "a budget policy name (dynamic or static) or a table with 'type' and its options"),
    "max_new_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "device": (lambda v: isinstance(v, str) and v != "", "a string: cpu, cuda, cuda:N or auto"),
    "dtype": (lambda v: isinstance(v, str) and v != "", "a string: float32, bfloat16, float16 or auto"),
}
KNOWN_KEYS = set(_RULES)


def load_defaults(directory: str | Path = ".") -> dict:
    """The defaults found in ``directory`` (``{}`` when there are none), validated."""
    d = Path(directory)
    own = d / "lightspec.toml"
    if own.is_file():
        data, where = _read(own), str(own)
    else:
        py = d / "pyproject.toml"
        if not py.is_file():
            return {}
        data = _read(py).get("tool", {}).get("lightspec", {})
        where = f"{py} [tool.lightspec]"
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a table, got {type(data).__name__} {data!r}")
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(KNOWN_KEYS))}")
    for key, value in data.items():
        accepts, allowed = _RULES[key]
        if not accepts(value):
            raise ConfigError(f"{where}: key {key!r} = {value!r} ({_toml_type(value)}) is invalid: use {allowed}")
    return data


def _toml_type(value) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__)


def _read(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark is dropped
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
