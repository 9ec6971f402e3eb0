"""The composer: YAML and Python combinations (switch, cascade) generate losslessly;
strategy-file errors name the file, the key and what is allowed; project defaults from
``lightspec.toml`` / ``[tool.lightspec]``.  One file just over 400 lines: every combination kind's
tests share the fixtures and fake components at its middle."""

from __future__ import annotations

import textwrap

import pytest
from lightspec_core.composer import Combination
from lightspec_core.config import KNOWN_KEYS, load_defaults
from lightspec_core.plugins import get_registry
from lightspec_core.strategy_files import build_strategy, load_strategy_file
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts

from lightspec_core import ConfigError, LightSpecError, MTPPipeline

PROMPTS = make_prompts(4, seed=11)
N_NEW = 16


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer()


@pytest.fixture(scope="module")
def refs():
    model = cached_model("qwen2")
    return [hf_greedy(model, p, N_NEW) for p in PROMPTS]


def write(tmp_path, text, name="strategy.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


SWITCH = """
strategies:
  - name: my_switch
    type: combination
    kind: switch
    components: [ngram, {type: draft_model, max_draft: 4}]
    switch_threshold: 0.5
    budget: {type: static, k: 4}
"""

CASCADE = """
strategies:
  - name: short_ngram
    type: ngram
    max_ngram: 3
    max_draft: 2
  - name: chain
    type: combination
    kind: cascade
    components: [short_ngram, draft_model]
  - name: unused
    type: none
default: chain
"""


@pytest.mark.parametrize("text,kind", [(SWITCH, "switch"), (CASCADE, "cascade")], ids=["switch", "cascade"])
@pytest.mark.parametrize("draft", ["small", "self"])
def test_yaml_strategies_are_lossless(tmp_path, tok, refs, text, kind, draft):
    path = write(tmp_path, text)
    model = cached_model("qwen2")
    draft_model = model if draft == "self" else cached_model("qwen2", 1, 1)
    pipe = MTPPipeline(model, tok, strategy=str(path), draft_model=draft_model,
                       budget=None if kind == "switch" else {"type": "static", "k": 5})
    assert isinstance(pipe.strategy, Combination) and pipe.strategy.kind == kind
    if kind == "switch":
        assert pipe.budget.name == "static" and pipe.budget.k == 4  # the file's budget
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert sum(o.stats.drafted for o in out) > 0
    if draft == "self":
        assert sum(o.stats.accepted for o in out) > 0
        sources = set().union(*(o.stats.sources for o in out))
        assert any("draft_model" in s for s in sources), sources
    # one request alone too
    one = pipe.generate([PROMPTS[2]], max_new_tokens=N_NEW, ignore_eos=True)[0]
    assert one.token_ids == refs[2]


def test_cascade_extends_the_first_draft(tmp_path):
    """The second component sees the first's draft as ctx.prefix and continues it."""
    path = write(tmp_path, CASCADE)
    strategy, budget, sinks = load_strategy_file(path, get_registry())
    assert budget is None and sinks is None
    assert [getattr(c, "name", "") for c in strategy.components] == ["ngram", "draft_model"]
    assert strategy.components[0].max_ngram == 3 and strategy.components[0].max_draft == 2


def test_python_composition_is_lossless(tok, refs):
    reg = get_registry()
    spec = {"type": "combination", "kind": "cascade", "components": ["ngram", {"type": "layerskip", "layers": 1}]}
    strat = build_strategy(spec, reg)
    model = cached_model("qwen2")
    pipe = MTPPipeline(model, tok, strategy=strat, budget={"type": "static", "k": 4})
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert sum(o.stats.drafted for o in out) > 0


def test_python_switch_with_threshold_one(tok, refs):
    """switch_threshold 1.0 routes (almost) everything to the last component; still lossless."""
    strat = build_strategy({"type": "combination", "kind": "switch", "switch_threshold": 1.0,
                            "components": ["ngram", "draft_model"]}, get_registry())
    model = cached_model("qwen2")
    pipe = MTPPipeline(model, tok, strategy=strat, draft_model=model, budget={"type": "static", "k": 3})
    out = pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    assert sum(o.stats.sources.get("draft_model", 0) for o in out) > 0


# --- errors --------------------------------------------------------------------------------


def expect_error(tmp_path, text, *needles):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_strategy_file(path, get_registry())
    msg = str(info.value)
    assert str(path) in msg, f"the file is not named: {msg}"
    for n in needles:
        assert n in msg, f"{n!r} not in: {msg}"
    assert "\n" not in msg.strip() or "YAML" in msg
    return msg


def combo(**fields):
    lines = ["strategies:", "  - name: combo", "    type: combination"]
    for k, v in fields.items():
        lines.append(f"    {k}: {v}")
    return "\n".join(lines) + "\n"


def test_error_unknown_component(tmp_path):
    msg = expect_error(tmp_path, combo(components="[ngram, nosuch_strategy]"), "components", "nosuch_strategy")
    assert "available" in msg or "allowed" in msg
    for builtin in ("ngram", "draft_model", "layerskip", "none"):
        assert builtin in msg


def test_error_components_not_a_list(tmp_path):
    expect_error(tmp_path, combo(components="ngram"), "'components'", "list")
    expect_error(tmp_path, combo(kind="switch"), "'components'", "list")  # missing


def test_error_too_few_components(tmp_path):
    expect_error(tmp_path, combo(components="[ngram]"), "at least 2")


@pytest.mark.parametrize("value", ["1.5", "high", "-0.1", "true"])
def test_error_bad_threshold(tmp_path, value):
    expect_error(tmp_path, combo(components="[ngram, layerskip]", switch_threshold=value), "switch_threshold",
                 "[0, 1]")


def test_error_bad_kind(tmp_path):
    expect_error(tmp_path, combo(components="[ngram, layerskip]", kind="parallel"), "kind", "parallel", "switch",
                 "cascade", "union")


def test_error_unknown_key(tmp_path):
    expect_error(tmp_path, combo(components="[ngram, layerskip]", colour="red"), "colour", "allowed", "components",
                 "switch_threshold")


def test_error_unknown_top_level_key(tmp_path):
    expect_error(tmp_path, SWITCH + "extra: 1\n", "extra", "allowed", "strategies", "default")


def test_error_unknown_component_option(tmp_path):
    text = "strategies:\n  - name: n\n    type: ngram\n    max_n: 3\n"
    expect_error(tmp_path, text, "max_n", "allowed", "max_ngram", "min_ngram", "max_draft")


def test_error_bad_component_option_value(tmp_path):
    text = "strategies:\n  - name: n\n    type: ngram\n    max_draft: 0\n"
    expect_error(tmp_path, text, "max_draft")


def test_error_nested_component_option(tmp_path):
    expect_error(tmp_path, combo(components="[ngram, {type: draft_model, depth: 3}]"), "components", "depth",
                 "max_draft")


def test_error_bad_default(tmp_path):
    expect_error(tmp_path, SWITCH + "default: other\n", "default", "other", "my_switch")


def test_error_structure(tmp_path):
    expect_error(tmp_path, "strategies: ngram\n", "strategies")
    expect_error(tmp_path, "- a\n- b\n", "strategies")
    expect_error(tmp_path, "strategies:\n  - type: ngram\n", "name")


def test_error_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_strategy_file(path, get_registry())
    assert str(path) in str(info.value) and "does not exist" in str(info.value)
    # through the pipeline as well (a LightSpecError, so the CLI prints one line)
    with pytest.raises(LightSpecError) as info:
        MTPPipeline(cached_model("qwen2"), ToyTokenizer(), strategy=str(path))
    assert str(path) in str(info.value)


def test_error_invalid_yaml(tmp_path):
    path = write(tmp_path, "strategies:\n  - name: a\n    type: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_strategy_file(path, get_registry())
    assert str(path) in str(info.value) and "not valid YAML" in str(info.value)


def test_yaml_is_safe_loaded(tmp_path):
    path = write(tmp_path, "strategies: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ConfigError) as info:
        load_strategy_file(path, get_registry())
    assert str(path) in str(info.value)


def test_error_union_without_tree_plugin(tmp_path):
    """With lightspec-tree left out (it is installed here), ``union`` names the plugin it needs."""
    reg = get_registry(reload=True, allow=[])  # built-ins only
    try:
        assert ("fusion", "tree_union") not in reg.components
        path = write(tmp_path, combo(kind="union", components="[ngram, layerskip]"))
        with pytest.raises(ConfigError) as info:
            load_strategy_file(path, reg)
        msg = str(info.value)
        assert str(path) in msg and all(n in msg for n in ("union", "tree_union", "lightspec-tree")), msg
    finally:
        get_registry(reload=True)


def test_strategy_options_with_file_rejected(tmp_path):
    path = write(tmp_path, SWITCH)
    with pytest.raises(LightSpecError, match="strategy file"):
        MTPPipeline(cached_model("qwen2"), ToyTokenizer(), strategy=str(path), max_draft=3)


# --- project defaults ------------------------------------------------------------------------


def test_defaults_from_lightspec_toml(tmp_path):
    assert load_defaults(tmp_path) == {}
    (tmp_path / "lightspec.toml").write_text('strategy = "ngram"\nmax_new_tokens = 32\ndevice = "cpu"\n')
    assert load_defaults(tmp_path) == {"strategy": "ngram", "max_new_tokens": 32, "device": "cpu"}


def test_defaults_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.lightspec]\nstrategy = "hybrid"\n'
                                             'budget = "static"\n')
    assert load_defaults(tmp_path) == {"strategy": "hybrid", "budget": "static"}
    # a pyproject without the table gives nothing
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_defaults(tmp_path) == {}


def test_lightspec_toml_wins_over_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.lightspec]\nstrategy = "hybrid"\n')
    (tmp_path / "lightspec.toml").write_text('strategy = "none"\n')
    assert load_defaults(tmp_path) == {"strategy": "none"}


