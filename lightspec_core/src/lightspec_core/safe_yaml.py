"""YAML for configuration files: ``yaml.safe_load`` with limits.

``safe_load`` alone still lets a small file cost without bound: aliases (``*a``) repeat
what an anchor (``&a``) points to, so nine nested lists of nine aliases each ("billion
laughs", under 2 kB) stand for 9^9 nodes, which anything that walks the result (a
``repr`` in an error message, a loop over components) then expands; and an alias inside
the node it names makes a recursive structure.  ``load`` refuses, with ``YamlLimitError``:

* a recursive alias (one that refers to a node containing it);
* nesting deeper than ``MAX_DEPTH`` levels;
* more than ``MAX_NODES`` nodes once every alias is expanded.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64
MAX_NODES = 10_000


class YamlLimitError(ValueError):
    """A YAML document over one of the limits (the message says which, and where)."""


def _loader_class():
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """``SafeLoader`` that refuses recursive aliases and over-deep nesting while composing."""

        def __init__(self, stream):
            super().__init__(stream)
            self.open_anchors: list[str | None] = []  # anchors of the nodes being composed (the ancestors)

        def compose_node(self, parent, index):
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark else "?"
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in self.open_anchors:
                    raise YamlLimitError(f"line {line}: alias *{event.anchor} is recursive (it refers to a node "
                                         "that contains it)")
                return super().compose_node(parent, index)
            if len(self.open_anchors) >= MAX_DEPTH:
                raise YamlLimitError(f"line {line}: nested deeper than {MAX_DEPTH} levels")
            self.open_anchors.append(getattr(event, "anchor", None))
            try:
                return super().compose_node(parent, index)
            finally:
                self.open_anchors.pop()

    return BoundedLoader


def expanded_size(node) -> int:
    """Nodes in the tree under ``node`` with every alias expanded (each shared node counted
    once per reference; computed once per distinct node)."""
    import yaml

    memo: dict[int, int] = {}

    def size(n) -> int:
        key = id(n)
        if key not in memo:
            if isinstance(n, yaml.SequenceNode):
                memo[key] = 1 + sum(size(c) for c in n.value)
            elif isinstance(n, yaml.MappingNode):
                memo[key] = 1 + sum(size(k) + size(v) for k, v in n.value)
            else:
                memo[key] = 1
        return memo[key]

    return size(node)


def load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, within the limits above.

    Raises ``YamlLimitError`` over a limit and ``yaml.YAMLError`` for invalid YAML."""
    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = expanded_size(node)
        if n > MAX_NODES:
            raise YamlLimitError(
                f"{n} YAML nodes once its aliases (*name) are expanded, more than the {MAX_NODES} allowed"
            )
        return loader.construct_document(node)
    except RecursionError:  # a limit above should come first; never let it escape bare
        raise YamlLimitError(f"nested too deeply to read (more than {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def load_file(path, kind: str) -> Any:
    """``load`` of a file, every problem as one ``ConfigError`` line naming the file:
    missing (``"{kind} file 'x' does not exist"``), over the limits, or not YAML."""
    from pathlib import Path

    import yaml

    from .errors import ConfigError

    path = Path(path)
    try:
        return load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{kind} file {str(path)!r} does not exist") from None
    except YamlLimitError as exc:
        raise ConfigError(f"{path}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
