"""The ``mtplayer`` entry point of the ``lightspec.plugins`` namespace.

This package is a scaffold: it is installable and LightSpec discovers and loads it, but
it registers no strategy yet.  Its own issue will add multi-token-prediction (MTP) layer drafters: extra prediction layers on top of the target that propose the next tokens in parallel.
Until then ``lightspec plugins`` lists it with the hook below and no strategies.
"""

from __future__ import annotations

from lightspec_core import hookimpl


@hookimpl
def lightspec_register_strategies(register):
    """Register this plugin's components with ``register(name, factory, ...)``.

    Nothing is registered yet (scaffold): the package's own issue adds its strategies.
    """
