"""Errors LightSpec raises for bad input; the CLI prints them as one line.

Bad arguments raise ``InvalidValueError`` (a ``ValueError``) or ``InvalidTypeError`` (a
``TypeError``), so callers may catch either the built-in exception or ``LightSpecError``."""


class LightSpecError(Exception):
    """A user-facing error: bad input, a bad configuration or a missing component."""


class InvalidValueError(LightSpecError, ValueError):
    """An argument or input has the right type but a value outside what is allowed."""


class InvalidTypeError(LightSpecError, TypeError):
    """An argument or input has a type that is not allowed."""


class PluginError(LightSpecError):
    """A plugin could not be loaded or registered."""


class ConfigError(LightSpecError, ValueError):
    """A strategy file or configuration value is invalid."""
