"""lightspec-mtplayer: drafting with multi-token-prediction heads.

* strategy ``mtp``: DeepSeek-V3 / MiMo / GLM-style MTP modules read from the target's own
  checkpoint, or Medusa heads (FasterDecoding's and vLLM's formats) (``strategy.py``);
* ``lightspec mtplayer train``: trains either kind for a target (``train.py``, ``cli.py``).

The plugin object LightSpec loads is the module ``lightspec_mtplayer.plugin``, named by the
entry point ``mtplayer`` in the ``lightspec.plugins`` namespace.
"""

__version__ = "0.1.0"
