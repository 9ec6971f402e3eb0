"""Budget policies and statistics sinks named with options: ``NAME:OPTION=VALUE,...``, YAML
files, mappings and objects, through the API (``MTPPipeline(budget=..., sinks=[...])``),
a strategy file's ``sinks:``, ``lightspec run --budget/--sink`` and ``lightspec bench
--budget`` (repeatable)."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest
from helpers import run_cli, save_tiny
from lightspec_core.budget import DynamicBudget, FeedbackBudget, StaticBudget
from lightspec_core.component_spec import build_component, parse_spec
from lightspec_core.plugins import get_registry
from lightspec_core.stats import JsonlSink, LogSink
from lightspec_core.strategy_files import load_strategy_file
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts

from lightspec_core import ConfigError, LightSpecError, MTPPipeline, hookimpl


@pytest.mark.parametrize("text, spec", [
    ("dynamic", {"type": "dynamic"}),
    ("static:k=2", {"type": "static", "k": 2}),
    ("dynamic:max_draft=6,guard=false", {"type": "dynamic", "max_draft": 6, "guard": False}),
    ("feedback: alpha=0.6 , min_ratio=0", {"type": "feedback", "alpha": 0.6, "min_ratio": 0}),
    ("dynamic:beta=1e-3", {"type": "dynamic", "beta": 0.001}),
    ("jsonl:path=out/steps.jsonl", {"type": "jsonl", "path": "out/steps.jsonl"}),
])
def test_parse_spec_reads_options_as_yaml_scalars(text, spec):
    got = parse_spec(text, "budget")
    assert got == spec and [type(v) for v in got.values()] == [type(v) for v in spec.values()]


def test_parse_spec_reads_yaml_files(tmp_path):
    plain = tmp_path / "b.yaml"
    plain.write_text("type: static\nk: 2\n")
    nested = tmp_path / "run.yml"
    nested.write_text("budget:\n  type: feedback\n  alpha: 0.6\nother: 1\n")
    assert parse_spec(str(plain), "budget") == {"type": "static", "k": 2}
    assert parse_spec(str(nested), "budget") == {"type": "feedback", "alpha": 0.6}
    bad = tmp_path / "bad.yaml"
    bad.write_text("k: 2\n")
    with pytest.raises(ConfigError, match="expected a mapping with a string key 'type'"):
        parse_spec(str(bad), "budget")
    with pytest.raises(ConfigError, match="budget file '/no/such.yaml' does not exist"):
        parse_spec("/no/such.yaml", "budget")


@pytest.mark.parametrize("text, needle", [
    ("static:k", "'k' is not OPTION=VALUE"),
    ("static:", "has no options after ':'"),
    (":k=2", "has no name"),
    ("static:k=", "option 'k' has no value"),
    ("static:k=1,k=2", "option 'k' is given twice"),
    ("static:k=[1]", "option 'k' has value '[1]'; allowed: a number, true/false or a string"),
    ("", "is invalid; use NAME, NAME:OPTION=VALUE,... or a YAML file"),
])
def test_parse_spec_errors_name_the_bad_part(text, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(text, "budget")


@pytest.mark.parametrize("spec, needle", [
    ("nope", "unknown budget 'nope'; available: dynamic, feedback, static"),
    ("static:j=2", "budget 'static' has no option 'j'; allowed: k"),
    ("static:k=-1", "budget 'static': k=-1 is invalid: use an integer >= 0; options: k"),
    ("feedback:alpha=2", "budget 'feedback': alpha=2 is invalid: use a number in [0, 1)"),
    ("dynamic:guard=maybe", "budget 'dynamic': guard='maybe' is invalid: use true or false"),
    ({"k": 2, "type": 3}, "needs a string key 'type'; available: dynamic, feedback, static"),
])
def test_bad_budgets_are_one_error_naming_the_bad_value_and_what_is_allowed(spec, needle):
    with pytest.raises(LightSpecError) as info:
        build_component("budget", spec, get_registry(), default_type="dynamic")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_bad_sinks_are_one_error_too():
    with pytest.raises(LightSpecError, match="sink 'jsonl': .*path.*; options: path"):
        build_component("sink", "jsonl", get_registry())
    with pytest.raises(LightSpecError, match="does not implement lightspec_on_stats"):
        build_component("sink", object(), get_registry())


class Counter:
    name = "counter"

    def __init__(self):
        self.steps = 0

    @hookimpl
    def lightspec_on_stats(self, event):
        self.steps += event.kind == "step"


def test_the_pipeline_takes_budget_and_sink_specs(tmp_path):
    model, tok = cached_model("llama"), ToyTokenizer()
    prompts = make_prompts(3, seed=5)
    refs = [hf_greedy(model, p, 12) for p in prompts]
    path = tmp_path / "steps.jsonl"
    counter = Counter()
    pipe = MTPPipeline(model, tok, strategy="ngram", min_ngram=1, budget="static:k=2",
                       sinks=[f"jsonl:path={path}", {"type": "log", "interval_s": 60}, counter])
    assert isinstance(pipe.budget, StaticBudget) and pipe.budget.k == 2
    assert [type(s) for s in pipe.sinks] == [JsonlSink, LogSink, Counter] and pipe.sinks[1].interval_s == 60
    out = pipe.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    pipe.sinks[0].close()
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    assert steps and len(steps) == counter.steps and max(max(s["drafted"]) for s in steps) <= 2
    assert pipe.sinks[1].verifies == sum(len(s["row_ids"]) for s in steps)  # the log sink heard every row
    yaml_budget = tmp_path / "budget.yaml"
    yaml_budget.write_text("budget: {type: feedback, alpha: 0.6}\n")
    assert MTPPipeline(model, tok, strategy="none", budget=str(yaml_budget)).budget.alpha == 0.6
    assert isinstance(MTPPipeline(model, tok, strategy="none", budget={"max_draft": 4}).budget, DynamicBudget)
    with pytest.raises(LightSpecError, match=r"sinks='log' is invalid: use a list"):
        MTPPipeline(model, tok, strategy="none", sinks="log")
    with pytest.raises(LightSpecError, match=r"sinks\[1\]: unknown sink 'nope'; available: jsonl, log"):
        MTPPipeline(model, tok, strategy="none", sinks=["log", "nope"])


def test_a_strategy_file_selects_sinks(tmp_path):
    path = tmp_path / "steps.jsonl"
    text = textwrap.dedent(f"""
        strategies:
          - name: mine
            type: ngram
            min_ngram: 1
            budget: feedback
        sinks:
          - log
          - {{type: jsonl, path: {path}}}
    """)
    f = tmp_path / "s.yaml"
    f.write_text(text)
    strategy, budget, sinks = load_strategy_file(f, get_registry())
    assert budget == "feedback" and sinks == ["log", {"type": "jsonl", "path": str(path)}]
    model = cached_model("llama")
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=str(f), sinks=[Counter()])
    assert isinstance(pipe.budget, FeedbackBudget)
    assert [type(s) for s in pipe.sinks] == [LogSink, JsonlSink, Counter]  # the file's, then the caller's
    pipe.generate(make_prompts(2, seed=1), max_new_tokens=6, ignore_eos=True)
    pipe.sinks[1].close()
    assert pipe.sinks[2].steps > 0 and len(path.read_text().splitlines()) >= pipe.sinks[2].steps
    f.write_text(text.replace("  - log\n", "").replace("sinks:\n", "sinks: log\n").replace(f"  - {{type: jsonl, path: {path}}}\n", ""))
    with pytest.raises(ConfigError, match="key 'sinks' must be a list of sink names or mappings"):
        load_strategy_file(f, get_registry())
    f.write_text(text.replace("  - log", "  - nope"))
    with pytest.raises(LightSpecError, match=r"s.yaml: sinks\[0\]: unknown sink 'nope'"):
        MTPPipeline(model, ToyTokenizer(), strategy=str(f))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("spec_model")))


@pytest.mark.parametrize("args, needle", [
    (["--budget", "static:j=2"], "--budget: budget 'static' has no option 'j'; allowed: k"),
    (["--budget", "nope"], "--budget: unknown budget 'nope'; available: dynamic, feedback, static"),
    (["--budget", "static:k=-1"], "k=-1 is invalid: use an integer >= 0"),
    (["--budget", "static:k"], "--budget: budget 'static:k': 'k' is not OPTION=VALUE"),
    (["--sink", "nope"], "--sink: unknown sink 'nope'; available: jsonl, log"),
    (["--sink", "jsonl:path=a.jsonl,colour=red"], "--sink: sink 'jsonl' has no option 'colour'; allowed: path"),
])
def test_cli_run_rejects_bad_budgets_and_sinks_in_one_line(args, needle, capsys, model_dir):
    rc, out, err = run_cli(["run", "--model", model_dir, "--prompt", "the cat", *args], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc != 0 and len(lines) == 1 and needle in lines[0], err
    assert "loading model" not in err  # rejected before the model loads


def test_cli_run_uses_the_budget_and_sinks_given(capsys, model_dir, tmp_path, caplog):
    path = tmp_path / "steps.jsonl"
    with caplog.at_level(logging.INFO, logger="lightspec.stats"):
        rc, out, err = run_cli(["run", "--model", model_dir, "--strategy", "ngram", "--prompt", "the cat the cat the cat",
                                "--max-new-tokens", "6", "--budget", "static:k=1", "--sink", f"jsonl:path={path}",
                                "--sink", "log:interval_s=3600", "--json"], capsys)
    assert rc == 0, err
    steps = [json.loads(line) for line in path.read_text().splitlines()]  # flushed when the command ended
    steps = [s for s in steps if s["kind"] == "step"]
    assert steps and all(max(s["drafted"]) <= 1 for s in steps)
    assert any("SpecDecoding metrics" in r.getMessage() for r in caplog.records)  # the log sink's last line


def test_cli_bench_measures_a_strategy_under_several_budgets(capsys, model_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    out_json = tmp_path / "b.json"
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--strategy", "none",
                            "--strategy", "ngram", "--budget", "static:k=2", "--budget", "feedback", "--no-hf",
                            "--max-new-tokens", "4", "--json", str(out_json)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    (w,) = report["runs"][0]["workloads"].values()
    assert [r["name"] for r in w["results"]] == ["none", "ngram[static:k=2]", "ngram[feedback]"]
    assert all(r["error"] is None and r["tokens"] == 2 * 4 for r in w["results"])
    assert report["budgets"] == ["static:k=2", "feedback"]
    rc, out, err = run_cli(["bench", "--model", model_dir, "--prompts", str(prompts), "--budget", "static:k=x,j=1",
                            "--no-hf"], capsys)
    assert rc != 0 and "budget 'static' has no option 'j'; allowed: k" in err
