"""The core's built-in components, registered through the same hook as any plugin.

Factories are lazy (``module:Class`` paths imported on first use) so that listing
components — and ``lightspec --help`` — does not import torch.
"""

from __future__ import annotations

import importlib

from .hookspecs import hookimpl


def lazy(path: str):
    """A factory that imports ``package.module:Class`` when first called."""
    module, _, attr = path.partition(":")

    def factory(**options):
        return getattr(importlib.import_module(module, __package__), attr)(**options)

    factory.__qualname__ = factory.__name__ = attr
    return factory


def _hybrid(**options):
    from .composer import HybridStrategy
    from .plugins import get_registry

    return HybridStrategy(get_registry(), **options)


@hookimpl
def lightspec_register_strategies(register):
    register("none", lazy(".strategies.plain:PlainDecoding"), description="plain autoregressive decoding (the baseline)", params={})
    register(
        "ngram",
        lazy(".strategies.ngram:NgramDrafter"),
        description="prompt/suffix n-gram lookup over the whole context (no model)",
        params={"min_ngram": "shortest n-gram to match (1)", "max_ngram": "longest n-gram to match (4)", "max_draft": "most tokens per draft (16)",
                "min_accept": "cut a draft where its estimated chance of full acceptance, learned per match class, falls below this (0.2)"},
    )
    register(
        "draft_model",
        lazy(".strategies.model_drafter:ModelDrafter"),
        description="a smaller causal LM with the same tokenizer (--draft-model PATH)",
        params={"max_draft": "most tokens per draft (8)",
                "lean": "draft through lean_decoder when the architecture allows (true); false: the HF forward",
                "token_map": "draft only among these token ids plus the request's own: 'auto' (the draft folder's "
                             "token_map.json, if any), 'none', or a JSON file path",
                "max_context": "the draft model sees only the last N prompt tokens (128); 0: the whole prompt",
                "batch_context": "and the batch's prompt tails together hold at most N tokens, 16 per row at least "
                                 "(256: 32 per row at batch 8); 0: no batch-wide limit. Greedy only: a sampled "
                                 "row sees its last max_context prompt tokens, so its seeded text does not "
                                 "depend on its batch"},
    )
    register(
        "layerskip",
        lazy(".strategies.model_drafter:LayerSkipDrafter"),
        description="self-speculation with the target's first L layers + final norm + lm_head",
        params={"layers": "exit layer L, or 'auto' (default)", "max_draft": "most tokens per draft (6)",
                "lean": "draft through lean_decoder when the architecture allows (true); false: the HF forward"},
    )
    register(
        "hybrid",
        _hybrid,
        description="n-gram lookup extended by the draft model (or layer skip): the composer's cascade",
        params={
            "switch_threshold": "switch: route to n-gram when its acceptance >= this (0.5)",
            "max_draft": "most tokens per model draft (8)",
            "ngram_max_draft": "most tokens per n-gram draft (16)",
            "kind": "cascade (default: the model extends the n-gram draft) or switch (route per row and step)",
        },
    )
    register("standard", lazy(".verify:StandardVerifier"), kind="verifier", description="greedy match / lossless rejection sampling", params={})
    register(
        "dynamic",
        lazy(".budget:DynamicBudget"),
        kind="budget",
        description="cost-aware draft length from online acceptance + adaptive confidence stop",
        params={
            "max_draft": "upper bound on k (8)",
            "window": "sliding window of verifies for the confidence gate (peak probability, entropy, acceptance) (16)",
            "min_confidence": "initial confidence threshold (0.3)",
            "beta": "initial verify cost slope per token (0.12)",
            "draft_cost": "initial cost of one draft token vs a target step (0.05; a batch starts from each drafter's draft_cost_hints())",
            "decay": "per-step decay of the acceptance counts (0.9)",
            "guard": "throughput guard: decode plainly for a while when speculation measured slower (true)",
            "batch_margin": "with several rows, draft only for a modelled gain of at least this factor (1.15); raised per kind of batch by generations that lost end to end",
            "free_max_draft": "a single row that speculates lets model-free drafters (n-gram) draft up to this many tokens, cut by their own estimate (16; 0: k for all)",
            "explore_after": "a single row that chose plain decoding this many times in a row drafts one token to measure again, the interval doubling to 1024 while it keeps choosing plain decoding (0: never, the default; 64 was measured)",
        },
    )
    register("static", lazy(".budget:StaticBudget"), kind="budget", description="always draft k tokens", params={"k": "draft length (4)"})
    register(
        "feedback",
        lazy(".budget:FeedbackBudget"),
        kind="budget",
        description="feedback controller B <- alpha*B + beta*(measured speed-up over plain decoding); drafts round(B)",
        params={
            "alpha": "weight of the previous B, in [0, 1) (0.5)",
            "beta": "weight of the step's speed-up T_actual/T_target, > 0 (1.0; B settles at beta*r/(1-alpha))",
            "max_draft": "upper bound on B and k (8)",
            "min_ratio": "hold plain decoding when the speed-up's EWMA stays below this (0.9; 0: never)",
            "patience": "speculative steps below min_ratio before holding (8)",
            "hold": "plain steps per hold before probing again (32)",
            "calibration": "plain steps measuring a batch size's plain latency when first seen (3)",
            "refresh": "one plain step after this many speculative steps in a row (32)",
            "min_confidence": "confidence threshold passed to model drafters (0.0: draft k tokens)",
        },
    )
    register("first", lazy(".composer:FirstFusion"), kind="fusion", description="per row, the first non-empty draft", params={})
    register("concat", lazy(".composer:ConcatFusion"), kind="fusion", description="per row, drafts one after another", params={})
    register("jsonl", lazy(".stats:JsonlSink"), kind="sink", description="one JSON line per event", params={"path": "output file"})
    register("log", lazy(".stats:LogSink"), kind="sink", description="periodic 'SpecDecoding metrics' log line", params={"interval_s": "seconds between lines (5)"})
