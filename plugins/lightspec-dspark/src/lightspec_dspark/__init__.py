"""lightspec-dspark: the LightSpec DSpark plugin: DeepSpec-format DSpark / DFlash block
drafters, their trainer, and adaptive verification for any drafter.

The plugin object LightSpec loads is the module ``lightspec_dspark.plugin``, named by the
entry point ``dspark`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
