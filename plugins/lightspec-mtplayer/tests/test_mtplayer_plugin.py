"""lightspec-mtplayer is installed, discovered through the ``lightspec.plugins`` entry
point and registered without errors (it provides no strategies yet)."""

from importlib.metadata import entry_points

from lightspec_core.plugins import get_registry


def test_mtplayer_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "mtplayer"]
    assert len(eps) == 1, "lightspec-mtplayer is not installed (pip install -e plugins/lightspec-mtplayer)"
    assert eps[0].value == "lightspec_mtplayer.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-mtplayer"


def test_mtplayer_plugin_discovered(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "mtplayer" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["mtplayer"]
        assert info.distribution == "lightspec-mtplayer"
        assert info.version == "0.1.0"
        assert "lightspec_register_strategies" in info.hooks
        assert info.components == []  # scaffold: no placeholder strategies
        assert not [f for f in registry.failures if f.name == "mtplayer"]
    finally:
        get_registry(reload=True)
