"""``lean_decoder``: the lean forward computes what the HF forward computes (in fp32 bit
for bit) on every architecture it accepts, in ragged batches with holes; anything else
is refused and keeps the HF forward.  The target uses it only after
``exact_lean_target``'s probe found it exact."""

from __future__ import annotations

import pytest
import torch
from helpers import ragged_steps
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target, lean_forward
from lightspec_core.strategies.model_drafter import LayerSkipDrafter, ModelDrafter
from models import build_model

CPU = torch.device("cpu")


def _steps(kv: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A ragged prefill, a per-row rollback, a ragged append and a single-token step;
    returns (logits, which positions are real) for each forward."""
    return ragged_steps(kv, seed=0)


def _assert_steps_match(reference, runner) -> None:
    """``_steps`` through both models; the logits of every real position agree (1e-4)."""
    with torch.no_grad():
        ref = _steps(KVCache(reference, 3, CPU))
        got = _steps(KVCache(runner, 3, CPU))
    for (r, valid), (g, _) in zip(ref, got):
        assert g.shape == r.shape
        torch.testing.assert_close(g[valid], r[valid], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_lean_forward_matches_hf(arch):
    model = build_model(arch)
    lean = lean_forward(model)
    assert lean is not None
    _assert_steps_match(model, lean)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("fuse", [False, True])
def test_fast_draft_forward_matches_hf_up_to_rounding(arch, fuse):
    """``exact=False`` (drafts): fused norms, a cos/sin table, optionally fused q/k/v and
    gate/up matmuls; the same logits up to float rounding, through holes and rollbacks,
    early exit included, and past the table's first size (positions grow it)."""
    model = build_model(arch)
    fast = lean_forward(model, exact=False, fuse=fuse)
    assert fast is not None and not fast.exact
    _assert_steps_match(model, fast)
    with torch.no_grad():
        long_ids = torch.randint(3, 500, (1, 300), generator=torch.Generator().manual_seed(1))
        r = KVCache(model, 1, CPU).forward(long_ids).logits
        g = KVCache(lean_forward(model, exact=False, fuse=fuse), 1, CPU).forward(long_ids).logits
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    from lightspec_core.model_parts import early_exit_view

    _assert_steps_match(early_exit_view(model, 1), lean_forward(model, 1, exact=False, fuse=fuse))


def test_fuse_needs_the_inexact_forward():
    with pytest.raises(ValueError, match="fuse=True changes the rounding"):
        lean_forward(build_model("llama"), fuse=True)


def test_lean_forward_early_exit_matches_the_first_layers():
    """``num_layers=n``: the first n blocks, then the final norm and lm_head."""
    from lightspec_core.model_parts import early_exit_view

    model = build_model("llama")
    with torch.no_grad():
        ref = _steps(KVCache(early_exit_view(model, 1), 3, CPU))
        got = _steps(KVCache(lean_forward(model, 1), 3, CPU))
    for (r, valid), (g, _) in zip(ref, got):
        torch.testing.assert_close(g[valid], r[valid], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="num_layers=9 is invalid"):
        lean_forward(model, 9)


@pytest.mark.parametrize("arch", ["gemma", "gpt2", "gpt_neox", "phi3", "opt"])
def test_other_architectures_keep_the_hf_forward(arch):
    assert lean_forward(build_model(arch)) is None


def test_sliding_window_keeps_the_hf_forward():
    assert lean_forward(build_model("mistral", sliding_window=16)) is None


class _Env:
    def __init__(self, target, draft=None):
        self.target, self.draft_model = target, draft
        from models import ToyTokenizer

        self.tokenizer = ToyTokenizer()

    def load_draft_model(self):
        return self.draft_model


def test_drafters_choose_their_forward():
    target = build_model("llama")
    on = ModelDrafter(model=build_model("llama", layers=1, seed=1))
    on.setup(_Env(target))
    assert type(on.runner).__name__ == "LeanDecoder"
    off = ModelDrafter(model=build_model("llama", layers=1, seed=1), lean=False)
    off.setup(_Env(target))
    assert off.runner is off.model
    other = ModelDrafter(model=build_model("gpt2"))
    other.setup(_Env(build_model("gpt2")))
    assert other.runner is other.model
    skip = LayerSkipDrafter(layers=2)
    skip.setup(_Env(target))
    assert type(skip.runner).__name__ == "LeanDecoder" and len(skip.runner.layers) == 2
    with pytest.raises(ValueError, match="lean='yes' is invalid"):
        ModelDrafter(lean="yes")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_lean_forward_is_bitwise_equal_to_hf(arch):
    """The target may run through the lean forward only because, in fp32, it reproduces
    HF's logits exactly — on valid positions, through holes and rollbacks."""
    model = build_model(arch)
    with torch.no_grad():
        ref = _steps(KVCache(model, 3, CPU))
        got = _steps(KVCache(lean_forward(model), 3, CPU))
    for (r, valid), (g, _) in zip(ref, got):
        assert torch.equal(g[valid], r[valid])


@pytest.mark.parametrize("arch,expected", [("llama", True), ("qwen3", True), ("gpt2", False), ("gemma", False)])
def test_exact_lean_target_accepts_only_exact_forwards(arch, expected):
    assert (exact_lean_target(build_model(arch)) is not None) is expected


def test_exact_lean_target_refuses_a_forward_that_differs_in_the_last_bit():
    """The probe compares every logit: a model whose HF forward differs from the lean one
    by one float rounding step keeps its HF forward."""
    model = build_model("llama")
    forward = model.forward

    def nudged(*args, cache=None, **kwargs):
        out = forward(*args, cache=cache, **kwargs)
        out.logits = torch.nextafter(out.logits, torch.full_like(out.logits, float("inf")))
        return out

    model.forward = nudged
    assert exact_lean_target(model) is None


def test_lean_capture_records_what_hf_hidden_states_hold():
    """``capture`` numbers layers like ``HiddenCapture`` (HF's ``output_hidden_states``)."""
    from lightspec_core.model_parts import HiddenCapture

    model = build_model("llama")
    ids = torch.randint(3, 500, (2, 7), generator=torch.Generator().manual_seed(1))
    layers = [0, 1, 3]  # embedding output, input of block 1, final norm output (3 blocks)
    hf = HiddenCapture(model, layers)
    lean = lean_forward(model).capture(layers)
    with torch.no_grad():
        KVCache(model, 2, CPU).forward(ids)
        KVCache(lean, 2, CPU).forward(ids)
    hf.remove()
    assert sorted(lean.states) == layers
    for i in layers:
        assert torch.equal(lean.states[i], hf.states[i])
    with pytest.raises(ValueError, match="hidden layer id 4 is invalid"):
        lean_forward(model).capture([4])


@pytest.mark.parametrize("arch,lean_target,expected", [("llama", True, "lean"), ("llama", False, "hf"), ("gpt2", True, "hf")])
def test_pipeline_reports_the_target_forward(arch, lean_target, expected):
    from helpers import tiny_model, tiny_tokenizer
    from lightspec_core.pipeline import MTPPipeline

    pipe = MTPPipeline(tiny_model(arch), tiny_tokenizer(), strategy="ngram", lean_target=lean_target)
    assert pipe.engine.target_forward == expected


def test_lean_logits_to_keep_gives_the_last_positions():
    """As HF's ``logits_to_keep``: the prefill of a long prompt skips the lm_head elsewhere."""
    model = build_model("llama")
    ids = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = KVCache(lean_forward(model), 2, CPU).forward(ids).logits
        last = KVCache(lean_forward(model), 2, CPU).forward(ids, logits_to_keep=3).logits
    assert last.shape == (2, 3, full.shape[-1])
    torch.testing.assert_close(last, full[:, -3:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exact", [True, False])
def test_lean_last_positions_gives_one_position_per_row(exact):
    """A drafter's ragged catch-up needs each row's last new token only: ``last_positions``
    runs the lm_head there alone, ``[B, 1, V]``, with padded rows masked."""
    model = build_model("llama")
    ids = torch.randint(3, 500, (3, 5), generator=torch.Generator().manual_seed(3))
    valid = torch.tensor([[True] * 5, [True] * 2 + [False] * 3, [True] * 4 + [False]])
    last = torch.tensor([4, 1, 3])
    with torch.no_grad():
        full = KVCache(lean_forward(model, exact=exact), 3, CPU).forward(ids, valid).logits
        one = KVCache(lean_forward(model, exact=exact), 3, CPU).forward(ids, valid, last_positions=last).logits
    assert one.shape == (3, 1, full.shape[-1])
    torch.testing.assert_close(one[:, 0], full[torch.arange(3), last], rtol=1e-5, atol=1e-5)


def test_drafters_estimate_their_cost_from_parameter_counts():
    """``draft_cost_hints``: the share of the target's parameters one draft token reads
    (what the seeded-sampling budget uses instead of timings)."""
    from lightspec_core.model_parts import decoder_layers
    from lightspec_core.strategies.ngram import NgramDrafter

    def params(m):
        return sum(p.numel() for p in m.parameters())

    target, draft = build_model("llama"), build_model("llama", layers=1, seed=1)
    d = ModelDrafter(model=draft)
    d.setup(_Env(target))
    assert d.draft_cost_hints() == {"draft_model": pytest.approx(params(draft) / params(target))}
    skip = LayerSkipDrafter(layers=1)
    skip.setup(_Env(target))
    blocks = decoder_layers(target)[1]
    head = params(target.get_output_embeddings())
    expected = (params(blocks[0]) + head) / (sum(params(b) for b in blocks) + head)
    assert skip.draft_cost_hints() == {"layerskip": pytest.approx(expected)}
    assert NgramDrafter().draft_cost_hints() == {"ngram": 0.0}
