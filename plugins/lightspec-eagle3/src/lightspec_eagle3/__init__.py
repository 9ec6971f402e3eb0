"""lightspec-eagle3: EAGLE-3 draft heads for LightSpec.

* ``load_head(folder, target)`` reads a head in any public layout (EAGLE reference code,
  SpecForge, vLLM / SGLang, speculators) and checks that it fits the target;
* the strategy ``eagle3`` (``Eagle3Drafter``) drafts chains, and offers the tree-expansion
  calls lightspec-tree's ``eagle3_tree`` uses;
* ``lightspec eagle3 train`` trains a head for any HF causal LM.

The plugin object LightSpec loads is the module ``lightspec_eagle3.plugin`` (entry point
``eagle3`` in the ``lightspec.plugins`` namespace).  torch is imported only by the submodules.
"""

__version__ = "0.1.0"
