"""One focused test per hook of ``hookspecs.py``, each through a real pipeline on a tiny
llama.  Naming convention (checked by ``test_hooks_documented.py``): the test of hook
``lightspec_<short>`` is called ``test_hook_<short>_...``."""

from __future__ import annotations

import json
import types

import pytest
import torch
from helpers import cached_tiny, hf_reference

from lightspec_core import Budget, DraftProposal, MTPPipeline, VerifyResult, hookimpl
from lightspec_core import plugins as plugins_mod

PROMPTS = ["the cat is big and the cat is", "one two"]
NEW = 10


@pytest.fixture(scope="module")
def tiny():
    model, tok = cached_tiny()
    refs = [hf_reference(model, tok, p, NEW) for p in PROMPTS]
    assert all(2 not in r for r in refs), "pick prompts whose reference has no eos"
    return model, tok, refs


@pytest.fixture
def registry(monkeypatch):
    """A fresh registry with the built-ins only (no installed plugins); the previous
    process-wide registry is restored afterwards."""
    monkeypatch.setattr(plugins_mod, "_registry", None)
    return plugins_mod.get_registry(reload=True, allow=[], strict=True)


class Oracle:
    """Drafts the HF reference continuation (so every draft token is right)."""

    name = "oracle"

    def __init__(self, tok, refs, max_draft=8):
        self.prompt_lens = [len(tok(p)["input_ids"]) for p in PROMPTS]
        self.refs = refs
        self.max_draft = max_draft
        self.seen_budgets: list[list[int]] = []
        self.seen_steps: list[int] = []

    @hookimpl
    def lightspec_propose(self, ctx):
        self.seen_budgets.append(list(ctx.max_draft_list))
        self.seen_steps.append(ctx.step)
        drafts = []
        for b, seq in enumerate(ctx.sequences):
            r = ctx.row_ids[b]
            done = len(seq) - self.prompt_lens[r]
            drafts.append(self.refs[r][done : done + min(self.max_draft, ctx.max_draft_list[b])])
        k = max(len(d) for d in drafts)
        if k == 0:
            return None
        tokens = torch.zeros(ctx.batch, k, dtype=torch.long)
        for b, d in enumerate(drafts):
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
        return DraftProposal(tokens, torch.tensor([len(d) for d in drafts]), source=self.name)


def _plugin(**hooks) -> types.ModuleType:
    """A module-like plugin object with the given hook implementations."""
    mod = types.ModuleType("test_hooks_plugin")
    for name, fn in hooks.items():
        setattr(mod, name, fn)
    return mod


def _check_lossless(results, refs):
    for r, ref in zip(results, refs):
        assert r.token_ids == ref
        assert r.stats.failures == []


def test_hook_propose_drafts_are_verified_and_accepted(tiny):
    model, tok, refs = tiny
    oracle = Oracle(tok, refs)
    pipe = MTPPipeline(model, tok, strategy=oracle, budget={"type": "static", "k": 4})
    results = pipe.generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    for r in results:
        assert r.stats.drafted > 0 and r.stats.accepted == r.stats.drafted  # oracle drafts are all right
        assert r.stats.mean_accepted_length > 2  # several tokens per target forward
        assert set(r.stats.sources) == {"oracle"}
    assert all(len(b) <= 2 and max(b) <= 4 for b in oracle.seen_budgets)


