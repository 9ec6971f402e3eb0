"""LightSpec's CPU attention kernel as a transformers attention implementation.

``lightspec_kernels.cpu_attention`` computes the attention of a few new tokens over a KV
cache in a fraction of the time PyTorch's CPU ``scaled_dot_product_attention`` takes at
decoding shapes (zoo target, one token over 400 cached: ~115 us per layer through SDPA).
It rounds differently from SDPA, and the target's lean forward must compute exactly what
the model's own forward computes, so the kernel is installed *in the model*: registered
with transformers as the attention implementation ``"lightspec_cpu"`` (with SDPA's mask
format), and selected on a model with ``use_cpu_attention``.  Then HF's forward (and so
HF's ``generate`` on the same model, in ``lightspec bench``) and LightSpec's lean forward
both run it, on the same inputs, and get the same numbers.

Calls the kernel does not cover (not float32 on the CPU, dropout, soft-capping, attention
sinks, position biases, attention weights requested) go to transformers' SDPA function.
"""

from __future__ import annotations

import os

import torch
from lightspec_kernels import cpu_attention
from torch import nn

NAME = "lightspec_cpu"
_F32 = torch.float32
_registered = False


def lightspec_cpu_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, q, D]``, ``key/value
    [B, H_kv, cols, D]``, SDPA's mask (bool/float ``[B, 1, q, cols]`` or ``None``) →
    ``([B, q, H, D], None)``."""
    if (query.dtype is not _F32 or not query.is_cpu or dropout or kwargs.get("softcap") is not None
            or kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions") or not cpu_attention.available()
            or os.environ.get("LIGHTSPEC_KERNELS") == "torch"):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len = query.shape[2]
    if attention_mask is None and causal and 1 < q_len < key.shape[2]:
        # what HF's SDPA path does here (a prefill into an empty static cache): causal from
        # the first column, keys beyond the queries dropped
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = cpu_attention.attention_cpu(query, key, value, attention_mask, scaling, causal=causal and attention_mask is None)
    return out, None


def register() -> None:
    """Register ``"lightspec_cpu"`` with transformers (attention function and mask format)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, lightspec_cpu_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


def use_cpu_attention(model: nn.Module) -> bool:
    """Switch ``model`` from SDPA to ``"lightspec_cpu"`` when the kernel runs here; returns
    whether it did.  Models on another implementation (eager, flash, ...) keep it."""
    config = getattr(model, "config", None)
    if (config is None or getattr(config, "_attn_implementation", None) != "sdpa" or not cpu_attention.available()
            or os.environ.get("LIGHTSPEC_KERNELS") == "torch"):
        return False
    register()
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError):
        return False
    return getattr(config, "_attn_implementation", None) == NAME


def uses_cpu_attention(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
