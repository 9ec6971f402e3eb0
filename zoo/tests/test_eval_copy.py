"""``zoo/scripts/eval_copy.py``: its copy examples are held-out functions in the suite's edit
format that are not suite prompts, and its measures read a model's copying correctly."""
from __future__ import annotations

import json

import lightspec_zoo
import pytest
from zoo_scripts import load_script


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoTokenizer

    mod = load_script("eval_copy")
    tok = AutoTokenizer.from_pretrained(lightspec_zoo.model_path())
    try:
        exs = mod.examples(tok, 4, 32, 0, None)
    except (FileNotFoundError, SystemExit) as exc:  # no standard library source on this machine
        pytest.skip(f"needs the Python standard library source: {exc}")
    if not exs:
        pytest.skip("no held-out functions found in this Python's standard library")
    return mod, tok, exs


def test_examples_are_in_the_edit_format_and_not_suite_prompts(setup):
    mod, tok, exs = setup
    suite = [json.loads(line)["prompt"] for line in (mod.PROMPTS / "edit.jsonl").read_text().splitlines() if line]
    assert len(exs) == 4
    for p, a in exs:
        text = tok.decode(p)
        assert text.startswith("# Original:\n") and "# The same function with `" in text
        assert text not in suite and 0 < len(a) <= 32
        original = text.split("\n\n# The same function")[0].removeprefix("# Original:\n")
        assert not any(original in s for s in suite)


def test_measure_scores_the_ideal_answer_against_the_models_own_greedy_output(setup):
    mod, _tok, exs = setup
    r = mod.measure(str(lightspec_zoo.model_path()), exs, new_tokens=8)
    assert r["examples"] == 4 and 0 < r["teacher_forced_top1"] <= 1
    assert 0 <= r["greedy_copy_run"] <= 8 and 0 <= r["greedy_exact"] <= 1


def test_a_model_scores_perfectly_on_its_own_greedy_output(setup):
    from lightspec_core.pipeline import MTPPipeline

    mod, _tok, exs = setup
    path = str(lightspec_zoo.model_path())
    pipe = MTPPipeline.from_pretrained(path, strategy="none", dtype="float32")
    outs = pipe.generate([p for p, _ in exs], max_new_tokens=8, ignore_eos=True)
    own = [(p, o.token_ids) for (p, _), o in zip(exs, outs)]
    r = mod.measure(path, own, new_tokens=8)
    assert r["teacher_forced_top1"] == 1.0 and r["greedy_copy_run"] == 8 and r["greedy_exact"] == 1.0
