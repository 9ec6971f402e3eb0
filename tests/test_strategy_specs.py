"""Strategies named with options, ``NAME:OPTION=VALUE,...`` (the syntax ``--budget`` takes):
through the API (``MTPPipeline(strategy="ngram:max_draft=2")``), ``lightspec run``,
``lightspec bench`` and the server's default strategy; a misspelt name or option is one
error naming it and what is allowed, raised before any model loads."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import cached_tiny, run_cli, save_tiny, tiny_tokenizer
from lightspec_core.plugins import get_registry
from lightspec_core.server import start_server
from lightspec_core.strategy_files import check_strategy_spec, strategy_spec
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts

from lightspec_core import ConfigError, LightSpecError, MTPPipeline, hookimpl


class DraftedSink:
    """Records the widest draft of any row in any step."""

    def __init__(self):
        self.widest = 0

    @hookimpl
    def lightspec_on_stats(self, event):
        if event.kind == "step":
            self.widest = max([self.widest, *event.drafted])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("spec_model")))


@pytest.mark.parametrize("text, options, spec", [
    ("ngram", None, {"type": "ngram"}),
    ("ngram:max_draft=2", None, {"type": "ngram", "max_draft": 2}),
    ("ngram: max_draft=2 , min_accept=0.5", {"min_ngram": 2},
     {"type": "ngram", "max_draft": 2, "min_accept": 0.5, "min_ngram": 2}),
    ("dynamic_tree:adaptive=false,drafter=ngram", None, {"type": "dynamic_tree", "adaptive": False, "drafter": "ngram"}),
])
def test_strategy_spec_reads_a_name_with_options(text, options, spec):
    assert strategy_spec(text, options) == spec


@pytest.mark.parametrize("text, options, needle", [
    ("ngram:max_draft=2", {"max_draft": 3}, "option 'max_draft' is given both in the strategy text and as a keyword"),
    ("ngram:max_draft", None, "'max_draft' is not OPTION=VALUE; use NAME, NAME:OPTION=VALUE,... or a YAML file "
                              "(e.g. eagle3:max_draft=4)"),
    ("ngram:", None, "has no options after ':'"),
    ("ngram:max_draft=2,max_draft=3", None, "option 'max_draft' is given twice"),
])
def test_strategy_spec_errors_name_the_bad_part(text, options, needle):
    with pytest.raises(ConfigError) as exc:
        strategy_spec(text, options)
    assert needle in str(exc.value)


@pytest.mark.parametrize("text, needle", [
    ("nope:k=1", "strategy 'nope:k=1': unknown strategy 'nope'; available: "),
    ("ngram:maxdraft=3", "strategy 'ngram:maxdraft=3': strategy 'ngram' has no option 'maxdraft'; allowed: "
                         "max_draft, max_ngram, min_accept, min_ngram"),
])
def test_check_strategy_spec_refuses_unknown_names_and_options(text, needle):
    with pytest.raises(ConfigError) as exc:
        check_strategy_spec(text, get_registry())
    assert needle in str(exc.value)
    check_strategy_spec("ngram:max_draft=3", get_registry())  # a good one passes
    check_strategy_spec("no/such/file.yaml", get_registry())  # files are checked when built


def test_the_pipeline_builds_the_strategy_with_its_inline_options():
    model, tok = cached_model("llama"), ToyTokenizer()
    prompts = make_prompts(4, seed=5)  # without the option, n-gram lookup drafts up to 4 tokens on these
    refs = [hf_greedy(model, p, 12) for p in prompts]
    drafted = DraftedSink()
    pipe = MTPPipeline(model, tok, strategy="ngram:max_draft=2,min_ngram=1,min_accept=0", budget="static:k=4", sinks=[drafted])
    assert (pipe.strategy.max_draft, pipe.strategy.min_accept) == (2, 0.0)
    assert pipe.strategy_name == "ngram:max_draft=2,min_ngram=1,min_accept=0"
    out = pipe.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert drafted.widest == 2  # the budget asked for 4; the inline max_draft held it to 2
    # keywords add options to the text's; the same option both ways is refused
    assert MTPPipeline(model, tok, strategy="ngram:max_draft=2", min_ngram=3).strategy.min_ngram == 3
    with pytest.raises(ConfigError, match="option 'max_draft' is given both"):
        MTPPipeline(model, tok, strategy="ngram:max_draft=2", max_draft=3)
    with pytest.raises(ConfigError, match=r"max_draft=0 is invalid: use an integer >= 1"):
        MTPPipeline(model, tok, strategy="ngram:max_draft=0")


def test_the_pipeline_takes_a_strategy_mapping():
    model, tok = cached_model("llama"), ToyTokenizer()
    pipe = MTPPipeline(model, tok, strategy={"type": "ngram", "max_draft": 2}, min_accept=0.5)
    assert (pipe.strategy.max_draft, pipe.strategy.min_accept, pipe.strategy_name) == (2, 0.5, "ngram")
    assert pipe.strategy_source == {"type": "ngram", "max_draft": 2, "min_accept": 0.5}
    with pytest.raises(ConfigError, match="strategy 'ngram' has no option 'maxdraft'"):
        MTPPipeline(model, tok, strategy={"type": "ngram", "maxdraft": 2})
    with pytest.raises(ConfigError, match="option 'max_draft' is given both"):
        MTPPipeline(model, tok, strategy={"type": "ngram", "max_draft": 2}, max_draft=3)


def test_from_pretrained_refuses_a_bad_strategy_before_loading_the_model():
    # the folder does not exist: the strategy's error proves it was checked first
    with pytest.raises(ConfigError, match="strategy 'ngram' has no option 'maxdraft'"):
        MTPPipeline.from_pretrained("/does/not/exist", strategy="ngram:maxdraft=3")


@pytest.mark.parametrize("cmd", ["run", "bench"])
@pytest.mark.parametrize("strategy, needle", [
    ("nope", "unknown strategy 'nope'; available:"),
    ("ngram:maxdraft=3", "strategy 'ngram' has no option 'maxdraft'; allowed: max_draft, max_ngram"),
    ("ngram:max_draft", "'max_draft' is not OPTION=VALUE"),
])
def test_cli_refuses_a_bad_strategy_in_one_line_before_loading(cmd, strategy, needle, capsys):
    args = [cmd, "--model", "/does/not/exist", "--strategy", strategy]
    args += ["--prompt", "abc"] if cmd == "run" else ["--suite", "default", "--no-hf"]
    rc, out, err = run_cli(args, capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc != 0 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_cli_run_and_bench_take_a_strategy_with_options(capsys, model_dir, tmp_path):
    steps_file = tmp_path / "steps.jsonl"
    rc, out, err = run_cli(["run", "--model", model_dir, "--strategy", "ngram:max_draft=1", "--budget", "static:k=4",
                            "--prompt", "the cat the cat the cat the cat", "--max-new-tokens", "8", "--ignore-eos",
                            "--stats-out", str(steps_file), "--json"], capsys)
    assert rc == 0, err
    steps = [json.loads(line) for line in steps_file.read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    assert steps and all(max(s["drafted"]) <= 1 for s in steps)  # the inline max_draft caps the budget's k=4
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    out_json = tmp_path / "b.json"
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--strategy", "none",
                            "--strategy", "ngram:max_draft=2", "--no-hf", "--max-new-tokens", "4",
                            "--json", str(out_json)], capsys)
    assert rc == 0, err
    (w,) = json.loads(out_json.read_text())["runs"][0]["workloads"].values()
    assert [r["name"] for r in w["results"]] == ["none", "ngram:max_draft=2"]
    assert all(r["error"] is None and r["tokens"] == 2 * 4 for r in w["results"])


@pytest.mark.parametrize("kind", ["text", "mapping", "yaml"])
def test_the_server_serves_its_default_strategy_as_it_was_given(kind, tmp_path):
    """The server builds a pipeline per request group from what built the default strategy:
    a name with options, a mapping, a YAML file (whose strategy's name is not registered)."""
    model, _ = cached_tiny()
    tok = tiny_tokenizer()
    strategy, label = {"text": ("ngram:max_draft=2", "ngram:max_draft=2"),
                       "mapping": ({"type": "ngram", "max_draft": 2}, "ngram"),
                       "yaml": (str(tmp_path / "s.yaml"), "lookup2")}[kind]
    (tmp_path / "s.yaml").write_text("strategies:\n  - {name: lookup2, type: combination, kind: switch, "
                                     "components: [{type: ngram, max_draft: 2}, {type: ngram, max_draft: 1}]}\n")
    pipe = MTPPipeline(model, tok, strategy=strategy)
    handle = start_server(pipe, port=0, batch_size=2, max_queue=8, model_name="tiny")
    try:
        offline = MTPPipeline(model, tok, strategy="none")
        prompt = "one two three four one two three"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
        for extra in ({}, {"strategy": label}):
            r = httpx.post(handle.url + "/v1/completions", json={**body, **extra}, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == offline.generate(prompt, max_new_tokens=10, ignore_eos=True).text
            assert r.json()["usage"]["speculation"]["strategy"] == label
        group = next(g for g in handle.app.state.scheduler.groups.values() if g.key[0] == label)
        assert group.pipe.strategy_source == strategy  # the group's pipeline is built as the default was
    finally:
        handle.stop()


def test_the_server_refuses_a_default_strategy_object_it_cannot_build_again():
    from lightspec_core.server import build_app
    from lightspec_core.strategies.ngram import NgramDrafter

    model, _ = cached_tiny()
    for name in ("my_lookup", "ngram"):  # rebuilt by a registered name, its options would be lost
        strategy = NgramDrafter(max_draft=2)
        strategy.name = name
        pipe = MTPPipeline(model, tiny_tokenizer(), strategy=strategy)
        with pytest.raises(LightSpecError, match="its default strategy must be a name, NAME:OPTION=VALUE,..., a "
                                                 f"mapping or a YAML file, not the object '{name}'"):
            build_app(pipe)


def test_the_server_configures_each_group_as_the_served_pipeline():
    """A pipeline built with a budget, a verifier and the HF forward is served with them
    (each group's pipeline is built again); a budget object, which holds one pipeline's
    state, is refused."""
    from lightspec_core.budget import DynamicBudget, StaticBudget
    from lightspec_core.server import build_app

    model, _ = cached_tiny()
    tok = tiny_tokenizer()
    pipe = MTPPipeline(model, tok, strategy="ngram", budget="static:k=2", lean_target=False)
    handle = start_server(pipe, port=0, batch_size=2, max_queue=8, model_name="tiny")
    try:
        body = {"model": "tiny", "prompt": "one two three one two three", "max_tokens": 6, "temperature": 0}
        for strategy in ("ngram", "none"):
            r = httpx.post(handle.url + "/v1/completions", json={**body, "strategy": strategy}, timeout=60)
            assert r.status_code == 200, r.text
        groups = {g.key[0]: g.pipe for g in handle.app.state.scheduler.groups.values()}
        for served in groups.values():
            assert served.rebuild_options == {"lean_target": False, "verifier": "standard", "budget": "static:k=2"}
            assert isinstance(served.budget, StaticBudget) and served.budget.k == 2
    finally:
        handle.stop()
    with pytest.raises(LightSpecError, match="its budget must be a name, NAME:OPTION=VALUE,..., a mapping or a YAML "
                                             "file, not the object"):
        build_app(MTPPipeline(model, tok, strategy="ngram", budget=DynamicBudget()))
