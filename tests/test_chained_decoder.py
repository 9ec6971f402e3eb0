"""The lean forward's chained path (``cpu_decoder``: one compiled call per block) on models
whose pieces all run LightSpec's CPU kernels: the same logits as the op-by-op lean
forward and as HF's forward, bit for bit, through ragged batches, holes, rollbacks,
slab growth and captured hidden states; models it cannot run keep the op-by-op forward."""

from __future__ import annotations

import pytest
import torch
from helpers import ragged_steps
from lightspec_core.cpu_norm import use_cpu_norms
from lightspec_core.hf_attention import use_cpu_attention
from lightspec_core.kvcache import BatchedKV
from lightspec_core.lean_decoder import exact_lean_target, lean_decoder
from lightspec_core.weight_layout import use_cpu_layout
from lightspec_kernels import cpu_decoder
from models import build_model

pytestmark = pytest.mark.skipif(not cpu_decoder.available(), reason=f"CPU kernel unavailable: {cpu_decoder.reason()}")
CPU = torch.device("cpu")


def _kernel_model(arch: str, **overrides):
    model = build_model(arch, **overrides)
    use_cpu_layout(model)
    use_cpu_norms(model)
    use_cpu_attention(model)
    return model


def _steps(kv: BatchedKV) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``helpers.ragged_steps``, then one-token steps past the slab's capacity (growth) and
    a verify-wide step; (logits, real positions) per forward."""
    return ragged_steps(kv, seed=1, one_token_steps=6, wide=5)


def _run(runner, capacity: int = 12):
    with torch.inference_mode():
        return _steps(BatchedKV(runner, 3, CPU, capacity=capacity))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("fused_activation", [True, False])
def test_chained_forward_is_the_op_by_op_forward_and_hf_bit_for_bit(arch, fused_activation):
    model = _kernel_model(arch)
    chained = exact_lean_target(model)  # its probe already compares with HF bit for bit
    assert chained is not None and chained.chained is not None
    assert chained.chained.fused_activation  # the C SwiGLU rounds as PyTorch's on this machine
    chained.chained.fused_activation = fused_activation  # False: the activation between blocks in PyTorch
    plain = lean_decoder(model)
    plain.chained = None
    for (a, valid), (b, _), (c, _) in zip(_run(chained), _run(plain), _run(model)):
        assert torch.equal(a[valid], b[valid])
        assert torch.equal(a[valid], c[valid])


def test_chained_capture_records_what_the_op_by_op_forward_records():
    model = _kernel_model("llama")
    chained, plain = lean_decoder(model).capture([0, 1, 2]), lean_decoder(model).capture([0, 1, 2])
    plain.chained = None
    assert chained.chained is not None
    kv_a, kv_b = BatchedKV(chained, 2, CPU), BatchedKV(plain, 2, CPU)
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(2))
    ragged = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # a padded verify: packed rows
    with torch.inference_mode():
        for q, valid in ((6, None), (1, None), (3, None), (3, ragged)):
            kv_a.forward(ids[:, :q], valid)
            kv_b.forward(ids[:, :q], valid)
            real = torch.ones(2, q, dtype=torch.bool) if valid is None else valid
            assert set(chained.states) == {0, 1, 2}
            for i in (0, 1, 2):
                assert torch.equal(chained.states[i][real], plain.states[i][real])


def test_chained_draft_forward_matches_hf_up_to_rounding():
    model = _kernel_model("llama")
    fast = lean_decoder(model, exact=False)
    assert fast.chained is not None
    for (a, valid), (c, _) in zip(_run(fast), _run(model)):
        torch.testing.assert_close(a[valid], c[valid], rtol=1e-4, atol=1e-4)


def test_models_without_every_kernel_keep_the_op_by_op_forward(monkeypatch):
    assert lean_decoder(_kernel_model("qwen3")).chained is None  # per-head q/k norms
    assert lean_decoder(build_model("llama")).chained is None  # no packed weights, no kernel norms
    no_norms = build_model("llama")
    use_cpu_layout(no_norms)
    use_cpu_attention(no_norms)
    assert lean_decoder(no_norms).chained is None
    monkeypatch.setenv("LIGHTSPEC_CHAINED", "0")
    assert lean_decoder(_kernel_model("llama")).chained is None


def test_exact_rope_table_reads_the_rotary_modules_values():
    """Head size 32: the chained exact forward reads cos/sin from a table (checked at load
    to hold the rotary module's values bit for bit) and still equals HF's forward."""
    model = _kernel_model("llama", num_attention_heads=2, num_key_value_heads=1)
    lean = exact_lean_target(model)
    assert lean is not None and lean.chained is not None and lean.exact_rope_table
    assert not lean_decoder(_kernel_model("llama")).exact_rope_table  # head size 16: not checked, not used
    for (a, valid), (c, _) in zip(_run(lean, capacity=8), _run(model, capacity=8)):
        assert torch.equal(a[valid], c[valid])
