"""lightspec-eagle3: the LightSpec EAGLE-3 plugin (a scaffold for now).

The plugin object LightSpec loads is the module ``lightspec_eagle3.plugin``, named by the
entry point ``eagle3`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
