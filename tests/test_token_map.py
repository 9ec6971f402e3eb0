"""Token maps: a draft model may be limited to frequent tokens plus the request's own
(``token_map``).  Its logits elsewhere are -inf, it never proposes anything else, the
output stays the target's own, and bad maps are refused with a clear error."""

from __future__ import annotations

import json

import pytest
import torch
from lightspec_core.errors import LightSpecError
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import lean_forward
from models import ToyTokenizer, build_model, cached_model, hf_greedy, make_prompts

from lightspec_core import MTPPipeline

HOT = list(range(3, 40))  # the toy vocabulary's "frequent" tokens


def write_map(path, ids=HOT):
    path.write_text(json.dumps({"token_ids": ids}))
    return str(path)


def test_restricted_logits_are_the_full_ones_on_the_subset_and_minus_inf_elsewhere():
    model = build_model("llama")
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([5, 7, 11, 300, 499])
    lean = lean_forward(model)
    with torch.no_grad():
        full = KVCache(lean, 2, torch.device("cpu")).forward(ids).logits
        lean.restrict_vocab(keep)
        part = KVCache(lean, 2, torch.device("cpu")).forward(ids).logits
    torch.testing.assert_close(part[..., keep], full[..., keep], rtol=1e-5, atol=1e-5)
    others = torch.ones(full.shape[-1], dtype=torch.bool)
    others[keep] = False
    assert bool(torch.isneginf(part[..., others]).all())
    lean.restrict_vocab(None)
    with torch.no_grad():
        again = KVCache(lean, 2, torch.device("cpu")).forward(ids).logits
    torch.testing.assert_close(again, full)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_token_map_keeps_greedy_output_identical_and_drafts_only_allowed_tokens(arch, tmp_path):
    prompts = make_prompts(4, seed=3)
    target = cached_model(arch)
    pipe = MTPPipeline(target, ToyTokenizer(), strategy="draft_model", draft_model=cached_model(arch, 1, 1),
                       token_map=write_map(tmp_path / "map.json"), budget={"type": "static", "k": 4})
    drafter = pipe.strategy
    proposed: list[int] = []
    propose = drafter.lightspec_propose

    def spy(ctx):
        p = propose(ctx)
        if p is not None:
            for b in range(p.tokens.shape[0]):
                proposed.extend(p.tokens[b, : int(p.lengths[b])].tolist())
        return p

    drafter.lightspec_propose = spy
    pipe.bound.propose = spy
    out = pipe.generate(prompts, max_new_tokens=16, ignore_eos=True)
    for o, prompt in zip(out, prompts):
        assert o.token_ids == hf_greedy(target, prompt, 16)
    # the map's ids plus the requests' tokens when drafting began: the prompts and the
    # first token (from the target's prefill)
    allowed = set(HOT) | {t for p in prompts for t in p} | {o.token_ids[0] for o in out}
    assert proposed, "the draft never proposed anything"
    assert set(proposed) <= allowed
    assert set(drafter.runner.out_ids.tolist()) == allowed


def test_auto_uses_the_token_map_of_the_draft_folder(tmp_path):
    draft = build_model("llama", layers=1, seed=1)
    draft.save_pretrained(tmp_path / "draft")
    pipe = MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model", draft_model=str(tmp_path / "draft"))
    assert pipe.strategy.hot is None  # no token_map.json: the whole vocabulary
    write_map(tmp_path / "draft" / "token_map.json")
    pipe = MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model", draft_model=str(tmp_path / "draft"))
    assert pipe.strategy.hot.tolist() == HOT
    none = MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model",
                       draft_model=str(tmp_path / "draft"), token_map="none")
    assert none.strategy.hot is None


@pytest.mark.parametrize("content,match", [
    ("not json", "cannot read it as JSON"),
    (json.dumps({"token_ids": []}), "non-empty list 'token_ids' of integers in 0..511"),
    (json.dumps({"token_ids": [1, 512]}), "integers in 0..511"),
    (json.dumps([1, "a"]), "integers in 0..511"),
])
def test_bad_token_maps_are_refused(tmp_path, content, match):
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(LightSpecError, match=match):
        MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model",
                    draft_model=cached_model("llama", 1, 1), token_map=str(tmp_path / "bad.json"))


def test_token_map_errors_name_the_problem(tmp_path):
    with pytest.raises(LightSpecError, match="no such file"):
        MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model",
                    draft_model=cached_model("llama", 1, 1), token_map=str(tmp_path / "missing.json"))
    with pytest.raises(LightSpecError, match="needs the lean draft forward"):
        MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model", draft_model=cached_model("llama", 1, 1),
                    token_map=write_map(tmp_path / "map.json"), lean=False)
    with pytest.raises(Exception, match="token_map=3 is invalid"):
        MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="draft_model",
                    draft_model=cached_model("llama", 1, 1), token_map=3)
