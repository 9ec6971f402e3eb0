"""EAGLE-3 heads named as users of vLLM and SGLang name them: a hub id (``org/name``), read from
the Hugging Face cache (offline here), as ``head=`` or ``--draft-model``; and the EAGLE reference
code's ``pytorch_model.bin`` heads found through ``--draft-model``."""

import pytest
import torch
from e3_fixtures import random_head, tiny_target, write_layout
from helpers import offline_hub_cache, put_in_hub_cache
from models import ToyTokenizer
from safetensors.torch import load_file

from lightspec_core import LightSpecError, MTPPipeline

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return offline_hub_cache(tmp_path, monkeypatch)


def run(target, **kw):
    pipe = MTPPipeline(target, ToyTokenizer(96), budget="static:k=3", **kw)
    outs = pipe.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    return [o.token_ids for o in outs], sum(o.stats.drafted for o in outs)


def as_reference_bin(folder):
    """The EAGLE reference code's container: ``pytorch_model.bin`` instead of safetensors."""
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_head_named_by_hub_id_drafts_as_its_folder_does(hub, tmp_path):
    target = tiny_target()
    src = write_layout(tmp_path / "src", random_head(target), "eagle")
    put_in_hub_cache(hub, "org/eagle3-head", src)
    plain, _ = run(target, strategy="none")
    local, drafted = run(target, strategy="eagle3", head=str(src))
    by_option, drafted_option = run(target, strategy="eagle3", head="org/eagle3-head")
    by_draft_model, drafted_dm = run(target, strategy="eagle3", draft_model="org/eagle3-head")
    assert local == by_option == by_draft_model == plain
    assert drafted > 0 and drafted == drafted_option == drafted_dm


def test_a_reference_bin_head_is_found_through_draft_model(hub, tmp_path):
    target = tiny_target()
    src = as_reference_bin(write_layout(tmp_path / "src", random_head(target), "eagle"))
    put_in_hub_cache(hub, "org/eagle3-bin", src)
    plain, _ = run(target, strategy="none")
    for name in (str(src), "org/eagle3-bin"):
        out, drafted = run(target, strategy="eagle3", draft_model=name)
        assert out == plain and drafted > 0, name


def test_an_uncached_head_id_is_one_line_saying_how_to_get_it(hub):
    with pytest.raises(LightSpecError) as err:
        MTPPipeline(tiny_target(), ToyTokenizer(96), strategy="eagle3", head="org/not-here")
    msg = str(err.value)
    assert "EAGLE-3 head 'org/not-here' is not (fully) in the Hugging Face cache" in msg
    assert "`hf download org/not-here`" in msg and "\n" not in msg


def test_an_uncached_draft_model_id_is_not_taken_for_a_head(hub):
    """``--draft-model`` may name a plain draft LM for another strategy of a composition: an id
    that is not a head (here: not even cached) leaves ``auto`` to its other choices."""
    with pytest.raises(LightSpecError, match="needs an EAGLE-3 head"):
        MTPPipeline(tiny_target(), ToyTokenizer(96), strategy="eagle3", draft_model="org/plain-lm")


def test_shrink_vocab_takes_a_hub_id(hub, tmp_path):
    import numpy as np
    from click.testing import CliRunner
    from lightspec_core.cli import cli
    from test_eagle3_drafter import _save_tokenizer

    target = tiny_target()
    folder = tmp_path / "target"
    target.save_pretrained(folder)
    _save_tokenizer(folder)
    put_in_hub_cache(hub, "org/eagle3-full", write_layout(tmp_path / "src", random_head(target, "full_vocab"), "full_vocab"))
    np.random.default_rng(0).integers(3, 40, 2000).astype(np.uint16).tofile(tmp_path / "tokens.bin")
    r = CliRunner().invoke(cli, ["eagle3", "shrink-vocab", "--head", "org/eagle3-full", "--target", str(folder), "--data",
                                 str(tmp_path / "tokens.bin"), "--draft-vocab", "20", "--out", str(tmp_path / "small"), "--json"])
    assert r.exit_code == 0, r.output
    assert '"draft_vocab_size": 20' in r.output


def test_a_plain_draft_lm_id_is_judged_by_its_config_alone(tmp_path, monkeypatch):
    """``--draft-model org/plain-lm`` (a multi-layer draft LM for another strategy of the run) is
    not an EAGLE-3 head: ``auto`` asks the hub for its config.json only, never its weights."""
    import json

    from helpers import fake_online_hub

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 96}))
    hub = fake_online_hub(plain, monkeypatch)
    with pytest.raises(LightSpecError, match="needs an EAGLE-3 head"):
        MTPPipeline(tiny_target(), ToyTokenizer(96), strategy="eagle3", draft_model="org/plain-lm")
    assert hub["calls"] == [("org/plain-lm", None, ["config.json"], False)]
