"""lightspec-example-plugin: an example third-party LightSpec plugin (see ``plugin.py``)."""

__version__ = "0.1.0"
