"""lightspec-mtplayer: the LightSpec MTP layer plugin (a scaffold for now).

The plugin object LightSpec loads is the module ``lightspec_mtplayer.plugin``, named by the
entry point ``mtplayer`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
