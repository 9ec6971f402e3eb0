"""LightSpec core: training-free, model-agnostic speculative decoding for HF causal LMs.

Only the torch-free pieces are imported eagerly, so ``lightspec --help`` stays fast.
"""

from .errors import ConfigError, InvalidTypeError, InvalidValueError, LightSpecError, PluginError
from .hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "MTPPipeline": "pipeline",
    "GenerationResult": "pipeline",
    # the drafting / verification API
    "DraftProposal": "interfaces",
    "SparseProbs": "interfaces",
    "VerifyResult": "interfaces",
    "Budget": "interfaces",
    "StepContext": "interfaces",
    "StepTimer": "interfaces",
    "RowHistory": "interfaces",
    "StepStats": "stats",
    "RequestSummary": "stats",
    "TargetRunner": "runner",
    "TargetOutput": "runner",
    "StandardVerifier": "verify",
    # model tools for drafters: a KV cache for ragged rows, a fast Llama-family forward, model parts
    "KVCache": "kvcache",
    "takes_logits_to_keep": "kvcache",
    "LeanDecoder": "lean_decoder",
    "lean_forward": "lean_decoder",
    "HiddenCapture": "model_parts",
    "decoder_layers": "model_parts",
    "early_exit_view": "model_parts",
    "final_norm": "model_parts",
    "num_layers": "model_parts",
    "choose_exit_layer": "model_parts",
    "SamplingParams": "sampling",
    "warp_logits": "sampling",
    "warped_probs": "sampling",
    "exponential_noise": "sampling",
    "sample_inverse_cdf": "sampling",
    "row_uniforms": "sampling",
    "get_registry": "plugins",
    "context_length": "limits",
    # a checkpoint's folder from a local path or a hub id (drafters that read their own files)
    "model_folder": "hub",
    # loading a target the way the pipeline does (one error line per bad input), for trainers
    "load_model": "loading",
    "load_tokenizer": "loading",
}

__all__ = ["hookimpl", "LightSpecError", "InvalidValueError", "InvalidTypeError", "ConfigError", "PluginError", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'lightspec_core' has no attribute {name!r}")
