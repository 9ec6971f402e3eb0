"""lightspec-mtplayer is installed, discovered through the ``lightspec.plugins`` entry
point, registers the strategy ``mtp`` with its parameters and the command
``lightspec mtplayer train``."""

import json
from importlib.metadata import entry_points

from click.testing import CliRunner
from lightspec_core.cli import cli
from lightspec_core.plugins import get_registry


def test_mtplayer_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "mtplayer"]
    assert len(eps) == 1, "lightspec-mtplayer is not installed (pip install -e plugins/lightspec-mtplayer)"
    assert eps[0].value == "lightspec_mtplayer.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-mtplayer"


def test_mtplayer_plugin_registers_its_strategy_and_command(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "mtplayer" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["mtplayer"]
        assert info.distribution == "lightspec-mtplayer"
        assert info.version == "0.1.0"
        assert {"lightspec_register_strategies", "lightspec_register_commands"} <= set(info.hooks)
        assert info.components == ["strategy:mtp"]
        assert not [f for f in registry.failures if f.name == "mtplayer"]
        rows = json.loads(CliRunner().invoke(cli, ["strategies", "--json"]).output)
        [row] = [r for r in rows if r["name"] == "mtp"]
        assert row["plugin"] == "mtplayer" and set(row["parameters"]) == {"head", "max_draft"}
        out = CliRunner().invoke(cli, ["mtplayer", "train", "--help"]).output
        assert "--resume" in out and "--time-budget-s" in out and "--kind [mtp|medusa]" in out
    finally:
        get_registry(reload=True)
