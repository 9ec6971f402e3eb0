"""The ``mtplayer`` entry point of the ``lightspec.plugins`` namespace.

Registers the strategy ``mtp`` (MTP modules from the target's own checkpoint, or Medusa
heads; ``strategy.py``) and the command ``lightspec mtplayer train`` (``cli.py``).
"""

from __future__ import annotations

from lightspec_core import hookimpl

# kept here, not in strategy.py, so that loading the plugin (``lightspec --help``) does not import torch
PARAMS = {
    "head": "'auto' (the target's own MTP modules, else the zoo's heads for the zoo target) or a folder or hub id of "
            "MTP modules or Medusa heads",
    "max_draft": "most tokens per draft (4; Medusa: at most its number of heads)",
}


def _mtp(**options):
    from .strategy import MTPStrategy

    return MTPStrategy(**options)


@hookimpl
def lightspec_register_strategies(register):
    register("mtp", _mtp, description="Draft with the target's MTP modules (DeepSeek/MiMo/GLM) or Medusa heads",
             params=PARAMS)


@hookimpl
def lightspec_register_commands(cli):
    from .cli import mtplayer

    cli.add_command(mtplayer)
