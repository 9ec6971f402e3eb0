"""The loader reads every public EAGLE-3 layout (fixtures write each one) and computes what
an independent functional reference reads from the same files; heads that do not fit their
target are refused with one error naming the field and both values."""

from __future__ import annotations

import json

import pytest
import torch
from e3_fixtures import LAYOUTS, random_head, reference_forward, tiny_target, write_layout
from lightspec_eagle3.checkpoint import load_head
from lightspec_eagle3.config import parse_config
from safetensors.torch import load_file, save_file

from lightspec_core import ConfigError


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _taps(target, ids):
    with torch.no_grad():
        return target(input_ids=ids[None], output_hidden_states=True).hidden_states


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_loads_and_matches_reference(tmp_path, target, layout):
    folder = write_layout(tmp_path / layout, random_head(target, layout), layout)
    head = load_head(folder, target)
    ids = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(5))
    hs = _taps(target, ids)
    taps_idx = head.cfg.taps(6)
    assert taps_idx == ([1, 3, 5] if layout in ("aux_ids", "speculators") else [2, 3, 3])
    taps = torch.cat([hs[i][0] for i in taps_idx], -1)[:-1]  # pair t: feature of token t, token t + 1
    ref_h, ref_logits = reference_forward(folder, target, taps, ids[1:])
    from lightspec_eagle3.drafter import _CacheModel

    from lightspec_core import KVCache

    runner = _CacheModel(head)
    kv = KVCache(runner, 1, torch.device("cpu"), capacity=32)
    with torch.no_grad():
        runner.features = head.fuse(taps[None])
        h = kv.forward(ids[None, 1:]).hidden[0]
        drafter_logits = _target_logits(head, h)
    torch.testing.assert_close(h, ref_h, atol=1e-4, rtol=1e-4)
    finite = torch.isfinite(ref_logits)
    assert torch.equal(finite, torch.isfinite(drafter_logits))
    torch.testing.assert_close(drafter_logits[finite], ref_logits[finite], atol=1e-4, rtol=1e-4)


def _target_logits(head, h):
    from lightspec_eagle3.drafter import Eagle3Drafter

    d = Eagle3Drafter(head=head)
    d._bind(tiny_target())
    return d.target_logits(h)


def test_layouts_are_the_public_ones(tmp_path, target):
    """What the fixtures write: the names and config keys each public layout uses."""
    names = {}
    for layout in ("eagle", "speculators", "full_vocab", "embed_tokens", "norm_before_fc"):
        folder = write_layout(tmp_path / layout, random_head(target, layout), layout)
        names[layout] = set(load_file(str(folder / "model.safetensors")))
        raw = json.loads((folder / "config.json").read_text())
        if layout == "speculators":
            assert raw["architectures"] == ["Eagle3DraftModel"] and "transformer_layer_config" in raw
    assert "midlayer.self_attn.q_proj.weight" in names["eagle"] and {"d2t", "t2d"} <= names["eagle"]
    assert "embed_tokens.weight" not in names["eagle"] and "embed_tokens.weight" in names["embed_tokens"]
    assert "layers.0.hidden_norm.weight" in names["speculators"]
    assert not {"d2t", "t2d"} & names["full_vocab"]
    assert "input_norm.weight" in names["norm_before_fc"]


def _edit(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("change, words", [
    ({"target_hidden_size": 128}, ["target_hidden_size", "128", "64"]),
    ({"vocab_size": 200}, ["vocab_size", "200", "96"]),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 9]}}, ["eagle_aux_hidden_state_layer_ids", "9", "6 layers"]),
    ({"num_hidden_layers": 2}, ["num_hidden_layers=2"]),
    ({"architectures": ["GPT2LMHeadModel"]}, ["architectures", "GPT2LMHeadModel"]),
    ({"draft_vocab_size": 500}, ["draft_vocab_size=500"]),
])
def test_misfit_config_refused_naming_field_and_values(tmp_path, target, change, words):
    folder = write_layout(tmp_path / "h", random_head(target), "eagle")
    _edit(folder, **change)
    with pytest.raises(ConfigError) as exc:
        load_head(folder, target)
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))


def test_missing_and_misshapen_tensors_refused(tmp_path, target):
    folder = write_layout(tmp_path / "h", random_head(target), "eagle")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "midlayer.mlp.up_proj.weight"}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing tensor layers\.0\.mlp\.up_proj\.weight"):
        load_head(folder, target)
    state["fc.weight"] = torch.zeros(64, 100)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"fc\.weight has shape \[64, 100\].*needs \[64, 192\]"):
        load_head(folder, target)
    state["fc.weight"] = torch.zeros(64, 192)
    state["d2t"] = state["d2t"] + 1000
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="d2t maps draft id 0 to target id"):
        load_head(folder, target)


def test_head_wider_than_target_embeddings_needs_embed_tokens(tmp_path, target):
    head = random_head(target, "target_hidden_size")  # hidden 32, own embeddings
    folder = write_layout(tmp_path / "h", head, "eagle")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "embed_tokens.weight"}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="hidden_size is 32 in the head .* embeddings are 64 wide"):
        load_head(folder, target)


def test_shared_lm_head_variant(tmp_path, target):
    """A whole-vocabulary head without lm_head borrows the target's output embedding."""
    head = random_head(target, "full_vocab")
    folder = write_layout(tmp_path / "h", head, "full_vocab")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    loaded = load_head(folder, target)
    assert loaded.lm_head is None
    h = torch.randn(3, 64)
    torch.testing.assert_close(loaded.draft_logits(h), loaded.norm(h) @ target.lm_head.weight.T)
    reduced = write_layout(tmp_path / "r", random_head(target), "eagle")
    state = load_file(str(reduced / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(reduced / "model.safetensors"))
    shared = load_head(reduced, target)  # a reduced vocabulary shares the target's rows i + d2t[i]
    assert shared.lm_head is None and shared.cfg.draft_vocab_size == 48
    torch.testing.assert_close(shared.draft_logits(h), shared.norm(h) @ target.lm_head.weight[shared.target_ids()].T)
    save_file({k: v for k, v in state.items() if k not in ("lm_head.weight", "d2t", "t2d")},
              str(reduced / "model.safetensors"))
    with pytest.raises(ConfigError, match="missing tensor lm_head.weight .*draft_vocab_size is 48, vocab_size is 96"):
        load_head(reduced, target)


def test_a_head_with_d2t_but_no_t2d_loads_as_vllm_reads_it(tmp_path, target):
    """vLLM reads ``d2t`` only and skips ``t2d``, so a head saved without ``t2d`` is usable
    there; ``t2d`` follows from ``d2t`` (target id ``i + d2t[i]`` is in the draft vocabulary)."""
    head = random_head(target)
    folder = write_layout(tmp_path / "h", head, "eagle")
    full = load_head(folder, target)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "t2d"}, str(folder / "model.safetensors"))
    no_t2d = load_head(folder, target)
    assert torch.equal(no_t2d.t2d, full.t2d) and torch.equal(no_t2d.d2t, full.d2t)
    h = torch.randn(3, 64)
    torch.testing.assert_close(no_t2d.draft_logits(h), full.draft_logits(h))


def test_parse_config_rejects_fc_norm_and_bad_ids():
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 2,
            "vocab_size": 10}
    assert parse_config(base).draft_vocab_size == 10
    with pytest.raises(ConfigError, match="fc_norm"):
        parse_config({**base, "fc_norm": True})
    with pytest.raises(ConfigError, match="eagle_aux_hidden_state_layer_ids"):
        parse_config({**base, "eagle_config": {"eagle_aux_hidden_state_layer_ids": "1,2"}})