@pytest.mark.parametrize("where", ["lightspec.toml", "pyproject.toml"])
def test_defaults_unknown_key(tmp_path, where):
    body = 'strategy = "ngram"\nstrategi = "x"\n'
    if where == "pyproject.toml":
        body = "[tool.lightspec]\n" + body
    (tmp_path / where).write_text(body)
    with pytest.raises(ConfigError) as info:
        load_defaults(tmp_path)
    msg = str(info.value)
    assert where in msg and "strategi" in msg and "allowed" in msg
    for k in KNOWN_KEYS:
        assert k in msg
    if where == "pyproject.toml":
        assert "[tool.lightspec]" in msg


def test_defaults_invalid_toml(tmp_path):
    (tmp_path / "lightspec.toml").write_text("strategy = \n")
    with pytest.raises(ConfigError) as info:
        load_defaults(tmp_path)
    assert "lightspec.toml" in str(info.value) and "TOML" in str(info.value)


class _Fixed:
    """A component that drafts a fixed chain, cut to its row's limit, and records its limits."""

    def __init__(self, name, tokens):
        self.name, self.tokens, self.limits = name, tokens, []

    def lightspec_propose(self, ctx):
        import torch

        from lightspec_core import DraftProposal

        self.limits.append(list(ctx.max_draft_list))
        free = ctx.free_max_draft_list if self.name == "free" else None
        n = min(len(self.tokens), (free or ctx.max_draft_list)[0])
        return DraftProposal(tokens=torch.tensor([self.tokens[:n]]), lengths=torch.tensor([n]), source=self.name)


