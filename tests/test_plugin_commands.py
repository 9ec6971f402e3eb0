"""A plugin whose ``lightspec_register_commands`` raises (``SystemExit`` included) is
reported and skipped; the other plugins' commands still register; strict mode fails with
one clear error."""

from __future__ import annotations

import click
import pytest
from lightspec_core.plugins import PluginRegistry

from lightspec_core import PluginError, hookimpl


class Exits:
    @hookimpl
    def lightspec_register_commands(self, cli):
        raise SystemExit(0)


class Good:
    @hookimpl
    def lightspec_register_commands(self, cli):
        cli.add_command(click.Command("hello", callback=lambda: None))


def test_hook_register_commands_system_exit_is_reported_and_skipped():
    reg = PluginRegistry()
    reg.add_plugin(Exits(), "exits", "lightspec-exits", "0.1")
    reg.add_plugin(Good(), "good", "lightspec-good", "0.1")
    group = click.Group("lightspec")
    reg.register_commands(group)
    assert "hello" in group.commands
    [failure] = reg.failures
    assert failure.name == "exits" and "SystemExit" in failure.error


def test_hook_register_commands_failure_is_fatal_in_strict_mode():
    reg = PluginRegistry()
    reg.add_plugin(Exits(), "exits", "lightspec-exits", "0.1")
    with pytest.raises(PluginError, match="exits.*strict"):
        reg.register_commands(click.Group("lightspec"), strict=True)
