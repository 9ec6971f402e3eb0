"""lightspec-kernels: Triton kernels with PyTorch references for speculative decoding.

Every public function dispatches to Triton for CUDA tensors and to its PyTorch
reference otherwise; ``LIGHTSPEC_KERNELS=torch|triton`` forces one backend.  The
``*_ref`` functions (references) and ``*_triton`` functions (kernels, no dispatch) are
exported too.
"""

from ._common import HAS_TRITON, backend_for
from .chain import chain_verify, chain_verify_triton
from .chain_verify_ref import chain_verify_ref
from .confidence import ConfidenceStats, confidence_stats, confidence_stats_ref, confidence_stats_triton
from .kv_compact import (
    compact_kv,
    compact_kv_layers,
    compact_kv_layers_ref,
    compact_kv_layers_triton,
    compact_kv_ref,
    compact_kv_triton,
)
from .tree import TreeVerifyResult, check_tree, tree_verify, tree_verify_ref, tree_verify_triton
from .tree_mask import tree_attention_mask, tree_attention_mask_ref, tree_attention_mask_triton

__version__ = "0.1.0"

__all__ = [
    "HAS_TRITON",
    "backend_for",
    "ConfidenceStats",
    "confidence_stats",
    "confidence_stats_ref",
    "confidence_stats_triton",
    "chain_verify",
    "chain_verify_ref",
    "chain_verify_triton",
    "TreeVerifyResult",
    "check_tree",
    "tree_verify",
    "tree_verify_ref",
    "tree_verify_triton",
    "compact_kv",
    "compact_kv_ref",
    "compact_kv_triton",
    "compact_kv_layers",
    "compact_kv_layers_ref",
    "compact_kv_layers_triton",
    "tree_attention_mask",
    "tree_attention_mask_ref",
    "tree_attention_mask_triton",
]
