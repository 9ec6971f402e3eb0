"""The ``eagle3`` entry point of the ``lightspec.plugins`` namespace.

This package is a scaffold: it is installable and LightSpec discovers and loads it, but
it registers no strategy yet.  Its own issue will add an EAGLE-3 style drafter: a light autoregressive draft head that reads the target's hidden states from several layers (low, middle, high) and drafts tokens step by step.
Until then ``lightspec plugins`` lists it with the hook below and no strategies.
"""

from __future__ import annotations

from lightspec_core import hookimpl


@hookimpl
def lightspec_register_strategies(register):
    """Register this plugin's components with ``register(name, factory, ...)``.

    Nothing is registered yet (scaffold): the package's own issue adds its strategies.
    """
