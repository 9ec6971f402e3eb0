"""The fused RMSNorm installed in a model's norm modules (``cpu_norm``): swapped only
where a probe shows it computes the module's function; HF's forward and the lean target
then run the same kernel and agree bit for bit."""

from __future__ import annotations

import pytest
import torch
from lightspec_core.cpu_norm import KernelRMSNorm, use_cpu_norms
from lightspec_core.lean_decoder import exact_lean_target
from lightspec_core.weight_layout import use_cpu_layout
from lightspec_kernels import cpu_norm_rope
from models import build_model, make_prompts
from torch import nn

pytestmark = pytest.mark.skipif(not cpu_norm_rope.available(), reason=f"CPU kernel unavailable: {cpu_norm_rope.reason()}")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_norms_are_swapped_keep_their_parameters_and_the_lean_target_stays_exact(arch):
    model = build_model(arch)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([make_prompts(2, seed=1)[1]])
    with torch.no_grad():
        before = model(ids).logits
    n = use_cpu_norms(model)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert n == len(norms) and all(isinstance(m, KernelRMSNorm) for m in norms)  # qwen3's q/k norms too
    assert use_cpu_norms(model) == 0
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        after = model(ids).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    use_cpu_layout(model)
    assert exact_lean_target(model) is not None


def test_a_norm_of_another_function_keeps_its_module():
    class OnePlusRMSNorm(nn.Module):  # Gemma's form: (1 + weight)
        def __init__(self, h):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(h))
            self.eps = 1e-6

        def forward(self, x):
            return (1 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    holder = nn.Sequential(OnePlusRMSNorm(16))
    assert use_cpu_norms(holder) == 0 and isinstance(holder[0], OnePlusRMSNorm)


def test_autograd_and_other_dtypes_take_the_original_forward():
    model = build_model("llama")
    use_cpu_norms(model)
    norm = model.model.norm
    x = torch.randn(2, 64)
    y = norm(x)  # gradients for the weight: the original forward
    assert y.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(norm(x), y.detach(), rtol=1e-5, atol=1e-6)
        assert norm(x.double()).dtype == torch.float64
