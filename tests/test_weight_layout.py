"""The CPU weight layout (``weight_layout``): same values, column-major storage, tied
weights still tied, the packed CPU kernel behind every Linear where it is available, and
LightSpec's greedy output still identical to HF ``generate`` on the re-stored model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import hf_reference, save_tiny
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target, lean_forward
from lightspec_core.pipeline import MTPPipeline, load_model
from lightspec_core.weight_layout import PackedLinear, column_major, is_column_major, use_cpu_layout
from lightspec_kernels import cpu_linear
from models import build_model, make_prompts

needs_kernel = pytest.mark.skipif(not cpu_linear.available(), reason=f"CPU kernel unavailable: {cpu_linear.reason()}")


def test_column_major_keeps_values_and_shape():
    w = torch.randn(24, 40)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w)
    assert is_column_major(c) and not is_column_major(w)
    assert column_major(c) is c  # already column-major: not copied again


def test_use_cpu_layout_restores_every_linear_in_place_and_keeps_ties():
    model = build_model("llama", tie_word_embeddings=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([make_prompts(1, seed=3)[0]])
    with torch.no_grad():
        ref = model(ids).logits
        n = use_cpu_layout(model, packed=False)
        out = model(ids).logits
    assert n == len(linears)  # the tied lm_head is one of them
    assert all(is_column_major(m.weight) for m in linears)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor
    after = dict(model.named_parameters())
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.allclose(ref, out, atol=1e-4, rtol=1e-4)  # only the summation order differs
    assert use_cpu_layout(model, packed=False) == 0  # idempotent


def test_load_model_uses_the_layout_on_cpu_fp32_only(tmp_path):
    path = save_tiny(tmp_path / "m")
    m = load_model(path, torch.device("cpu"), torch.float32)
    if cpu_linear.available():  # the packed kernel: weights keep their storage
        assert isinstance(m.model.layers[0].mlp.down_proj, PackedLinear)
    else:
        assert is_column_major(m.model.layers[0].mlp.down_proj.weight)
    plain = load_model(path, torch.device("cpu"), torch.float32, cpu_layout=False)
    assert not is_column_major(plain.model.layers[0].mlp.down_proj.weight)
    assert type(plain.model.layers[0].mlp.down_proj) is torch.nn.Linear
    # a re-stored model still saves and reloads to the same values
    m.save_pretrained(tmp_path / "again")
    again = load_model(tmp_path / "again", torch.device("cpu"), torch.float32, cpu_layout=False)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))


def test_greedy_identical_to_hf_on_the_restored_model(tmp_path):
    path = save_tiny(tmp_path / "m")
    pipe = MTPPipeline.from_pretrained(str(path), strategy="ngram", device="cpu", dtype="float32")
    q_proj = pipe.target.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, PackedLinear) if cpu_linear.available() else is_column_major(q_proj.weight)
    assert pipe.engine.target_forward == "lean"  # the exact lean forward still matches HF's on it
    for prompt in make_prompts(4, seed=5, vocab=len(pipe.tokenizer)):
        got = pipe.generate([prompt], max_new_tokens=24, ignore_eos=True)[0].token_ids
        assert got == hf_reference(pipe.target, pipe.tokenizer, prompt, 24)


def test_lean_drafter_weights_keep_the_layout():
    model = build_model("llama")
    use_cpu_layout(model, packed=False)
    lean = lean_forward(model, exact=False, fuse=True)
    assert all(len(f.weights) == 2 and all(is_column_major(w) for w in f.weights) for f in lean.fused)
    lean.restrict_vocab(torch.arange(0, 100))
    assert is_column_major(lean.out_weight) and torch.equal(lean.out_weight, model.lm_head.weight[:100])


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_linears_keep_parameters_and_ties(arch):
    model = build_model(arch, tie_word_embeddings=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([make_prompts(1, seed=4)[0]])
    with torch.no_grad():
        ref = model(ids).logits
        use_cpu_layout(model)
        out = model(ids).logits
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is PackedLinear for m in linears)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.is_contiguous()  # the embedding's rows stay contiguous
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    attn = model.model.layers[0].self_attn  # q/k/v share one packed buffer, each module a view
    parts = [attn.q_proj.packed, attn.k_proj.packed, attn.v_proj.packed]
    assert cpu_linear.adjacent(parts) is not None
    assert "packed=float32" in repr(attn.q_proj)  # random fp32 weights are not float16 values


@needs_kernel
def test_packed_linear_falls_back_and_repacks():
    model = build_model("llama")
    use_cpu_layout(model)
    lin = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, lin.in_features)
    with torch.no_grad():
        fast = lin(x)
    torch.testing.assert_close(fast, F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
    y = lin(x)  # gradients for the weight: the autograd path, F.linear
    assert y.requires_grad and torch.equal(y.detach(), F.linear(x, lin.weight).detach())
    with torch.no_grad():
        lin.weight.mul_(2)  # in place: the packed copy follows on the next call
        torch.testing.assert_close(lin(x), 2 * fast, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_exact_lean_target_runs_the_packed_kernel_with_fused_siblings(arch):
    model = build_model(arch)
    use_cpu_layout(model)
    lean = exact_lean_target(model)
    assert lean is not None  # bit for bit HF's forward on the packed modules
    assert all(b.qkv is not None and b.gate_up is not None for b in lean.blocks)
    # a verify over 5 tokens gives each linear's rows exactly as one-token steps would
    ids = torch.tensor([make_prompts(2, seed=7)[1][:12]])
    kv = KVCache(lean, 1, torch.device("cpu"), capacity=64)
    with torch.inference_mode():
        kv.forward(ids[:, :7])
        wide = kv.forward(ids[:, 7:12]).logits
    torch.testing.assert_close(wide[0, -1], model(ids).logits[0, -1].detach(), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_packed_drafter_fuses_and_restricts_the_vocabulary():
    model = build_model("llama")
    use_cpu_layout(model)
    lean = lean_forward(model, exact=False, fuse=True)
    assert all(f.qkv is None and f.gate_up is None for f in lean.fused)  # the packed siblings already are one call
    ids = torch.tensor([make_prompts(1, seed=9)[0]])
    kv = KVCache(lean, 1, torch.device("cpu"), capacity=64)
    with torch.inference_mode():
        full = kv.forward(ids).logits
    torch.testing.assert_close(full, model(ids).logits.detach(), rtol=1e-4, atol=1e-4)
    keep = torch.arange(0, 64)
    lean.restrict_vocab(keep)
    kv = KVCache(lean, 1, torch.device("cpu"), capacity=64)
    with torch.inference_mode():
        part = kv.forward(ids).logits
    torch.testing.assert_close(part[..., keep], full[..., keep], rtol=1e-5, atol=1e-5)
    assert torch.isinf(part[..., 64:]).all()


@needs_kernel
def test_a_model_with_kernels_pickles_and_copies():
    import copy
    import io

    from lightspec_core.cpu_norm import use_cpu_norms

    model = build_model("llama")
    use_cpu_layout(model)
    use_cpu_norms(model)
    ids = torch.tensor([make_prompts(2, seed=2)[1]])
    with torch.no_grad():
        ref = model(ids).logits
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        again = torch.load(buf, weights_only=False)
        assert torch.equal(again(ids).logits, ref)
        assert torch.equal(copy.deepcopy(model)(ids).logits, ref)


@needs_kernel
def test_the_lean_heads_argmax_is_fused_into_the_packed_head_and_equals_the_logits_argmax():
    """``LeanDecoder.head_argmax`` (greedy decoding's lm_head): the packed head's fused
    argmax, the same index as the argmax of ``_head``'s logits, and the plain path where
    the vocabulary is restricted (logits outside it are -inf)."""
    model = build_model("llama")
    use_cpu_layout(model)
    lean = lean_forward(model)
    assert hasattr(lean.head_fn, "argmax")
    h = torch.randn(3, 5, model.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(lean.head_argmax(h), lean.head_logits(h).argmax(-1))
        assert torch.equal(lean.head_argmax(h[:, 1:4]), lean.head_logits(h[:, 1:4]).argmax(-1))  # a strided slice
        lean.restrict_vocab(torch.arange(10, 60))
        got = lean.head_argmax(h)
        assert torch.equal(got, lean.head_logits(h).argmax(-1)) and bool(((got >= 10) & (got < 60)).all())
