"""Strategy files that would hang or crash the loader: alias bombs, recursive aliases,
deep nesting, and strategies that refer to themselves (cycles are named)."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from lightspec_core.composer import Combination
from lightspec_core.plugins import get_registry
from lightspec_core.strategy_files import build_strategy, load_strategy_file

from lightspec_core import ConfigError, safe_yaml


def load(tmp_path, text, name="strategy.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path, lambda: load_strategy_file(path, get_registry())


def expect_error(tmp_path, text, *needles) -> str:
    path, run = load(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        run()
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert "\n" not in msg and len(msg) < 400, msg
    for n in needles:
        assert n in msg, f"{n!r} not in: {msg}"
    return msg


def billion_laughs(levels: int = 12, width: int = 9) -> str:
    """A strategy file whose aliases stand for width**levels nodes, in under 2 kB."""
    lines = ["strategies:", "  - name: laughs", "    type: ngram",
             "    x0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"    x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    lines += ["  - name: boom", "    type: combination", f"    components: *a{levels - 1}"]
    return "\n".join(lines) + "\n"


# --- YAML limits -------------------------------------------------------------------------


def test_billion_laughs_is_refused(tmp_path):
    text = billion_laughs()
    assert len(text) < 2048
    expect_error(tmp_path, text, "refused", "aliases", f"{safe_yaml.MAX_NODES}")


def test_recursive_alias_is_refused(tmp_path):
    text = """\
        strategies: &s
          - name: x
            type: combination
            components: *s
    """
    expect_error(tmp_path, text, "refused", "alias *s is recursive", "line 4")


def test_recursive_merge_key_is_refused(tmp_path):
    text = """\
        strategies:
          - &m
            name: x
            type: ngram
            <<: *m
    """
    expect_error(tmp_path, text, "alias *m is recursive")


def test_deep_nesting_is_refused(tmp_path):
    text = "strategies:\n  - name: deep\n    type: ngram\n    x: " + "[" * 5000 + "]" * 5000 + "\n"
    expect_error(tmp_path, text, "refused", f"nested deeper than {safe_yaml.MAX_DEPTH} levels")


def test_ordinary_anchors_and_aliases_still_load(tmp_path):
    path, run = load(tmp_path, """\
        strategies:
          - &short
            name: short_ngram
            type: ngram
            max_draft: 2
          - name: other_ngram
            <<: *short
            max_ngram: 3
          - name: pair
            type: combination
            kind: cascade
            components: [short_ngram, other_ngram]
        default: pair
    """)
    strategy, _, _ = run()
    assert isinstance(strategy, Combination)
    assert [c.max_draft for c in strategy.components] == [2, 2] and strategy.components[1].max_ngram == 3


def test_safe_yaml_reads_what_safe_load_reads():
    text = "a: &x [1, 2, {b: c}]\nd: *x\ne: {<<: {f: 1}, g: 2.5}\nh: null\n"
    assert safe_yaml.load(text) == yaml.safe_load(text)
    assert safe_yaml.load("") is None
    with pytest.raises(yaml.YAMLError):
        safe_yaml.load("a: [unclosed\n")
    with pytest.raises(yaml.YAMLError):  # still safe: no Python objects
        safe_yaml.load("!!python/object/apply:os.system ['true']\n")


# --- strategies that refer to themselves -------------------------------------------------


def test_self_referencing_composition_names_the_cycle(tmp_path):
    msg = expect_error(tmp_path, """\
        strategies:
          - name: loop
            type: combination
            components: [loop, ngram]
    """, "strategy cycle: loop -> loop")
    assert "unknown strategy" not in msg


def test_two_strategy_cycle_names_both(tmp_path):
    expect_error(tmp_path, """\
        strategies:
          - name: a
            type: combination
            components: [ngram, b]
          - name: b
            type: combination
            kind: cascade
            components: [a, ngram]
        default: a
    """, "strategy cycle: a -> b -> a")


def test_cycle_through_type_is_named(tmp_path):
    expect_error(tmp_path, """\
        strategies:
          - name: a
            type: b
          - name: b
            type: a
        default: a
    """, "strategy cycle: a -> b -> a")


def test_cycle_below_the_default_is_named_from_where_it_starts(tmp_path):
    expect_error(tmp_path, """\
        strategies:
          - name: b
            type: combination
            components: [ngram, c]
          - name: c
            type: combination
            components: [ngram, b]
          - name: top
            type: combination
            components: [ngram, b]
        default: top
    """, "strategy cycle: b -> c -> b")


def test_definition_named_like_a_registered_strategy_configures_it(tmp_path):
    """Not a cycle: inside its own definition, 'ngram' is the registered n-gram drafter."""
    path, run = load(tmp_path, """\
        strategies:
          - name: ngram
            type: ngram
            max_draft: 3
          - name: pair
            type: combination
            components: [ngram, layerskip]
    """)
    strategy, _, _ = run()
    assert strategy.components[0].max_draft == 3


def test_python_spec_containing_itself_is_an_error_not_a_recursion_error():
    spec = {"type": "combination", "components": ["ngram"]}
    spec["components"].append(spec)
    with pytest.raises(ConfigError, match="nest deeper than") as info:
        build_strategy(spec, get_registry())
    assert len(str(info.value)) < 200


def test_long_chain_of_definitions_is_refused(tmp_path):
    """Forty definitions, each a combination of the next: deeper than strategies may nest."""
    lines = ["strategies:"]
    for i in range(40):
        lines += [f"  - name: s{i}", "    type: combination", f"    components: [ngram, s{i + 1}]"]
    lines += ["  - name: s40", "    type: ngram", "default: s0"]
    expect_error(tmp_path, "\n".join(lines) + "\n", "strategies nest deeper than 32 levels")


def test_budget_file_billion_laughs_is_refused(tmp_path):
    """A ``--budget`` YAML file is read within the same limits as strategy files."""
    from lightspec_core.component_spec import parse_spec

    path = tmp_path / "budget.yaml"
    path.write_text(billion_laughs())
    with pytest.raises(ConfigError, match="refused") as info:
        parse_spec(str(path), "budget")
    assert str(info.value).startswith(str(path)) and len(str(info.value)) < 400