def test_hook_verify_custom_verifier_decides_acceptance(tiny):
    model, tok, refs = tiny
    calls = []

    class RejectAll:
        """A (lossless, greedy) verifier that keeps no draft: emits the target's own token."""

        name = "reject_all"

        @hookimpl
        def lightspec_verify(self, ctx, proposal, output):
            logits = output.logits
            calls.append((tuple(logits.shape), tuple(proposal.tokens.shape)))
            B = logits.shape[0]
            emitted = torch.full((B, proposal.max_len + 1), -1, dtype=torch.long)
            emitted[:, 0] = logits[:, 0].argmax(-1)
            return VerifyResult(torch.zeros(B, dtype=torch.long), emitted)

    pipe = MTPPipeline(model, tok, strategy=Oracle(tok, refs), verifier=RejectAll(), budget={"type": "static", "k": 3})
    results = pipe.generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    assert calls
    for (B, K1, V), (pb, pk) in calls:
        assert B == pb and K1 == pk + 1 and V == model.config.vocab_size
    for r in results:
        assert r.stats.drafted > 0 and r.stats.accepted == 0
        assert r.stats.steps == NEW - 1  # one token per step (the first comes from prefill)


def test_hook_fuse_combines_component_proposals(tiny, registry):
    from lightspec_core.composer import Combination

    model, tok, refs = tiny
    seen = []

    class PreferLast:
        name = "prefer_last"

        @hookimpl
        def lightspec_fuse(self, ctx, proposals):
            seen.append([p is not None for p in proposals])
            chosen = [p for p in proposals if p is not None]
            return chosen[-1] if chosen else None

    combo = Combination("ngram_then_oracle", "union", [registry.create("strategy", "ngram"), Oracle(tok, refs)], PreferLast())
    pipe = MTPPipeline(model, tok, strategy=combo, budget={"type": "static", "k": 4})
    results = pipe.generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    assert seen and all(len(s) == 2 for s in seen)  # one entry per component, in order
    assert all(s[1] for s in seen)  # the oracle always drafts, so it is what was fused
    for r in results:
        assert set(r.stats.sources) == {"oracle"} and r.stats.accepted == r.stats.drafted


def test_hook_budget_policy_bounds_the_draft(tiny):
    model, tok, refs = tiny
    given = []

    class Alternate:
        """k = 0, 1, 2, 0, 1, 2, ... by step: 0 means plain decoding."""

        name = "alternate"

        @hookimpl
        def lightspec_budget(self, ctx):
            k = ctx.step % 3
            given.append(k)
            return Budget(torch.full((ctx.batch,), k, dtype=torch.long), torch.zeros(ctx.batch))

    oracle = Oracle(tok, refs)
    pipe = MTPPipeline(model, tok, strategy=oracle, budget=Alternate())
    events = []
    pipe.bound.sinks.append(lambda event: events.append(event))
    results = pipe.generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    assert 0 in given and 2 in given
    assert oracle.seen_steps and all(step % 3 > 0 for step in oracle.seen_steps)  # k = 0: propose is not called
    for step, budget in zip(oracle.seen_steps, oracle.seen_budgets):
        assert max(budget) <= step % 3
    for e in events:
        if e.kind != "step":
            continue
        assert max(e.drafted) <= e.step % 3
    assert all(max(b) <= 2 for b in oracle.seen_budgets)


def test_hook_on_stats_events_are_consistent(tiny, registry):
    model, tok, refs = tiny
    global_events = []

    @hookimpl
    def lightspec_on_stats(event):
        global_events.append(event)

    registry.add_plugin(_plugin(lightspec_on_stats=lightspec_on_stats), "global_sink", "test-dist", "0")

    class OracleWithStats(Oracle):
        def __init__(self, *a):
            super().__init__(*a)
            self.events = []

        @hookimpl
        def lightspec_on_stats(self, event):
            self.events.append(event)

    strategy = OracleWithStats(tok, refs, 3)
    results = MTPPipeline(model, tok, strategy=strategy, budget={"type": "static", "k": 3}).generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    done = [e for e in strategy.events if e.kind == "request"]  # one summary per finished request
    assert sorted(e.request for e in done) == list(range(len(PROMPTS)))
    assert all(e.new_tokens == len(r.token_ids) for e, r in zip(sorted(done, key=lambda e: e.request), results))
    ev = [e for e in strategy.events if e.kind == "step"]
    assert ev and [e.step for e in ev] == list(range(1, len(ev) + 1))  # one event per decode step
    assert [e.step for e in global_events if e.kind == "step"] == [e.step for e in ev]  # global sinks see the same
    for e in ev:
        assert e.kind == "step" and len(e.row_ids) == len(e.drafted) == len(e.accepted) == len(e.emitted)
        for d, a, n in zip(e.drafted, e.accepted, e.emitted):
            assert 0 <= a <= d and n == a + 1
        assert e.step_time_s >= e.target_forward_s > 0 and e.overhead_s >= 0
        json.dumps(e.to_dict())
    for i, r in enumerate(results):
        mine = [(e.drafted[e.row_ids.index(i)], e.emitted[e.row_ids.index(i)]) for e in ev if i in e.row_ids]
        assert 1 + sum(n for _, n in mine) == len(r.token_ids)  # + the token sampled at prefill
        assert sum(d for d, _ in mine) == r.stats.drafted


