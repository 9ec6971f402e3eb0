"""The plugin boundary holds: the built-in strategies, the composer and the public-API test
drafters import only ``lightspec_core``'s exported names (never a private name of another
module), reach into no other object's private attributes, and the engine special-cases no
component type."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lightspec_core

CORE = Path(lightspec_core.__file__).parent
PUBLIC = set(lightspec_core.__all__)
CHECKED = sorted((CORE / "strategies").glob("*.py")) + [CORE / "composer.py",
                                                        Path(__file__).parent / "public_api_drafters.py"]


def _core_imports(tree: ast.AST, path: Path):
    """(module, name) of every name imported from lightspec_core or one of its modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            from_core = (node.level > 0 and CORE in path.parents) or (node.module or "").startswith("lightspec_core")
            if from_core:
                for alias in node.names:
                    yield node.module or ".", alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightspec_core."):
                    yield alias.name, "*module*"


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.name)
def test_only_public_names_are_imported(path):
    tree = ast.parse(path.read_text())
    bad = [(m, n) for m, n in _core_imports(tree, path)
           if n == "*module*" or n.startswith("_") or (n not in PUBLIC and n != "hookimpl" and m != "strategies")]
    assert not bad, f"{path.name} imports names outside lightspec_core's public API: {bad}"


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.name)
def test_no_private_attribute_of_another_object_is_used(path):
    tree = ast.parse(path.read_text())
    bad = [f"line {n.lineno}: .{n.attr}" for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
           and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
           and not (isinstance(n.value, ast.Call) and getattr(n.value.func, "id", None) == "super")]
    assert not bad, f"{path.name} reads private attributes of other objects: {bad}"


def test_the_engine_does_not_special_case_component_types():
    """No component class is named in the engine (no ``type(x) is StandardVerifier``), and no
    component is picked by its position in a list (``components[1]``)."""
    from lightspec_core import builtins

    names = {"StandardVerifier", "NgramDrafter", "ModelDrafter", "LayerSkipDrafter", "PlainDecoding", "Combination",
             "HybridStrategy", "DynamicBudget", "StaticBudget", "FeedbackBudget", "FirstFusion", "ConcatFusion"}
    for module in ("engine.py", "engine_parts.py", "runner.py"):
        tree = ast.parse((CORE / module).read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
               {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not used & names, f"{module} names component classes: {used & names}"
        assert "components" not in used, f"{module} reaches into a strategy's components"
    assert builtins  # the built-ins are registered through the same hook as any plugin
