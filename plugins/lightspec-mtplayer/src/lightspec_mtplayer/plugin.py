"""The ``mtplayer`` entry point of the ``lightspec.plugins`` namespace.

Registers the strategy ``mtp`` (MTP modules from the target's own checkpoint, or Medusa
heads; ``strategy.py``) and the command ``lightspec mtplayer train`` (``cli.py``).
"""

from __future__ import annotations

from lightspec_core import hookimpl


@hookimpl
def lightspec_register_strategies(register):
    from .strategy import PARAMS, MTPStrategy

    register("mtp", MTPStrategy, description="Draft with the target's MTP modules (DeepSeek/MiMo/GLM) or Medusa heads",
             params=PARAMS)


@hookimpl
def lightspec_register_commands(cli):
    from .cli import mtplayer

    cli.add_command(mtplayer)
