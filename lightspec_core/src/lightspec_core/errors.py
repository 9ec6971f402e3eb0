"""Errors LightSpec raises for bad input; the CLI prints them as one line."""


class LightSpecError(Exception):
    """A user-facing error: bad input, a bad configuration or a missing component."""


class PluginError(LightSpecError):
    """A plugin could not be loaded or registered."""


class ConfigError(LightSpecError):
    """A strategy file or configuration value is invalid."""
