"""LightSpec's fused CPU RMSNorm installed in a model's norm modules.

``lightspec_kernels.cpu_norm_rope.rms_norm`` does in one call what HF's Llama-family
``RMSNorm.forward`` does in eight tensor ops.  It sums in its own order, and the target's
lean forward must compute exactly what the model's forward computes, so the kernel goes
*into the model*, like the packed linears (``weight_layout``) and the attention
(``hf_attention``): ``use_cpu_norms`` swaps each RMSNorm module for a ``KernelRMSNorm``
with the same parameter, and HF's forward, HF's ``generate`` and LightSpec's lean forward
then all run the same code.

A norm module is swapped only when a probe shows the kernel computes its function: the
kernel's output on random inputs must match the module's own to float32 rounding (Gemma's
``(1 + weight)`` norm, say, fails the probe and keeps its module).
"""

from __future__ import annotations

import torch
from lightspec_kernels import cpu_norm_rope
from torch import nn

_F32 = torch.float32


class KernelRMSNorm(nn.Module):
    """An RMSNorm whose float32 CPU forward (without autograd) runs the fused kernel; any
    other call runs the original class's forward.  ``weight`` is the original parameter."""

    def __init__(self, norm: nn.Module, eps: float):
        super().__init__()
        self.train(norm.training)  # the mode of the module it replaces, not nn.Module's default
        self.weight = norm.weight
        self.variance_epsilon = eps
        self.original_forward = type(norm).forward  # a function, not a module: no second copy of the weight
        self.original_class = type(norm).__name__
        self.kernel = cpu_norm_rope.bind_rms_norm(self.weight, eps)  # the same kernel as the lean forward's

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("kernel", None)  # a closure over raw pointers: rebuilt on load
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.kernel = cpu_norm_rope.bind_rms_norm(self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, kernel (was {self.original_class})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dtype is _F32 and x.is_cpu and w.dtype is _F32 and w.is_cpu
                and not (w.requires_grad and torch.is_grad_enabled())):
            return self.kernel(x)
        return self.original_forward(self, x)


def _eps(norm: nn.Module) -> float | None:
    for attr in ("variance_epsilon", "eps"):
        value = getattr(norm, attr, None)
        if isinstance(value, float):
            return value
    return None


def _computes_rms_norm(norm: nn.Module, eps: float) -> bool:
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.dtype != torch.float32 or w.device.type != "cpu":
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, w.shape[0], generator=gen) * 3
    with torch.no_grad():
        try:
            theirs = norm(x)
        except Exception:
            return False
        mine = cpu_norm_rope.rms_norm(x, w, eps)
    return theirs.shape == mine.shape and torch.allclose(theirs, mine, rtol=1e-5, atol=1e-6)


def use_cpu_norms(model: nn.Module) -> int:
    """Swap every float32 CPU RMSNorm module of ``model`` that the kernel reproduces (probe
    above) for a ``KernelRMSNorm``, in place; returns how many.  Nothing happens where the
    kernel cannot run."""
    if not cpu_norm_rope.available():
        return 0
    swapped: dict[int, KernelRMSNorm] = {}
    rejected: set[int] = set()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, KernelRMSNorm) or not type(child).__name__.endswith("RMSNorm"):
                continue
            if id(child) in rejected:
                continue
            if id(child) not in swapped:
                eps = _eps(child)
                if eps is None or not _computes_rms_norm(child, eps):
                    rejected.add(id(child))
                    continue
                swapped[id(child)] = KernelRMSNorm(child, eps)
            setattr(parent, name, swapped[id(child)])
    return len(swapped)
