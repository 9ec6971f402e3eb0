"""lightspec-tree: token-tree speculative decoding for LightSpec.

Strategies ``static_tree`` (Medusa-style choice lists) and ``dynamic_tree`` (EAGLE-2) over any
drafter that implements the tree expansion protocol (``expanders.py``), ``eagle3_tree``, the
``tree`` budget policy and the ``tree_union`` fusion for the composer's ``union``.  The plugin
object LightSpec loads is the module ``lightspec_tree.plugin``, named by the entry point
``tree`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
