"""Model limits read from Hugging Face configs (torch-free): how many positions a model
takes.  Argument checks (``MTPPipeline.generate``) and the engine both use it."""

from __future__ import annotations

from typing import Any

# Config attributes that hold the number of positions a model was built for, most common
# first: Llama/Mistral/Qwen/OPT/GPT-NeoX..., GPT-2 (and GPT-J), Bloom-style, ChatGLM/Baichuan,
# GPT-2's older alias, MPT.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                "max_seq_len")


def context_length(model_or_config: Any) -> int | None:
    """The context length (positions) of a model or of its config, or ``None`` when the
    config states none (e.g. relative-position or recurrent models).

    ``model_or_config``: a model with a ``.config`` (an HF ``PreTrainedModel``) or a
    config itself.  For multimodal configs the text model's config is read first
    (``get_text_config()``), then the top-level one; the first of ``CONTEXT_KEYS`` that
    holds a positive integer wins."""
    config = getattr(model_or_config, "config", model_or_config)
    candidates = []
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            candidates.append(get_text())
        except Exception:  # a config that cannot resolve its text part: read the top level only
            pass
    candidates.append(config)
    for cfg in candidates:
        for key in CONTEXT_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
