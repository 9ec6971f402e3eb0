"""``lean_decoder``: the drafters' lean forward computes what the HF forward computes
(same logits, up to float rounding) on every architecture it accepts, in ragged
batches with holes; anything else is refused and keeps the HF forward."""

from __future__ import annotations

import pytest
import torch

from models import build_model

from lightspec_core.kvcache import BatchedKV
from lightspec_core.lean_decoder import lean_decoder
from lightspec_core.strategies.model_drafter import LayerSkipDrafter, ModelDrafter

CPU = torch.device("cpu")


def _steps(kv: BatchedKV) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A ragged prefill, a per-row rollback, a ragged append and a single-token step;
    returns (logits, which positions are real) for each forward."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (3, 9), generator=g)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, 6:] = False
    valid[2, 4:] = False
    out = [(kv.forward(ids, valid).logits, valid)]
    kv.truncate(torch.tensor([5, 3, 4]))
    valid2 = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    out.append((kv.forward(ids[:, :3], valid2).logits, valid2))
    out.append((kv.forward(ids[:, :1]).logits, torch.ones(3, 1, dtype=torch.bool)))
    return out


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_lean_forward_matches_hf(arch):
    model = build_model(arch)
    lean = lean_decoder(model)
    assert lean is not None
    with torch.no_grad():
        ref = _steps(BatchedKV(model, 3, CPU))
        got = _steps(BatchedKV(lean, 3, CPU))
    for (r, valid), (g, _) in zip(ref, got):
        assert g.shape == r.shape
        torch.testing.assert_close(g[valid], r[valid], rtol=1e-4, atol=1e-4)


def test_lean_forward_early_exit_matches_the_first_layers():
    """``num_layers=n``: the first n blocks, then the final norm and lm_head."""
    from lightspec_core.model_parts import early_exit_view

    model = build_model("llama")
    with torch.no_grad():
        ref = _steps(BatchedKV(early_exit_view(model, 1), 3, CPU))
        got = _steps(BatchedKV(lean_decoder(model, 1), 3, CPU))
    for (r, valid), (g, _) in zip(ref, got):
        torch.testing.assert_close(g[valid], r[valid], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="num_layers=9 is invalid"):
        lean_decoder(model, 9)


@pytest.mark.parametrize("arch", ["gemma", "gpt2", "gpt_neox", "phi3", "opt"])
def test_other_architectures_keep_the_hf_forward(arch):
    assert lean_decoder(build_model(arch)) is None


def test_sliding_window_keeps_the_hf_forward():
    assert lean_decoder(build_model("mistral", sliding_window=16)) is None


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
