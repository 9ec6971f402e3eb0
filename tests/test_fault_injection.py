"""The engine against misbehaving plugins (the distributions in ``tests/fault_plugins``).

What the user guide promises ("Guarantees and limits"): a drafter that fails makes that
step decode plainly, and the failure is reported once, with a count; the output stays
exactly HF's greedy output, and sampling keeps the target's distribution.  A statistics
sink that raises is isolated and reported; generation goes on.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch
from fault_plugins import fault_env, use_fault_plugins
from helpers import cached_tiny, forget_discovered_plugins, hf_reference, save_tiny
from lightspec_core.plugins import get_registry
from stat_tests import two_sample_p

from lightspec_core import MTPPipeline

# repetitive prompts, so the drafters' 1-gram lookup drafts (and the verifier accepts) often
PROMPTS = [
    "one two three one two three one two",
    "the cat is red the cat is",
    "def x ( ) : return x def x ( ) :",
]
N_NEW = 16


@pytest.fixture
def fault(monkeypatch):
    """``fault(*which)``: the fault distributions ``which`` loaded (allow-listed) into a
    fresh process-wide registry; the registry is rebuilt without them afterwards."""

    def load(*which):
        use_fault_plugins(monkeypatch, *which)
        return get_registry(reload=True)

    yield load
    forget_discovered_plugins()


@pytest.fixture(scope="module")
def refs():
    model, tok = cached_tiny()
    return [hf_reference(model, tok, p, N_NEW) for p in PROMPTS]


def _calls(name: str) -> int:
    from lightspec_fault_drafters.plugin import CALLS

    return CALLS.get(name, 0)


def _run(strategy, **kw):
    model, tok = cached_tiny()
    pipe = MTPPipeline(model, tok, strategy=strategy, budget={"type": "static", "k": 3})
    return pipe.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True, **kw)


def _strategy_warnings(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and name in r.getMessage()]


# --- greedy: every faulty drafter leaves the output exactly HF's --------------------------

GREEDY_CASES = {
    "raises_midway": {"type": "raises_midway", "after": 2},
    "float_ids": "float_ids",
    "float_ids_fractional": {"type": "float_ids", "mode": "fractional"},
    "mutates_sequences_append": {"type": "mutates_sequences", "how": "append"},
    "mutates_sequences_iadd": {"type": "mutates_sequences", "how": "iadd"},
    "zero_probs": "zero_probs",
    "out_of_vocab": "out_of_vocab",
    "out_of_vocab_huge": {"type": "out_of_vocab", "mode": "huge"},
    "out_of_vocab_negative": {"type": "out_of_vocab", "mode": "negative"},
}
# which cases fail today (the engine crashes or its output differs): switched on by the lead


@pytest.mark.parametrize(
    "case", list(GREEDY_CASES)
)
def test_faulty_drafter_greedy_output_is_hf_greedy(fault, refs, case):
    fault("drafters")
    spec = GREEDY_CASES[case]
    name = spec if isinstance(spec, str) else spec["type"]
    before = _calls(name)
    if isinstance(spec, dict):
        from lightspec_core.strategy_files import build_strategy

        spec = build_strategy(spec, get_registry())
    out = _run(spec)
    assert _calls(name) > before, "the faulty drafter was never asked to propose"
    assert [o.token_ids for o in out] == refs


def test_raising_drafter_failure_is_reported_once_with_a_count(fault, refs, caplog):
    """propose raises on every call after the second: those steps decode plainly, one
    warning for the whole generate() (not one per step), and the summaries count them."""
    fault("drafters")
    from lightspec_core.strategy_files import build_strategy

    strategy = build_strategy({"type": "raises_midway", "after": 2}, get_registry())
    with caplog.at_level(logging.WARNING, logger="lightspec"):
        out = _run(strategy)
    assert [o.token_ids for o in out] == refs
    failed_steps = strategy.calls - strategy.after
    assert failed_steps >= 2
    assert len(_strategy_warnings(caplog, "raises_midway")) == 1, caplog.text
    assert max(len(o.stats.failures) for o in out) >= 2  # counted per step, not only reported


@pytest.mark.parametrize("case", ["out_of_vocab", "float_ids_fractional"])
def test_invalid_draft_is_a_reported_failure(fault, refs, caplog, case):
    """A draft the engine cannot verify (ids outside the vocabulary, non-integral ids) is a
    drafter failure: reported (once), the step decoded plainly, the output HF's."""
    fault("drafters")
    from lightspec_core.strategy_files import build_strategy

    spec = GREEDY_CASES[case]
    strategy = build_strategy(spec if isinstance(spec, dict) else {"type": spec}, get_registry())
    with caplog.at_level(logging.WARNING, logger="lightspec"):
        out = _run(strategy)
    assert [o.token_ids for o in out] == refs
    assert any(o.stats.failures for o in out)
    assert len(_strategy_warnings(caplog, strategy.name)) == 1, caplog.text


