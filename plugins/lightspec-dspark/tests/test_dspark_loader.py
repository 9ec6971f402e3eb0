"""The loader reads the public DeepSpec layout (flat and SpecForge-nested configs, every Markov
head type, DFlash, own or shared embeddings, reduced vocabularies) and refuses a checkpoint that
does not fit its target with one error naming the field and both values."""

from __future__ import annotations

import json

import pytest
import torch
from dspark_fixtures import tiny_target, write_checkpoint
from lightspec_dspark.checkpoint import load_drafter, save_drafter
from lightspec_dspark.config import CheckpointError
from safetensors.torch import load_file

from lightspec_core import LightSpecError


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.mark.parametrize("opts", [dict(), dict(nested=True), dict(markov_type="gated"), dict(markov_type="rnn"),
                                  dict(kind="dflash"), dict(own_embeddings=True), dict(draft_vocab=40),
                                  dict(confidence=False), dict(with_markov=False)],
                         ids=["flat", "nested", "gated", "rnn", "dflash", "own_embed", "reduced_vocab", "no_conf",
                              "conf_without_markov"])
def test_loads_every_variant_with_its_tensors(tmp_path, target, opts):
    folder = write_checkpoint(tmp_path, target, **opts)
    d = load_drafter(folder, target)
    written = load_file(str(folder / "model.safetensors"))
    state = d.state_dict()
    assert set(state) == set(written)
    for k, v in written.items():
        assert torch.equal(state[k].to(v.dtype), v), k
    assert d.cfg.block_size == 4 and d.cfg.target_layer_ids == [0, 2]
    assert d.cfg.kind == ("dflash" if opts.get("kind") == "dflash" else "dspark")
    if opts.get("markov_type"):
        assert d.markov_head.kind == opts["markov_type"]
    shared = not opts.get("own_embeddings")
    assert (d.embed_tokens is target.get_input_embeddings()) == shared
    assert (d.lm_head is target.get_output_embeddings()) == (not opts.get("draft_vocab"))
    assert (d.confidence_head is not None) == (opts.get("kind") != "dflash" and opts.get("confidence", True))


def test_nested_and_flat_configs_give_the_same_drafter(tmp_path, target):
    a = load_drafter(write_checkpoint(tmp_path / "a", target), target)
    b = load_drafter(write_checkpoint(tmp_path / "b", target, nested=True), target)
    assert a.cfg == b.cfg


def test_save_then_load_round_trips(tmp_path, target):
    d = load_drafter(write_checkpoint(tmp_path / "a", target, markov_type="rnn"), target)
    save_drafter(d, tmp_path / "b", json.loads(target.config.to_json_string()), dtype=torch.float32)
    e = load_drafter(tmp_path / "b", target)
    assert e.cfg == d.cfg
    for (k, v), (k2, v2) in zip(d.state_dict().items(), e.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


def _error(tmp_path, target, **opts) -> str:
    with pytest.raises(CheckpointError) as exc:
        load_drafter(write_checkpoint(tmp_path, target, **opts), target)
    assert isinstance(exc.value, LightSpecError)
    return str(exc.value)


def test_refuses_another_hidden_size(tmp_path, target):
    other = tiny_target("qwen3", layers=3)
    other.config.hidden_size = 48  # the checkpoint is written for 32, checked against 48
    with pytest.raises(CheckpointError) as exc:
        load_drafter(write_checkpoint(tmp_path, target), other)
    msg = str(exc.value)
    assert "hidden_size" in msg and "32" in msg and "48" in msg


def test_refuses_another_vocabulary(tmp_path, target):
    msg = _error(tmp_path, target, overrides={"vocab_size": 128})
    assert "vocab_size" in msg and "128" in msg and "96" in msg


def test_refuses_layer_ids_the_target_lacks(tmp_path, target):
    msg = _error(tmp_path, target, taps=(0, 5))
    assert "target_layer_ids" in msg and "[0, 5]" in msg and "3 layers" in msg


@pytest.mark.parametrize("tensor", ["fc.weight", "layers.1.self_attn.k_norm.weight", "markov_head.markov_w2.weight",
                                    "confidence_head.proj.bias"])
def test_refuses_missing_tensors(tmp_path, target, tensor):
    msg = _error(tmp_path, target, drop=tensor)
    assert f"missing tensor {tensor!r}" in msg and "expected shape" in msg


def test_refuses_a_wrong_shape(tmp_path, target):
    msg = _error(tmp_path, target, overrides={"markov_rank": 8})
    assert "markov_head.markov_w1.weight" in msg and "[96, 4]" in msg and "[96, 8]" in msg


def test_refuses_unknown_markov_type_and_unused_tensors(tmp_path, target):
    msg = _error(tmp_path, target, overrides={"markov_head_type": "fir"})
    assert "markov_head_type='fir'" in msg and "vanilla" in msg
    msg = _error(tmp_path / "b", target, markov_type="gated", overrides={"markov_head_type": "vanilla"})
    assert "markov_head.gate_proj" in msg


def test_reduced_vocab_needs_lm_head_and_d2t(tmp_path, target):
    msg = _error(tmp_path, target, draft_vocab=40, drop="d2t")
    assert "'d2t'" in msg and "draft_vocab_size=40" in msg


def test_dflash_strategy_refuses_a_dspark_checkpoint_and_bad_options(tmp_path, target):
    from lightspec_dspark.strategy import DSparkStrategy

    from lightspec_core import MTPPipeline

    ckpt = write_checkpoint(tmp_path, target)

    class Tok:
        eos_token_id, pad_token_id = 2, 0

        def __len__(self):
            return 96

    with pytest.raises(CheckpointError, match="markov_rank=4.*strategy 'dspark'"):
        MTPPipeline(target, Tok(), strategy="dflash", checkpoint=str(ckpt))
    with pytest.raises(LightSpecError, match="max_draft=0"):
        DSparkStrategy(max_draft=0)
