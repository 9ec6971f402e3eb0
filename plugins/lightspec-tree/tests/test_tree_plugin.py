"""lightspec-tree is installed, discovered through the ``lightspec.plugins`` entry point and
registers its strategies, the tree budget and the tree_union fusion, each with its
parameters (``lightspec strategies``); the composer's union finds tree_union."""

import json
from importlib.metadata import entry_points

from click.testing import CliRunner
from lightspec_core.plugins import get_registry

COMPONENTS = ["strategy:static_tree", "strategy:dynamic_tree", "strategy:eagle3_tree", "budget:tree",
              "fusion:tree_union"]


def test_tree_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "tree"]
    assert len(eps) == 1, "lightspec-tree is not installed (pip install -e plugins/lightspec-tree)"
    assert eps[0].value == "lightspec_tree.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-tree"


def test_tree_plugin_registers_its_components(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "tree" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["tree"]
        assert info.distribution == "lightspec-tree"
        assert info.version == "0.1.0"
        assert "lightspec_register_strategies" in info.hooks
        assert sorted(info.components) == sorted(COMPONENTS)
        assert not [f for f in registry.failures if f.name == "tree"]
        assert registry.get("strategy", "dynamic_tree").params.keys() >= {"drafter", "depth", "top_k", "total_tokens",
                                                                          "adaptive"}
    finally:
        get_registry(reload=True)


def test_strategies_command_lists_the_parameters():
    from lightspec_core.cli import cli

    result = CliRunner().invoke(cli, ["strategies", "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["kind"], r["name"]): r for r in json.loads(result.output)}
    assert rows[("strategy", "static_tree")]["plugin"] == "tree"
    assert set(rows[("strategy", "static_tree")]["parameters"]) == {"choices", "drafter", "drafter_options", "adaptive"}
    assert "max_nodes" in rows[("budget", "tree")]["parameters"]
    assert ("fusion", "tree_union") in rows


def test_union_combination_builds_with_tree_union():
    from lightspec_core.strategy_files import build_strategy

    combo = build_strategy({"type": "combination", "kind": "union", "components": ["ngram", "draft_model"]},
                           get_registry())
    assert type(combo.fusion).__name__ == "TreeUnion"
