"""lightspec-eagle3 is installed, discovered through the ``lightspec.plugins`` entry point,
registers the ``eagle3`` strategy with its parameters and the ``lightspec eagle3`` command."""

import json
from importlib.metadata import entry_points

from click.testing import CliRunner
from lightspec_core.plugins import get_registry

from lightspec_core import LightSpecError


def test_eagle3_entry_point_declared():
    eps = [ep for ep in entry_points(group="lightspec.plugins") if ep.name == "eagle3"]
    assert len(eps) == 1, "lightspec-eagle3 is not installed (pip install -e plugins/lightspec-eagle3)"
    assert eps[0].value == "lightspec_eagle3.plugin"
    assert eps[0].dist.metadata["Name"] == "lightspec-eagle3"


def test_eagle3_plugin_discovered(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    try:
        registry = get_registry(reload=True)
        assert "eagle3" in registry.plugins, [str(f) for f in registry.failures]
        info = registry.plugins["eagle3"]
        assert info.distribution == "lightspec-eagle3"
        assert {"lightspec_register_strategies", "lightspec_register_commands"} <= set(info.hooks)
        assert "strategy:eagle3" in info.components
        assert not [f for f in registry.failures if f.name == "eagle3"]
    finally:
        get_registry(reload=True)


def test_strategies_lists_eagle3_parameters():
    from lightspec_core.cli import cli

    r = CliRunner().invoke(cli, ["strategies", "--json"])
    assert r.exit_code == 0, r.output
    text = json.dumps(json.loads(r.output))
    for word in ("eagle3", "head", "max_draft", "top_k_probs"):
        assert word in text
    assert "train" in CliRunner().invoke(cli, ["eagle3", "--help"]).output


def test_bad_options_refused():
    import pytest

    registry = get_registry()
    with pytest.raises(LightSpecError, match="max_draft=0"):
        registry.create("strategy", "eagle3", max_draft=0)
    with pytest.raises(Exception, match="nope"):
        registry.create("strategy", "eagle3", nope=1)


def test_without_a_head_setup_says_how_to_get_one(tmp_path):
    import pytest
    from e3_fixtures import tiny_target

    from lightspec_core import MTPPipeline

    class Tok:
        eos_token_id, pad_token_id = 2, 0

        def __len__(self):
            return 96

    with pytest.raises(LightSpecError, match="needs an EAGLE-3 head"):
        MTPPipeline(tiny_target(), Tok(), strategy="eagle3")
    with pytest.raises(LightSpecError, match="no such folder"):
        MTPPipeline(tiny_target(), Tok(), strategy="eagle3", head=str(tmp_path / "missing"))


def test_auto_takes_draft_model_only_when_it_is_a_head(tmp_path):
    import pytest
    from e3_fixtures import random_head, tiny_target, write_layout
    from transformers import LlamaConfig, LlamaForCausalLM

    from lightspec_core import MTPPipeline

    class Tok:
        eos_token_id, pad_token_id = 2, 0

        def __len__(self):
            return 96

    target = tiny_target()
    one_layer = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4))
    one_layer.save_pretrained(tmp_path / "plain")
    with pytest.raises(LightSpecError, match="needs an EAGLE-3 head"):
        MTPPipeline(target, Tok(), strategy="eagle3", draft_model=str(tmp_path / "plain"))
    write_layout(tmp_path / "head", random_head(target), "eagle")
    from models import ToyTokenizer

    pipe = MTPPipeline(target, ToyTokenizer(96), strategy="eagle3", draft_model=str(tmp_path / "head"))
    assert len(pipe.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True)[0].token_ids) == 3
