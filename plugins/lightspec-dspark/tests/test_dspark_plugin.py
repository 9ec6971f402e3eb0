"""lightspec-dspark is installed, discovered through the ``lightspec.plugins`` entry
point and registered without errors, with its strategies, their parameters and its command."""

from importlib.metadata import entry_points

from lightspec_core.plugins import get_registry


def test_dspark_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "dspark"]
    assert len(eps) == 1, "lightspec-dspark is not installed (pip install -e plugins/lightspec-dspark)"
    assert eps[0].value == "lightspec_dspark.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-dspark"


def test_dspark_plugin_discovered(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "dspark" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["dspark"]
        assert info.distribution == "lightspec-dspark"
        assert info.version == "0.1.0"
        assert "lightspec_register_strategies" in info.hooks and "lightspec_register_commands" in info.hooks
        assert sorted(info.components) == ["strategy:adaptive", "strategy:dflash", "strategy:dspark"]
        assert set(registry.get("strategy", "dspark").params) == {"checkpoint", "max_draft"}
        assert set(registry.get("strategy", "adaptive").params) == {"drafter", "options", "max_width"}
        assert not [f for f in registry.failures if f.name == "dspark"]
    finally:
        get_registry(reload=True)