def _union_ctx(k, by_source, free=None):
    import torch

    from lightspec_core import StepContext

    ctx = StepContext(step=1, sequences=[(1, 2)], row_ids=[0], max_draft_list=[k], max_draft=torch.tensor([k]),
                      vocab_size=64)
    ctx.budget_by_source, ctx.free_max_draft_list = by_source, free
    return ctx


def test_union_gives_each_component_its_own_cap_and_keeps_free_drafts():
    """``union``: a component capped at 0 by the budget is not run; others draft within their cap;
    the tree may hold the free limit's nodes, so a long n-gram draft is not cut to k."""
    reg = get_registry()
    free, model = _Fixed("free", [5, 6, 7, 8, 9, 10]), _Fixed("model", [11, 12, 13, 14])
    union = Combination("u", "union", [free, model], reg.create("fusion", "tree_union"))
    fused = union.lightspec_propose(ctx=_union_ctx(3, {"model": [0]}, free=[8]))
    assert model.limits == [] and fused.node_rows() == [[5, 6, 7, 8, 9, 10]]
    fused = union.lightspec_propose(ctx=_union_ctx(3, {"model": [2]}, free=[8]))
    assert model.limits == [[2]]
    assert sorted(fused.node_rows()[0]) == [5, 6, 7, 8, 9, 10, 11, 12]  # 6 free nodes + the model's 2, within 8
    # no per-source caps and no free limit (the tree budget): every component gets the whole budget
    fused = union.lightspec_propose(ctx=_union_ctx(3, {}))
    assert model.limits[-1] == [3] and len(fused.node_rows()[0]) == 3


