"""lightspec-tree: the LightSpec token tree plugin (a scaffold for now).

The plugin object LightSpec loads is the module ``lightspec_tree.plugin``, named by the
entry point ``tree`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