# --- sampling: a drafter's impossible probabilities do not change the distribution ------

SMALL_VOCAB = 64
N_ROWS = 600
N_NEW_SAMPLED = 4
SAMPLING = dict(temperature=1.0)  # no warper: every token has p > 0, so an accepted-at-face-value draft shows


@pytest.fixture(scope="module")
def sampled_base():
    """A vocab-64 target (concentrated distributions), a prompt, and plain samples."""
    from models import ToyTokenizer, build_model

    tok = ToyTokenizer(SMALL_VOCAB)
    target = build_model("llama", vocab_size=SMALL_VOCAB)
    g = torch.Generator().manual_seed(3)
    prompt = (torch.randperm(SMALL_VOCAB - 3, generator=g) + 3).tolist()
    plain = MTPPipeline(target, tok, strategy="none")
    out = plain.generate([prompt] * N_ROWS, max_new_tokens=N_NEW_SAMPLED, seed=list(range(N_ROWS)),
                         ignore_eos=True, **SAMPLING)
    return tok, target, prompt, [tuple(o.token_ids) for o in out]


def _sampled(tok, target, prompt, strategy):
    pipe = MTPPipeline(target, tok, strategy=strategy, budget={"type": "static", "k": 2})
    seeds = list(range(10_000, 10_000 + N_ROWS))
    out = pipe.generate([prompt] * N_ROWS, max_new_tokens=N_NEW_SAMPLED, seed=seeds, ignore_eos=True, **SAMPLING)
    return [tuple(o.token_ids) for o in out], sum(o.stats.drafted for o in out), sum(o.stats.accepted for o in out)


@pytest.mark.parametrize("mode", ["zero", "negative", "nan", "tiny", "correct"])
def test_impossible_draft_probability_keeps_the_sampling_distribution(fault, sampled_base, mode):
    """zero_probs samples its drafts uniformly but reports q(x) = 0 / -0.5 / NaN / 1e-30 at
    the drafted token: taken at face value, min(1, p/q) accepts every draft and the output
    follows the drafter, not the target.  ``correct`` (the true q) is the control: the
    check passes for honest speculative sampling."""
    fault("drafters")
    from lightspec_core.strategy_files import build_strategy

    tok, target, prompt, base = sampled_base
    strategy = build_strategy({"type": "zero_probs", "mode": mode}, get_registry())
    spec, drafted, accepted = _sampled(tok, target, prompt, strategy)
    assert strategy.calls > 0
    if mode == "correct":
        assert drafted > N_ROWS and 0 < accepted < drafted  # the control went through the verifier's accept/reject
    else:
        assert drafted == 0  # every row's draft was refused by the proposal check: those rows decoded plainly
    for pos in range(1, N_NEW_SAMPLED):  # the first token comes from the prefill, never from a draft
        p = two_sample_p([s[pos] for s in base], [s[pos] for s in spec])
        assert p > 1e-3, f"position {pos}: the sampled distribution moved (p={p:.2g})"


def test_distribution_check_has_power(sampled_base):
    """The check above tells the target's distribution from a uniform one over the drafted ids."""
    tok, target, prompt, base = sampled_base
    g = torch.Generator().manual_seed(5)
    uniform = [tuple(torch.randint(3, SMALL_VOCAB, (N_NEW_SAMPLED,), generator=g).tolist()) for _ in range(N_ROWS)]
    assert two_sample_p([s[1] for s in base], [s[1] for s in uniform]) < 1e-3


# --- a statistics sink that raises -------------------------------------------------------


def test_raising_sink_is_isolated_and_reported(fault, refs, caplog):
    fault("sink")
    from lightspec_fault_sink.plugin import CALLS

    before = CALLS["events"]
    with caplog.at_level(logging.WARNING, logger="lightspec"):
        out = _run("none")
    assert [o.token_ids for o in out] == refs
    assert CALLS["events"] > before, "the sink was never called"
    assert len(_strategy_warnings(caplog, "fault_sink")) == 1, caplog.text


def test_cli_run_with_a_raising_sink_generates(tmp_path):
    """`lightspec run --strategy none` with the raising sink installed: the text is printed,
    exit status 0, and the sink's failure is reported on stderr once."""
    model = save_tiny(tmp_path / "tiny")
    proc = subprocess.run(
        [sys.executable, "-m", "lightspec_core.cli", "run", "--model", str(model), "--strategy", "none",
         "--prompt", PROMPTS[0], "--max-new-tokens", "6", "--json"],
        capture_output=True, text=True, env=fault_env("sink"), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)
    assert len(result["token_ids"]) >= 1
    assert sum("fault_sink" in line for line in proc.stderr.splitlines()) == 1, proc.stderr
