"""Store a model's Linear weights column-major on the CPU, for faster small-batch steps.

``nn.Linear`` keeps its weight as ``[out, in]`` row-major and computes ``x @ W.T``: on the
CPU the BLAS then multiplies by a transposed operand.  Holding the same values as a
``[in, out]`` row-major buffer viewed as ``[out, in]`` (``W.t().contiguous().t()``) makes
``x @ W.T`` a plain product.  Measured on the 2-core VM (fp32, 1 thread, median):

=============  ==========================  =============================
rows (tokens)  zoo target's projections     lm_head 384 x 8192
=============  ==========================  =============================
1              1.3-3x faster                1.06x
8              1.35-1.5x                    2.2x
64-2400        0.8-1.2x (noise level)       0.8-1.1x
=============  ==========================  =============================

so a one-token decode step and a verify over a few tokens gain (end to end at batch 1, in lockstep:
7-12% more tokens/s for the zoo target, HF's own ``generate`` on the same model alike),
while prefill is unchanged.  The values are the same; only the summation order inside
the BLAS differs (|diff| ~ 1e-5 in the logits), so the model is changed once, when
LightSpec loads it, and every method that runs on it (LightSpec, and HF's ``generate`` in
``lightspec bench``) sees the same numerics.  Tied weights stay tied.
"""

from __future__ import annotations

import torch
from torch import nn


def is_column_major(weight: torch.Tensor) -> bool:
    """True for a 2-D tensor stored as its transpose's row-major buffer."""
    return weight.dim() == 2 and weight.stride(0) == 1 and weight.stride(1) == weight.shape[0] and weight.shape[0] > 1


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` with the same values, stored column-major (``[in, out]`` buffer)."""
    return weight if is_column_major(weight) else weight.t().contiguous().t()


def use_cpu_layout(model: nn.Module) -> int:
    """Re-store every ``nn.Linear`` weight of ``model`` column-major, in place; returns how
    many weights were re-stored.  An embedding tied to the lm_head keeps sharing it (its
    row look-ups read a strided view: a few tokens per step).  Meant for CPU inference: a
    GPU's BLAS takes either layout at full speed, so there it is left alone."""
    new: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in new:
            w = module.weight
            if is_column_major(w):
                continue
            new[id(w)] = nn.Parameter(column_major(w.detach()), requires_grad=w.requires_grad)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and id(module.weight) in new:
            module.weight = new[id(module.weight)]
    return len(new)
