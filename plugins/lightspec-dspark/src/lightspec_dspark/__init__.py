"""lightspec-dspark: the LightSpec DSpark plugin (a scaffold for now).

The plugin object LightSpec loads is the module ``lightspec_dspark.plugin``, named by the
entry point ``dspark`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