def test_hook_register_strategies_makes_a_strategy_usable_by_name(tiny, registry):
    model, tok, refs = tiny

    @hookimpl
    def lightspec_register_strategies(register):
        register("hooks_oracle", lambda max_draft=8: Oracle(tok, refs, max_draft), params={"max_draft": "most tokens per draft"})

    registry.add_plugin(_plugin(lightspec_register_strategies=lightspec_register_strategies), "hooks_test", "hooks-dist", "9.9")
    assert registry.plugins["hooks_test"].components == ["strategy:hooks_oracle"]
    pipe = MTPPipeline(model, tok, strategy="hooks_oracle", max_draft=2, budget={"type": "static", "k": 4})
    assert pipe.strategy.max_draft == 2
    results = pipe.generate(PROMPTS, max_new_tokens=NEW)
    _check_lossless(results, refs)
    assert all(len(r.stats.per_position_drafted) == 2 for r in results)


def test_hook_register_commands_adds_a_cli_command(tiny, registry, monkeypatch):
    import click
    from click.testing import CliRunner
    from lightspec_core.cli import cli

    model, tok, refs = tiny

    @hookimpl
    def lightspec_register_commands(cli):
        @click.command("hooks-generate")
        @click.option("--n", type=int, default=4)
        def hooks_generate(n):
            """Generate with the tiny model (test command)."""
            out = MTPPipeline(model, tok, strategy="ngram").generate([tok(PROMPTS[0])["input_ids"]], max_new_tokens=n)
            click.echo(json.dumps(out[0].token_ids))

        cli.add_command(hooks_generate)

    registry.add_plugin(_plugin(lightspec_register_commands=lightspec_register_commands), "cmds", "cmds-dist", "1")
    monkeypatch.setattr(cli, "commands", dict(cli.commands))
    monkeypatch.setattr(cli, "_plugins_loaded", False, raising=False)
    res = CliRunner().invoke(cli, ["hooks-generate", "--n", "5"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == refs[0][:5]
    res = CliRunner().invoke(cli, ["--help"])
    assert "hooks-generate" in res.output


def test_a_strategy_that_never_drafts_does_not_feed_its_budget_policy(tiny):
    """``none`` never asks its budget policy, so the policy learns nothing from its steps
    (that learning costs ~0.1 ms a step at batch 1 on the CPU and would slow plain decoding);
    a drafting strategy's policy gets every step."""
    model, tok, _ = tiny
    learned = []

    class Counting:
        name = "counting"

        @hookimpl
        def lightspec_budget(self, ctx):
            return Budget(torch.ones(ctx.batch, dtype=torch.long), torch.zeros(ctx.batch))

        @hookimpl
        def lightspec_on_stats(self, event):
            learned.append(event)

    MTPPipeline(model, tok, strategy="none", budget=Counting()).generate(PROMPTS, max_new_tokens=NEW)
    assert learned == []
    MTPPipeline(model, tok, strategy="ngram", budget=Counting()).generate(PROMPTS, max_new_tokens=NEW)
    assert any(e.kind == "step" for e in learned)
