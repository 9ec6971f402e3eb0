"""DSpark / DFlash checkpoints named by hub id (``org/name``), read from the Hugging Face cache
(offline here), as ``checkpoint=`` or ``--draft-model``: the same drafts as their folder."""

import pytest
from dspark_fixtures import ToyTok, prompts, tiny_target, write_checkpoint
from helpers import offline_hub_cache, put_in_hub_cache

from lightspec_core import LightSpecError, MTPPipeline


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return offline_hub_cache(tmp_path, monkeypatch)


def run(target, **kw):
    pipe = MTPPipeline(target, ToyTok(), budget={"type": "static", "k": 4}, **kw)
    outs = pipe.generate(prompts(3, seed=3), max_new_tokens=10, ignore_eos=True)
    return [o.token_ids for o in outs], sum(o.stats.drafted for o in outs)


@pytest.mark.parametrize("kind, nested", [("dspark", False), ("dspark", True), ("dflash", False)])
def test_a_checkpoint_named_by_hub_id_drafts_as_its_folder_does(hub, tmp_path, kind, nested):
    target = tiny_target("qwen3")
    src = write_checkpoint(tmp_path / "src", target, kind=kind, nested=nested)
    put_in_hub_cache(hub, "org/block-drafter", src)
    plain, _ = run(target, strategy="none")
    local, drafted = run(target, strategy=kind, checkpoint=str(src))
    by_option, drafted_option = run(target, strategy=kind, checkpoint="org/block-drafter")
    by_draft_model, drafted_dm = run(target, strategy=kind, draft_model="org/block-drafter")
    assert local == by_option == by_draft_model == plain
    assert drafted > 0 and drafted == drafted_option == drafted_dm


def test_an_uncached_checkpoint_id_is_one_line_saying_how_to_get_it(hub):
    with pytest.raises(LightSpecError) as err:
        MTPPipeline(tiny_target("qwen3"), ToyTok(), strategy="dspark", checkpoint="org/not-here")
    msg = str(err.value)
    assert "DSpark/DFlash checkpoint 'org/not-here' is not (fully) in the Hugging Face cache" in msg
    assert "`hf download org/not-here`" in msg and "\n" not in msg


def test_a_draft_model_id_that_is_no_block_drafter_is_named(hub, tmp_path):
    target = tiny_target("qwen3")
    cfg = tmp_path / "plain"
    cfg.mkdir()
    (cfg / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 1}')
    put_in_hub_cache(hub, "org/plain-lm", cfg)
    with pytest.raises(LightSpecError, match="--draft-model 'org/plain-lm' is no DSpark/DFlash folder"):
        MTPPipeline(target, ToyTok(), strategy="dspark", draft_model="org/plain-lm")


def test_shrink_vocab_command_takes_a_hub_id(hub, tmp_path):
    """``lightspec dspark shrink-vocab --drafter org/name``: the checkpoint read from the cache,
    the restricted one written in the public layout and loadable against its target."""
    import json

    import numpy as np
    from click.testing import CliRunner
    from lightspec_core.cli import cli

    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    put_in_hub_cache(hub, "org/block-drafter", write_checkpoint(tmp_path / "src", target))
    np.random.default_rng(0).integers(3, 40, 2000).astype(np.uint16).tofile(tmp_path / "tokens.bin")
    r = CliRunner().invoke(cli, ["dspark", "shrink-vocab", "--drafter", "org/block-drafter", "--target",
                                 str(tmp_path / "target"), "--data", str(tmp_path / "tokens.bin"), "--draft-vocab", "24",
                                 "--out", str(tmp_path / "small"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["draft_vocab_size"] == 24
    out, drafted = run(target, strategy="dspark", checkpoint=str(tmp_path / "small"))
    assert out == run(target, strategy="none")[0] and drafted > 0


def test_a_plain_draft_lm_id_is_judged_by_its_config_alone(tmp_path, monkeypatch):
    """``--draft-model org/plain-lm`` that is no block drafter: only its config.json is fetched."""
    from helpers import fake_online_hub

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    hub = fake_online_hub(plain, monkeypatch)
    with pytest.raises(LightSpecError, match="is no DSpark/DFlash folder"):
        MTPPipeline(tiny_target("qwen3"), ToyTok(), strategy="dspark", draft_model="org/plain-lm")
    assert hub["calls"] == [("org/plain-lm", None, ["config.json"], False)]
