"""Loading the public layouts: MTP modules from a target's own checkpoint (DeepSeek / GLM
naming, MiMo naming, sharded, with or without ``shared_head.head``) and Medusa heads
(FasterDecoding's ``medusa_lm_head.pt``, vLLM's safetensors); heads that do not fit their
target are refused with one error naming the field and both values."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import (
    VOCAB,
    build_target,
    medusa_tensors,
    save_medusa_legacy,
    save_medusa_vllm,
    save_target_with_mtp,
)
from lightspec_mtplayer.formats import HeadFitError, load_head, load_medusa, load_mtp_layers, save_medusa


def _loaded_equal(layers, ref, L):
    for i, layer in enumerate(layers):
        state = layer.state_dict()
        for key, value in ref.items():
            if key.startswith(f"model.layers.{L + i}."):
                local = key[len(f"model.layers.{L + i}."):]
                name = local if local.startswith(("enorm", "hnorm", "eh_proj", "shared_head")) else "block." + local
                torch.testing.assert_close(state[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", ["single", "sharded", "shared_head", "embed_copy"])
def test_mtp_modules_load_from_the_target_checkpoint(tmp_path, arch, variant):
    target, _, ref = save_target_with_mtp(tmp_path, arch, n=2, own_head=variant != "shared_head",
                                          sharded=variant == "sharded", embed_copy=variant == "embed_copy")
    layers = load_mtp_layers(target, tmp_path)
    assert len(layers) == 2
    assert [layer.own_head for layer in layers] == [variant != "shared_head"] * 2
    _loaded_equal(layers, ref, target.config.num_hidden_layers)


def test_mimo_layout_computes_what_the_deepseek_layout_does(tmp_path):
    target, _, _ = save_target_with_mtp(tmp_path / "ds", n=1, layout="deepseek")
    save_target_with_mtp(tmp_path / "mimo", n=1, layout="mimo")
    [ds] = load_mtp_layers(target, tmp_path / "ds")
    [mm] = load_mtp_layers(target, tmp_path / "mimo")
    ids = torch.tensor([[5, 6, 7, 8]])
    h = torch.randn(1, 4, 32)
    pos = torch.arange(4)[None]
    mask = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        torch.testing.assert_close(mm(ids, h, pos, mask), ds(ids, h, pos, mask), rtol=0, atol=0)


def test_legacy_and_vllm_medusa_layouts_give_the_same_heads(tmp_path):
    """FasterDecoding's ``medusa_lm_head.pt`` (plain and behind ``medusa_head.``), its
    ``medusa_lm_head.safetensors`` (its training script, TGI) and vLLM's naming."""
    target = build_target("llama")
    blocks, lm = medusa_tensors(32, VOCAB, heads=3, layers=2)
    a = load_medusa(target, save_medusa_legacy(tmp_path / "legacy", blocks, lm, 32, VOCAB))
    b = load_medusa(target, save_medusa_vllm(tmp_path / "vllm", blocks, lm, 32, VOCAB))
    c = load_medusa(target, save_medusa_legacy(tmp_path / "prefixed", blocks, lm, 32, VOCAB, prefix="medusa_head."))
    d = load_medusa(target, save_medusa_legacy(tmp_path / "st", blocks, lm, 32, VOCAB, container="safetensors"))
    h = torch.randn(5, 32)
    with torch.no_grad():
        ref = []
        for i in range(3):
            x = h
            for w, bias in blocks[i]:
                x = x + torch.nn.functional.silu(x @ w.T + bias)
            ref.append(x @ lm[i].T)
        ref = torch.stack(ref, dim=-2)
        for heads in (a, b, c, d):
            torch.testing.assert_close(heads(h), ref, rtol=1e-5, atol=1e-5)


