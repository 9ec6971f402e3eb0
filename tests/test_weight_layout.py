"""The CPU weight layout (``weight_layout``): same values, column-major storage, tied
weights still tied, and LightSpec's greedy output still identical to HF ``generate`` on
the re-stored model."""

from __future__ import annotations

import torch
from helpers import hf_reference, save_tiny
from lightspec_core.lean_decoder import lean_decoder
from lightspec_core.pipeline import MTPPipeline, load_model
from lightspec_core.weight_layout import column_major, is_column_major, use_cpu_layout
from models import build_model, make_prompts


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
        n = use_cpu_layout(model)
        out = model(ids).logits
    assert n == len(linears)  # the tied lm_head is one of them
    assert all(is_column_major(m.weight) for m in linears)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor
    after = dict(model.named_parameters())
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.allclose(ref, out, atol=1e-4, rtol=1e-4)  # only the summation order differs
    assert use_cpu_layout(model) == 0  # idempotent


def test_load_model_uses_the_layout_on_cpu_fp32_only(tmp_path):
    path = save_tiny(tmp_path / "m")
    m = load_model(path, torch.device("cpu"), torch.float32)
    assert is_column_major(m.model.layers[0].mlp.down_proj.weight)
    plain = load_model(path, torch.device("cpu"), torch.float32, cpu_layout=False)
    assert not is_column_major(plain.model.layers[0].mlp.down_proj.weight)
    # a re-stored model still saves and reloads to the same values
    m.save_pretrained(tmp_path / "again")
    again = load_model(tmp_path / "again", torch.device("cpu"), torch.float32, cpu_layout=False)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))


def test_greedy_identical_to_hf_on_the_restored_model(tmp_path):
    path = save_tiny(tmp_path / "m")
    pipe = MTPPipeline.from_pretrained(str(path), strategy="ngram", device="cpu", dtype="float32")
    assert is_column_major(pipe.target.model.layers[0].self_attn.q_proj.weight)
    assert pipe.engine.target_forward == "lean"  # the exact lean forward still matches HF's on it
    for prompt in make_prompts(4, seed=5, vocab=len(pipe.tokenizer)):
        got = pipe.generate([prompt], max_new_tokens=24, ignore_eos=True)[0].token_ids
        assert got == hf_reference(pipe.target, pipe.tokenizer, prompt, 24)


def test_lean_drafter_weights_keep_the_layout():
    model = build_model("llama")
    use_cpu_layout(model)
    lean = lean_decoder(model, exact=False, fuse=True)
    assert all(is_column_major(f.qkv[0]) and is_column_major(f.gate_up[0]) for f in lean.fused)
    lean.restrict_vocab(torch.arange(0, 100))
    assert is_column_major(lean.out_weight) and torch.equal(lean.out_weight, model.lm_head.weight[:100])
