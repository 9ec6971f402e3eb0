"""LightSpec's CPU attention as a transformers attention implementation (``hf_attention``):
installed in the model, HF's forward and LightSpec's lean forward run the same kernel and
agree bit for bit; greedy decoding stays identical to HF ``generate`` on that model."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_reference, save_tiny
from lightspec_core.hf_attention import NAME, lightspec_cpu_attention, use_cpu_attention, uses_cpu_attention
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target
from lightspec_core.pipeline import MTPPipeline, load_model
from lightspec_core.weight_layout import use_cpu_layout
from lightspec_kernels import cpu_attention
from models import build_model, make_prompts

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason=f"CPU kernel unavailable: {cpu_attention.reason()}")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_model_runs_the_kernel_and_the_lean_target_matches_it(arch):
    model = build_model(arch)
    ids = torch.tensor([make_prompts(2, seed=3)[1]])
    with torch.no_grad():
        sdpa = model(ids).logits
    assert use_cpu_attention(model) and uses_cpu_attention(model)
    assert use_cpu_attention(model) is False  # already switched: nothing to do
    with torch.no_grad():
        mine = model(ids).logits
    torch.testing.assert_close(mine, sdpa, rtol=1e-4, atol=1e-5)  # the same function, rounded differently
    use_cpu_layout(model)
    lean = exact_lean_target(model)  # the ragged, padded probe: bit for bit HF's forward
    assert lean is not None and lean.cpu_attention


def test_pipeline_models_use_it_and_greedy_stays_identical_to_hf(tmp_path):
    path = save_tiny(tmp_path / "m")
    assert uses_cpu_attention(load_model(path, torch.device("cpu"), torch.float32))
    assert not uses_cpu_attention(load_model(path, torch.device("cpu"), torch.float32, cpu_layout=False))
    for strategy in ("none", "ngram", "layerskip"):
        pipe = MTPPipeline.from_pretrained(str(path), strategy=strategy, device="cpu", dtype="float32")
        assert uses_cpu_attention(pipe.target) and pipe.engine.target_forward == "lean"
        for prompt in make_prompts(3, seed=11, vocab=len(pipe.tokenizer)):
            got = pipe.generate([prompt], max_new_tokens=20, ignore_eos=True)[0].token_ids
            assert got == hf_reference(pipe.target, pipe.tokenizer, prompt, 20), strategy


def test_a_verify_step_reproduces_one_token_steps_through_the_lean_target():
    """Attention and the packed linears compute each token on its own, so the logits of
    a 5-token verify equal five one-token steps' (norms and rotary are elementwise)."""
    model = build_model("llama")
    use_cpu_layout(model)
    use_cpu_attention(model)
    lean = exact_lean_target(model)
    ids = torch.tensor([make_prompts(2, seed=5)[1][:16]])
    wide_kv = KVCache(lean, 1, torch.device("cpu"), capacity=64)
    step_kv = KVCache(lean, 1, torch.device("cpu"), capacity=64)
    with torch.inference_mode():
        wide_kv.forward(ids[:, :11])
        step_kv.forward(ids[:, :11])
        wide = wide_kv.forward(ids[:, 11:16]).logits
        steps = torch.cat([step_kv.forward(ids[:, i : i + 1]).logits for i in range(11, 16)], dim=1)
    torch.testing.assert_close(wide, steps, rtol=1e-5, atol=1e-5)


def test_calls_outside_the_kernel_go_to_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = build_model("llama")
    module = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 3, 16, generator=gen, dtype=torch.float64)
    out, _ = lightspec_cpu_attention(module, q, k, k, None, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q, k, k, None, scaling=0.25)
    assert out.dtype == torch.float64 and torch.equal(out, ref)
    # HF's quirk kept: no mask, several queries, more keys than queries -> causal from column 0
    q32, k32 = q.float(), torch.randn(1, 2, 7, 16, generator=gen)
    out, _ = lightspec_cpu_attention(module, q32, k32, k32, None, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q32, k32, k32, None, scaling=0.25)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_other_implementations_are_left_alone():
    model = build_model("llama")
    model.set_attn_implementation("eager")
    assert not use_cpu_attention(model)
    assert model.config._attn_implementation == "eager" != NAME


def test_forcing_torch_keeps_sdpa_and_the_lean_target_exact(monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")
    model = build_model("llama")
    assert not use_cpu_attention(model) and model.config._attn_implementation == "sdpa"
    use_cpu_layout(model)
    lean = exact_lean_target(model)
    assert lean is not None and not lean.cpu_attention