def test_cascade_keeps_each_component_within_its_own_cap():
    """``cascade``: a later component drafts what the earlier ones left, cut to its per-source
    cap (``Budget.by_source``); capped at 0 it is not run (e.g. while the budget holds the model
    drafters and lets model-free ones go on: reason ``hold_free``)."""
    reg = get_registry()
    free, model = _Fixed("free", [5, 6]), _Fixed("model", [11, 12, 13, 14])
    cascade = Combination("c", "cascade", [free, model], reg.create("fusion", "concat"))
    cascade.lightspec_propose(ctx=_union_ctx(8, {"model": [0]}))
    assert free.limits == [[8]] and model.limits == []
    cascade.lightspec_propose(ctx=_union_ctx(8, {"model": [3]}))
    assert model.limits == [[3]]  # 6 left after the free draft, the model's own cap 3
    cascade.lightspec_propose(ctx=_union_ctx(8, {}))
    assert model.limits[-1] == [6]


def test_lazy_union_runs_a_component_only_where_the_drafts_before_it_are_short():
    """``lazy``: the model component is not run on a step where the free draft already reaches
    its limit, and is run (and merged) where the free draft is shorter."""
    reg = get_registry()
    free, model = _Fixed("free", [5, 6, 7, 8, 9, 10]), _Fixed("model", [11, 12, 13, 14])
    union = Combination("u", "union", [free, model], reg.create("fusion", "tree_union"), lazy=True)
    fused = union.lightspec_propose(ctx=_union_ctx(3, {"model": [3]}, free=[8]))
    assert model.limits == [] and fused.node_rows() == [[5, 6, 7, 8, 9, 10]]  # 6 free tokens >= the model's 3
    short = _Fixed("free", [5])
    union = Combination("u", "union", [short, model], reg.create("fusion", "tree_union"), lazy=True)
    fused = union.lightspec_propose(ctx=_union_ctx(3, {"model": [3]}, free=[8]))
    assert model.limits == [[3]] and sorted(fused.node_rows()[0]) == [5, 11, 12, 13]
    # without lazy the model drafts on both steps
    eager = Combination("u", "union", [free, model], reg.create("fusion", "tree_union"))
    eager.lightspec_propose(ctx=_union_ctx(3, {"model": [3]}, free=[8]))
    assert model.limits == [[3], [3]]


def test_lazy_is_refused_outside_union_and_when_not_a_boolean():
    reg = get_registry()
    comps = [_Fixed("free", [5]), _Fixed("model", [6])]
    with pytest.raises(ConfigError, match="lazy=True applies to kind 'union' only"):
        Combination("c", "cascade", comps, reg.create("fusion", "concat"), lazy=True)
    spec = {"type": "combination", "kind": "union", "lazy": "yes", "components": ["ngram", "ngram"]}
    with pytest.raises(ConfigError, match="key 'lazy' is 'yes'; allowed: true or false"):
        build_strategy(spec, reg, {})
    spec = {"type": "combination", "kind": "switch", "lazy": True, "components": ["ngram", "ngram"]}
    with pytest.raises(ConfigError, match="key 'lazy' applies to kind 'union' only"):
        build_strategy(spec, reg, {})


def test_lazy_union_limits_a_component_per_row():
    """At batch 2 the model component drafts only for the row whose free draft is short; the
    covered row gets a limit of 0 (and keeps its free draft)."""
    import torch

    from lightspec_core import DraftProposal, StepContext

    class Rows:
        def __init__(self, name, rows):
            self.name, self.rows, self.limits = name, rows, []

        def lightspec_propose(self, ctx):
            self.limits.append(list(ctx.max_draft_list))
            cut = [r[:m] for r, m in zip(self.rows, ctx.free_max_draft_list if self.name == "free" else ctx.max_draft_list)]
            width = max(len(r) for r in cut)
            return DraftProposal(tokens=torch.tensor([r + [0] * (width - len(r)) for r in cut]),
                                 lengths=torch.tensor([len(r) for r in cut]), source=self.name)

    free, model = Rows("free", [[5, 6, 7, 8], [9]]), Rows("model", [[11, 12, 13], [14, 15, 16]])
    union = Combination("u", "union", [free, model], get_registry().create("fusion", "tree_union"), lazy=True)
    ctx = StepContext(step=1, sequences=[(1, 2), (1, 3)], row_ids=[0, 1], max_draft_list=[3, 3],
                      max_draft=torch.tensor([3, 3]), vocab_size=64)
    ctx.budget_by_source, ctx.free_max_draft_list = {"model": [3, 3]}, [8, 8]
    fused = union.lightspec_propose(ctx=ctx)
    assert model.limits == [[0, 3]]
    rows = fused.node_rows()
    assert sorted(rows[0]) == [5, 6, 7, 8] and sorted(rows[1]) == [9, 14, 15, 16]
