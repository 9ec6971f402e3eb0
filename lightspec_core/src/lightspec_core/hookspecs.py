"""The LightSpec hook specifications (pluggy project name ``lightspec``).

Two families of hooks:

* **Registration hooks** run once, when plugins are loaded: they add strategies,
  verifiers, budget policies, fusion rules, statistics sinks and CLI commands.
* **Per-step hooks** (``propose``, ``verify``, ``fuse``, ``budget``, ``on_stats``) are
  implemented by the *component objects* a pipeline is built from.  A pipeline resolves
  them to plain callables once, when it is built, and the decode loop calls those
  directly: there is no hook dispatch per token.  Because of that, per-step hooks cannot
  be hook wrappers; declaring one is an error at load time.

``docs/hooks.md`` documents every hook with a runnable example.
"""

from __future__ import annotations

import pluggy

PROJECT = "lightspec"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

PER_STEP_HOOKS = ("lightspec_propose", "lightspec_verify", "lightspec_fuse", "lightspec_budget", "lightspec_on_stats")


# --- registration hooks ---------------------------------------------------------------


@hookspec
def lightspec_register_strategies(register):
    """Register components.  Called once per plugin when plugins are loaded; every
    implementation is called (results are ignored).

    ``register(name, factory, *, kind="strategy", description="", params=None)``:
    ``factory(**options)`` returns the component object; ``kind`` is one of
    ``strategy``, ``verifier``, ``budget``, ``fusion``, ``sink``; ``params`` maps
    option names to one-line descriptions (shown by ``lightspec strategies``).
    Two components of one kind with the same name are an error naming both plugins.
    """


@hookspec
def lightspec_register_commands(cli):
    """Add subcommands to the ``lightspec`` click group ``cli`` (``cli.add_command``).
    Every implementation is called once, when the CLI starts."""


# --- per-step hooks (implemented by component objects) --------------------------------


@hookspec(firstresult=True)
def lightspec_propose(ctx):
    """Draft tokens for the active rows.

    ``ctx`` is a ``StepContext``.  Return a ``DraftProposal`` (node tokens ``[B, N]``,
    ``lengths [B]`` with ``lengths[b] <= ctx.max_draft_list[b]``, optional ``parents [B, N]``
    for a token tree, optional draft probabilities ``[B, N, V]`` or ``SparseProbs``) or
    ``None`` for "no draft this step".  firstresult: the strategy's implementation is used.
    """


@hookspec(firstresult=True)
def lightspec_verify(ctx, proposal, output):
    """Decide which drafted nodes to keep.

    ``output`` is the target's ``TargetOutput`` over slots ``[B, N+1]``: slot 0 of a row is
    its last committed token, slot ``1 + i`` its node i; ``output.logits_at`` /
    ``output.argmax_at`` compute the lm_head only at the slots asked for, ``output.logits``
    all of them.  Return a ``VerifyResult`` (``accepted [B]``, ``emitted [B, N+1]`` padded
    with -1: the kept nodes' tokens then one corrected/bonus token; ``path [B, N]``: the
    kept node indices, required for trees).  firstresult.
    """


@hookspec(firstresult=True)
def lightspec_fuse(ctx, proposals):
    """Combine several drafters' ``proposals`` (a list of ``DraftProposal`` or None, one
    per component, in component order) into one ``DraftProposal``.  firstresult."""


@hookspec(firstresult=True)
def lightspec_budget(ctx):
    """Decide how much to draft this step: return a ``Budget`` (``max_draft [B]`` int64,
    ``min_confidence [B]`` float, optional ``reason`` and ``estimates`` for the statistics).
    firstresult."""


@hookspec
def lightspec_on_stats(event):
    """Receive one ``StepStats`` event per decode step (``event.kind == "step"``) and one
    ``RequestSummary`` when a request finishes (``event.kind == "request"``).  Every sink
    is called, in registration order; results ignored.  A sink that raises is reported and
    skipped for a while; it never stops the generation."""
