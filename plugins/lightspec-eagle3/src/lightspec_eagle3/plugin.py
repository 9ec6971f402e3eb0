"""The ``eagle3`` entry point of the ``lightspec.plugins`` namespace: the strategy ``eagle3``
(an EAGLE-3 head drafting a chain, with the tree-expansion calls lightspec-tree uses) and
the command ``lightspec eagle3 train``.  Nothing heavy is imported until a strategy is built
or a command runs."""

from __future__ import annotations

from lightspec_core import hookimpl

PARAMS = {
    "head": "EAGLE-3 head (public format): a folder or a hub id; 'auto' (default): --draft-model when it is an EAGLE-3 head, "
            "else the zoo's head for the zoo target",
    "max_draft": "most tokens per draft (8)",
    "top_k_probs": "sampling: report the draft distribution as its top-k (0, default: the whole draft vocabulary)",
}


def _eagle3(**options):
    from .drafter import Eagle3Drafter

    return Eagle3Drafter(**options)


@hookimpl
def lightspec_register_strategies(register):
    register("eagle3", _eagle3, description="EAGLE-3 head over the target's hidden states: a chain with its own KV cache",
             params=PARAMS)


@hookimpl
def lightspec_register_commands(cli):
    from .cli import eagle3

    cli.add_command(eagle3)
