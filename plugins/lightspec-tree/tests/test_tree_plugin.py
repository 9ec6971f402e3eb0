"""lightspec-tree is installed, discovered through the ``lightspec.plugins`` entry
point and registered without errors (it provides no strategies yet)."""

from importlib.metadata import entry_points

from lightspec_core.plugins import get_registry


def test_tree_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "tree"]
    assert len(eps) == 1, "lightspec-tree is not installed (pip install -e plugins/lightspec-tree)"
    assert eps[0].value == "lightspec_tree.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-tree"


def test_tree_plugin_discovered(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "tree" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["tree"]
        assert info.distribution == "lightspec-tree"
        assert info.version == "0.1.0"
        assert "lightspec_register_strategies" in info.hooks
        assert info.components == []  # scaffold: no placeholder strategies
        assert not [f for f in registry.failures if f.name == "tree"]
    finally:
        get_registry(reload=True)
