"""A third-party plugin package (``tests/example_plugin``, distribution
``lightspec-example-plugin``) is pip-installed into the current environment, then used by
name from the Python API and from the CLI; the session uninstalls it again at its end when it
installed it."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest
import torch
from helpers import cached_tiny, ensure_example_plugin, hf_reference, remove_example_plugin, save_tiny


@pytest.fixture(scope="session")
def example_plugin():
    installed = ensure_example_plugin()
    from lightspec_core.plugins import get_registry

    yield get_registry(reload=True, allow=None, strict=False)
    if installed:
        remove_example_plugin()
        get_registry(reload=True)


@pytest.fixture
def fresh_registry(monkeypatch, example_plugin):
    """Plugins reloaded from the environment with no allow-list and no strict mode."""
    from lightspec_core import plugins

    monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    reg = plugins.get_registry(reload=True)
    yield reg
    plugins.get_registry(reload=True)


def _until_eos(ids, eos=2):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def test_example_plugin_is_an_installed_distribution(example_plugin):
    dist = md.distribution("lightspec-example-plugin")
    eps = [ep for ep in dist.entry_points if ep.group == "lightspec.plugins"]
    assert [(ep.name, ep.value) for ep in eps] == [("example", "lightspec_example.plugin")]


def test_example_plugin_registered_with_its_hooks(fresh_registry):
    info = fresh_registry.plugins.get("example")
    assert info is not None, [str(f) for f in fresh_registry.failures]
    assert info.distribution == "lightspec-example-plugin"
    assert info.version == "0.1.0"
    assert set(info.hooks) == {"lightspec_register_strategies", "lightspec_on_stats", "lightspec_register_commands"}
    assert info.components == ["strategy:repeat_last"]
    comp = fresh_registry.get("strategy", "repeat_last")
    assert comp.plugin == "example" and set(comp.params) == {"n", "max_draft"}


def test_repeat_last_by_name_is_lossless(fresh_registry):
    from lightspec_example import plugin as example

    from lightspec_core import MTPPipeline

    model, tok = cached_tiny()
    prompts = ["the cat is big and the cat is", "one two one two one two", "x = y"]
    before = dict(example.STATS)
    pipe = MTPPipeline(model, tok, strategy="repeat_last", n=2, budget={"type": "static", "k": 3})
    assert type(pipe.strategy).__name__ == "RepeatLast" and pipe.strategy.n == 2
    results = pipe.generate(prompts, max_new_tokens=12)
    for p, r in zip(prompts, results):
        assert r.token_ids == _until_eos(hf_reference(model, tok, p, 12)), p
        assert r.stats.failures == []
        assert r.stats.drafted > 0
        assert len(r.stats.per_position_drafted) <= 3  # ctx.max_draft_list respected
    # the plugin's module-level lightspec_on_stats sink saw every step of this pipeline
    assert example.STATS["steps"] - before["steps"] == max(r.stats.steps for r in results)
    assert example.STATS["drafted"] - before["drafted"] == sum(r.stats.drafted for r in results)


def test_repeat_last_options_are_validated(fresh_registry):
    from lightspec_core import LightSpecError

    with pytest.raises(ValueError, match="n=0"):
        fresh_registry.create("strategy", "repeat_last", n=0)
    with pytest.raises(LightSpecError, match="no option 'k'"):
        fresh_registry.create("strategy", "repeat_last", k=3)


def test_repeat_last_proposal_contract(fresh_registry):
    from lightspec_core import SamplingParams, StepContext

    drafter = fresh_registry.create("strategy", "repeat_last", n=2, max_draft=5)
    ctx = StepContext(
        step=1, sequences=[[5, 6, 7], [9]], row_ids=[0, 1], max_draft=torch.tensor([3, 4]),
        max_draft_list=[3, 4], min_confidence=torch.zeros(2), sampling=SamplingParams(), generators=[],
        history=[], target=None, tokenizer=None, device=torch.device("cpu"), vocab_size=96,
    )
    p = drafter.lightspec_propose(ctx)
    assert p.tokens[0, :3].tolist() == [6, 7, 6]
    assert p.lengths.tolist() == [3, 0]  # row 1 is shorter than n: no draft
    ctx.max_draft_list = [0, 0]
    assert drafter.lightspec_propose(ctx) is None


# --- CLI ------------------------------------------------------------------------------


@pytest.fixture
def cli_runner(fresh_registry, monkeypatch):
    from click.testing import CliRunner

    from lightspec_core import cli as cli_mod

    monkeypatch.setattr(cli_mod.cli, "_plugins_loaded", False, raising=False)
    return CliRunner(), cli_mod.cli


def test_cli_strategies_lists_repeat_last(cli_runner):
    runner, cli = cli_runner
    res = runner.invoke(cli, ["strategies", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output) if r["kind"] == "strategy"}
    assert rows["repeat_last"]["plugin"] == "example"
    assert rows["repeat_last"]["distribution"] == "lightspec-example-plugin"
    assert set(rows["repeat_last"]["parameters"]) == {"n", "max_draft"}


def test_cli_plugins_lists_example(cli_runner):
    runner, cli = cli_runner
    res = runner.invoke(cli, ["plugins", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)["plugins"]}
    assert rows["example"]["distribution"] == "lightspec-example-plugin"
    assert rows["example"]["strategies"] == ["repeat_last"]


def test_cli_plugin_command_runs(cli_runner):
    runner, cli = cli_runner
    res = runner.invoke(cli, ["example-hello", "--name", "tester"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "hello tester from lightspec-example 0.1.0"


def test_cli_run_with_plugin_strategy(cli_runner, tmp_path):
    runner, cli = cli_runner
    folder = save_tiny(tmp_path / "tiny")
    prompt = "the cat is big and the cat is"
    res = runner.invoke(
        cli,
        ["run", "--model", str(folder), "--strategy", "repeat_last", "--prompt", prompt, "--max-new-tokens", "8", "--json"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out) == 1 and out[0]["prompt"] == prompt
    model, tok = cached_tiny()
    assert out[0]["token_ids"] == _until_eos(hf_reference(model, tok, prompt, 8))
    assert out[0]["stats"]["drafted"] > 0
