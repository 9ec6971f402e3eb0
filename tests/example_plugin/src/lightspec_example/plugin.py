"""The ``example`` plugin: the ``repeat_last`` drafter, a statistics sink and a CLI command.

LightSpec loads this module through the entry point ``example`` of the
``lightspec.plugins`` namespace and registers it with its pluggy manager.  Module-level
functions named ``lightspec_*`` and marked ``@hookimpl`` are its hook implementations.

Nothing heavy is imported at module level: plugins are loaded when ``lightspec`` starts
(``--help`` must stay fast), so torch is imported inside the methods that need it.
"""

from __future__ import annotations

from lightspec_core import hookimpl

#: running totals of every step event this process saw (the ``lightspec_on_stats`` sink)
STATS = {"steps": 0, "drafted": 0, "accepted": 0, "emitted": 0}


class RepeatLast:
    """Draft the last ``n`` tokens again: guess that the context repeats with period ``n``.

    Row b's draft is ``seq[-n], seq[-n+1], ..., seq[-1], seq[-n], ...`` up to
    ``min(max_draft, ctx.max_draft_list[b])`` tokens.  It has no probabilities, so the
    verifier treats the draft as one-hot (lossless under greedy and sampling alike).
    """

    name = "repeat_last"

    def __init__(self, n: int = 1, max_draft: int = 4):
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"n={n!r} is invalid: use an integer >= 1")
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        self.n = n
        self.max_draft = max_draft

    def reset(self) -> None:
        """Called before each ``generate()``; this drafter keeps no state."""

    @hookimpl
    def lightspec_propose(self, ctx):
        import torch

        from lightspec_core import DraftProposal

        drafts = []
        for b, seq in enumerate(ctx.sequences):
            if ctx.prefix is not None and int(ctx.prefix_lengths[b]) > 0:  # in a cascade: continue the draft
                seq = seq + ctx.prefix[b, : int(ctx.prefix_lengths[b])].tolist()
            k = min(self.max_draft, ctx.max_draft_list[b])  # never more than the budget allows
            if k <= 0 or len(seq) < self.n:
                drafts.append([])
                continue
            tail = seq[-self.n:]
            drafts.append([tail[i % self.n] for i in range(k)])
        width = max(len(d) for d in drafts)
        if width == 0:
            return None  # no draft this step: the engine decodes one token plainly
        tokens = torch.zeros(len(drafts), width, dtype=torch.long)
        for b, d in enumerate(drafts):
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
        lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        return DraftProposal(tokens=tokens.to(ctx.device), lengths=lengths.to(ctx.device), source=self.name)


@hookimpl
def lightspec_register_strategies(register):
    register(
        "repeat_last",
        RepeatLast,
        description="draft the last n tokens again (period-n repetition guess, no model)",
        params={"n": "how many trailing tokens to repeat (1)", "max_draft": "most tokens per draft (4)"},
    )


@hookimpl
def lightspec_on_stats(event):
    """A statistics sink: adds every step event to ``STATS``."""
    if getattr(event, "kind", None) != "step":
        return
    STATS["steps"] += 1
    STATS["drafted"] += sum(event.drafted)
    STATS["accepted"] += sum(event.accepted)
    STATS["emitted"] += sum(event.emitted)


@hookimpl
def lightspec_register_commands(cli):
    import click

    @click.command("example-hello")
    @click.option("--name", default="world", show_default=True, help="Who to greet.")
    def example_hello(name):
        """Say hello from the example plugin."""
        click.echo(f"hello {name} from lightspec-example {_version()}")

    cli.add_command(example_hello)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightspec-example-plugin")
    except PackageNotFoundError:
        return "(not installed)"
