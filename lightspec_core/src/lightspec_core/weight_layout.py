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
``lightspec bench``'s ``hf_vanilla_lightspec_kernels`` row; its other HF baselines run on a
stock copy) sees the same numerics.  Tied weights stay tied.

Where ``lightspec_kernels.cpu_linear`` can run (x86-64 with AVX2 or AVX-512 and a C
compiler), ``use_cpu_layout`` goes further: every ``nn.Linear`` becomes a
``PackedLinear``, which keeps its weight (same values, same parameter) and also a copy
packed for that kernel, float16 where the values allow it exactly.  Measured on the 2-core
VM (zoo target's projections, 1 thread): 4.0 → 1.3 ms per one-token step, 8.1 → 2.0 ms for
four tokens.  The sibling projections that read the same input (q/k/v, gate/up) are packed
into one buffer, each module viewing its part, so that the lean forward can run them as
one call with the same results.  Every method on the model, HF's ``generate`` included,
runs through the same modules and so computes the same numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightspec_kernels import cpu_linear
from torch import nn


def is_column_major(weight: torch.Tensor) -> bool:
    """True for a 2-D tensor stored as its transpose's row-major buffer."""
    return weight.dim() == 2 and weight.stride(0) == 1 and weight.stride(1) == weight.shape[0] and weight.shape[0] > 1


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` with the same values, stored column-major (``[in, out]`` buffer)."""
    return weight if is_column_major(weight) else weight.t().contiguous().t()


def use_cpu_layout(model: nn.Module, packed: bool | None = None) -> int:
    """Re-store every ``nn.Linear`` weight of ``model`` column-major, in place; returns how
    many weights were re-stored.  An embedding tied to the lm_head keeps sharing it (its
    row look-ups read a strided view: a few tokens per step).  Meant for CPU inference: a
    GPU's BLAS takes either layout at full speed, so there it is left alone.

    ``packed``: instead, turn every ``nn.Linear`` into a ``PackedLinear`` (``None``: when
    ``lightspec_kernels.cpu_linear`` is available here).  The weights then keep their
    storage (the kernel reads its packed copy), so an embedding tied to the lm_head keeps
    its contiguous rows (a strided row look-up cost 17 us per step); returns how many
    were turned."""
    if packed is None:
        packed = cpu_linear.available()
    if packed:
        return use_packed_linears(model)
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


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU forward runs ``lightspec_kernels.cpu_linear``.

    ``weight`` and ``bias`` stay the module's own parameters (tied weights stay tied, the
    state dict is unchanged); ``packed`` is the kernel's copy.  Anything else (another
    dtype or device, or a forward that records gradients for the weight) takes
    ``F.linear``.  If the weight is changed in place, the packed copy is rebuilt on the
    next forward."""

    def __init__(self, linear: nn.Linear, packed: cpu_linear.PackedWeight):
        nn.Module.__init__(self)
        self.train(linear.training)  # the mode of the module it replaces, not nn.Module's default
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._set(packed)

    def _set(self, packed: cpu_linear.PackedWeight) -> None:
        self.packed = packed
        self._version = _version(self.weight)
        # the kernel with its look-ups done once: HF's forward calls this module ~50 times per
        # step, and a slow wrapper would handicap HF's own baseline in the benchmarks
        self._kernel = cpu_linear.bind(packed, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, packed={str(self.packed.data.dtype).removeprefix('torch.')}"

    def __getstate__(self):
        # the bound kernel is a closure over raw pointers: pickle the weights, re-pack on load
        state = self.__dict__.copy()
        for key in ("packed", "_kernel", "_version"):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._set(cpu_linear.pack(self.weight.detach()))

    def current(self) -> cpu_linear.PackedWeight:
        """The packed weight, re-packed first if ``weight`` changed since."""
        if _version(self.weight) != self._version:
            self._set(cpu_linear.pack(self.weight.detach()))
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype is _F32 and x.is_cpu and w.is_cpu and not (w.requires_grad and torch.is_grad_enabled()):
            if _version(w) != self._version:
                self._set(cpu_linear.pack(w.detach()))
            return self._kernel(x)
        return F.linear(x, w, self.bias)


_F32 = torch.float32

# sibling projections that read the same input, packed into one buffer (module views)
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def use_packed_linears(model: nn.Module) -> int:
    """Turn every float32 CPU ``nn.Linear`` of ``model`` into a ``PackedLinear``, in place;
    returns how many were turned.  q/k/v and gate/up siblings share one packed buffer."""
    done: dict[int, cpu_linear.PackedWeight] = {}
    for module in list(model.modules()):
        for group in SIBLINGS:
            mods = [getattr(module, name, None) for name in group]
            if not all(type(m) is nn.Linear and _packable(m) for m in mods):
                continue
            if len({m.in_features for m in mods}) != 1 or any(m.out_features % cpu_linear.BLOCK for m in mods):
                continue
            parts = [cpu_linear.pack(m.weight.detach()) for m in mods]
            if len({p.data.dtype for p in parts}) != 1:
                continue
            whole = cpu_linear.cat(parts).data
            start = 0
            for m, p in zip(mods, parts):
                blocks = p.data.shape[0]
                done[id(m)] = cpu_linear.PackedWeight(whole[start : start + blocks], p.out_features, p.in_features)
                start += blocks
    wrapped: dict[int, PackedLinear] = {}  # a module shared by two parents stays one module
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and _packable(child):
                if id(child) not in wrapped:
                    packed = done.get(id(child)) or cpu_linear.pack(child.weight.detach())
                    wrapped[id(child)] = PackedLinear(child, packed)
                setattr(parent, name, wrapped[id(child)])
    return len(wrapped)


def _version(t: torch.Tensor) -> int | None:
    """In-place changes counter (inference tensors keep none: they are never re-packed)."""
    return None if t.is_inference() else t._version


def _packable(linear: nn.Linear) -> bool:
    w = linear.weight
    return w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 2
