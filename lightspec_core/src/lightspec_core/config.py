"""Project defaults from ``lightspec.toml`` or ``[tool.lightspec]`` in ``pyproject.toml``.

Looked up in the current directory.  Known keys: ``model``, ``strategy``,
``draft_model``, ``budget``, ``max_new_tokens``, ``device``, ``dtype``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_KEYS = {"model", "strategy", "draft_model", "budget", "max_new_tokens", "device", "dtype"}


def load_defaults(directory: str | Path = ".") -> dict:
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
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(KNOWN_KEYS))}")
    return data


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
