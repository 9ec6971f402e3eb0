"""Resolving a pipeline's components to the plain callables the engine calls (``bind``):
hook dispatch happens once, when the pipeline is built, never per token."""

from __future__ import annotations

from .engine import BoundStrategy
from .errors import LightSpecError
from .plugins import get_registry, new_plugin_manager


def bind(name: str, strategy, verifier, budget, sinks: list) -> BoundStrategy:
    """Resolve the per-step hooks of the pipeline's components to plain callables.  A
    strategy without ``lightspec_propose`` never asks its budget policy, so the policy is
    not fed statistics either (its learning would only slow every step)."""
    pm = new_plugin_manager()
    propose = getattr(strategy, "lightspec_propose", None)
    objects = [strategy, verifier, *([budget] if propose is not None else []), *sinks]
    for i, obj in enumerate(objects):
        pm.register(obj, name=f"{i}:{getattr(obj, 'name', type(obj).__name__)}")
    for plugin in get_registry().pm.get_plugins():  # global plugins may be stats sinks too
        if hasattr(plugin, "lightspec_on_stats") and pm.get_name(plugin) is None:
            pm.register(plugin)
    pm.check_pending()

    sink_impls = list(reversed(pm.hook.lightspec_on_stats.get_hookimpls()))
    on_stats = [impl.function for impl in sink_impls]
    verify = getattr(verifier, "lightspec_verify", None)
    budget_fn = getattr(budget, "lightspec_budget", None)
    if verify is None:
        raise LightSpecError(f"verifier {getattr(verifier, 'name', verifier)!r} does not implement lightspec_verify")
    if budget_fn is None:
        raise LightSpecError(f"budget policy {getattr(budget, 'name', budget)!r} does not implement lightspec_budget")
    return BoundStrategy(
        name=name,
        propose=propose,
        verify=verify,
        budget=budget_fn,
        sinks=on_stats,
        resets=[obj.reset for obj in objects if callable(getattr(obj, "reset", None))],
        hidden_layers=list(getattr(strategy, "hidden_layers", []) or []),
        draft_cost_hints=hints if callable(hints := getattr(strategy, "draft_cost_hints", None)) else None,
        sink_names=[impl.plugin_name for impl in sink_impls],
    )