def test_medusa_without_bias_and_with_the_targets_lm_head(tmp_path):
    target = build_target("llama")
    blocks, _ = medusa_tensors(32, VOCAB, heads=2, layers=1, own_heads=False)
    heads = load_medusa(target, save_medusa_vllm(tmp_path, blocks, None, 32, VOCAB, bias=False, shared=True))
    h = torch.randn(3, 32)
    with torch.no_grad():
        x = h + torch.nn.functional.silu(h @ blocks[1][0][0].T)
        torch.testing.assert_close(heads(h)[:, 1], target.lm_head(x), rtol=1e-5, atol=1e-5)


def test_our_writer_round_trips(tmp_path):
    target = build_target("llama")
    blocks, lm = medusa_tensors(32, VOCAB, heads=2, layers=1)
    heads = load_medusa(target, save_medusa_vllm(tmp_path / "a", blocks, lm, 32, VOCAB))
    for legacy in (False, True):
        again = load_medusa(target, save_medusa(heads, target.config, tmp_path / f"b{legacy}", dtype=torch.float32,
                                                legacy=legacy))
        h = torch.randn(2, 32)
        with torch.no_grad():
            torch.testing.assert_close(again(h), heads(h), rtol=0, atol=0)


# -- heads that do not fit ---------------------------------------------------------------------


def test_medusa_hidden_size_mismatch(tmp_path):
    target = build_target("llama")
    blocks, lm = medusa_tensors(16, VOCAB, heads=2, layers=1)
    with pytest.raises(HeadFitError, match=r"hidden_size is 16 in the head but 32 in the target"):
        load_medusa(target, save_medusa_legacy(tmp_path, blocks, lm, 16, VOCAB))


def test_medusa_vocabulary_mismatch(tmp_path):
    target = build_target("llama")
    blocks, lm = medusa_tensors(32, 80, heads=2, layers=1)
    with pytest.raises(HeadFitError, match=r"vocab_size is 80 in the head but 96 in the target"):
        load_medusa(target, save_medusa_legacy(tmp_path, blocks, lm, 32, 80))


def test_medusa_missing_tensor(tmp_path):
    target = build_target("llama")
    blocks, lm = medusa_tensors(32, VOCAB, heads=2, layers=2)
    folder = save_medusa_legacy(tmp_path, blocks, lm, 32, VOCAB)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["medusa_num_layers"] = 3  # the file has two blocks per head
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadFitError, match=r"missing tensor 'heads.0.2.linear.weight'"):
        load_medusa(target, folder)


def test_mtp_layer_count_mismatch(tmp_path):
    save_target_with_mtp(tmp_path, "llama", n=1)
    deeper = build_target("llama", layers=3)
    with pytest.raises(HeadFitError, match=r"num_hidden_layers is 2 in the head but 3 in the target"):
        load_mtp_layers(deeper, tmp_path)


@pytest.mark.parametrize("field,kw", [("hidden_size", {"hidden": 64}), ("vocab_size", None)])
def test_mtp_size_mismatch(tmp_path, field, kw):
    save_target_with_mtp(tmp_path, "llama", n=1)
    other = build_target("llama", **(kw or {}))
    if field == "vocab_size":
        cfg = json.loads((tmp_path / "config.json").read_text())
        cfg["vocab_size"] = 128
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        msg = r"vocab_size is 128 in the head but 96 in the target"
    else:
        msg = r"hidden_size is 32 in the head but 64 in the target"
    with pytest.raises(HeadFitError, match=msg):
        load_mtp_layers(other, tmp_path)


def test_mtp_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    target, _, _ = save_target_with_mtp(tmp_path, "llama", n=1)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.2.eh_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadFitError, match=r"missing tensor 'eh_proj.weight'"):
        load_mtp_layers(target, tmp_path)


def test_mtp_layer_without_tensors(tmp_path):
    target, _, _ = save_target_with_mtp(tmp_path, "llama", n=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadFitError, match=r"num_nextn_predict_layers is 2 but the checkpoint has no tensors of MTP layer 1"):
        load_mtp_layers(target, tmp_path)


def test_a_folder_that_is_no_head(tmp_path):
    target = build_target("llama")
    target.save_pretrained(tmp_path)
    with pytest.raises(HeadFitError, match="neither MTP modules"):
        load_head(target, tmp_path)
