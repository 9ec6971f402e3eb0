"""The ``dspark`` entry point of the ``lightspec.plugins`` namespace: the ``dspark`` / ``dflash``
drafting strategies, the ``adaptive`` verification wrapper and ``lightspec dspark train``.
Modules that import torch are imported inside the factories."""

from __future__ import annotations

from lightspec_core import hookimpl

DRAFT_PARAMS = {
    "checkpoint": "a DSpark/DFlash checkpoint: a folder or a hub id (default: --draft-model, else the zoo head for the zoo target)",
    "max_draft": "most tokens per block (default: the checkpoint's block_size)",
}


def _dspark(**options):
    from .strategy import DSparkStrategy

    return DSparkStrategy(**options)


def _dflash(**options):
    from .strategy import DFlashStrategy

    return DFlashStrategy(**options)


def _adaptive(**options):
    from .adaptive import AdaptiveStrategy

    return AdaptiveStrategy(**options)


@hookimpl
def lightspec_register_strategies(register):
    register("dspark", _dspark, params=DRAFT_PARAMS,
             description="DSpark block drafting: one parallel forward per block, Markov bias, confidence head (survival)")
    register("dflash", _dflash, params=DRAFT_PARAMS,
             description="DFlash block drafting: one parallel forward per block from the target's hidden states")
    register("adaptive", _adaptive,
             params={"drafter": "the drafting strategy to wrap: a name, or a mapping with 'type' and its options (dspark)",
                     "options": "the wrapped drafter's options (a mapping)",
                     "max_width": "widest verify forward timed at start-up, in draft tokens (16)"},
             description="adaptive verification for any drafter: keep the global top-K* nodes by survival, "
                         "K* maximising tokens per measured second")


@hookimpl
def lightspec_register_commands(cli):
    from .cli import dspark

    cli.add_command(dspark)
