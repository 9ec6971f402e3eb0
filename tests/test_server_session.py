"""``EngineSession``: rows join a running batch between steps and leave it, and each row's
greedy output equals the offline greedy generation of its prompt alone."""

from __future__ import annotations

import pytest
import torch
from lightspec_core.engine_session import EngineSession
from lightspec_core.errors import InvalidValueError
from lightspec_core.sampling import SamplingParams
from models import ToyTokenizer, cached_model, make_prompts

from lightspec_core import MTPPipeline, hookimpl


def _pipe(arch: str, strategy: str, **kw):
    model = cached_model(arch)
    draft = cached_model(arch, layers=1, seed=1) if strategy in ("draft_model", "hybrid") else None
    return MTPPipeline(model, ToyTokenizer(), strategy=strategy, draft_model=draft, **kw)


def _offline(pipe, prompt, n):
    return pipe.generate([prompt], max_new_tokens=n, ignore_eos=True)[0].token_ids


def _staggered(pipe, prompts, news, remove_at=None):
    """Admit prompt i after step i (one per step), run to the end; {request: tokens}."""
    session = EngineSession(pipe.engine, SamplingParams(), eos_ids=set())
    out = {i: [] for i in range(len(prompts))}
    step = 0
    pending = list(range(len(prompts)))
    while pending or session.requests:
        if pending:
            i = pending.pop(0)
            o = session.add(i, prompts[i], news[i], seed=None)
            out[i].extend(o.tokens)
        if remove_at is not None and step == remove_at[1] and remove_at[0] in session.requests:
            assert session.remove(remove_at[0])
        for o in session.step():
            out[o.request].extend(o.tokens)
        step += 1
    return out, session


@pytest.mark.parametrize("arch,strategy", [("llama", "ngram"), ("llama", "draft_model"), ("llama", "layerskip"),
                                           ("gpt2", "hybrid"), ("mistral", "none")])
def test_rows_joining_a_running_batch_keep_offline_greedy_output(arch, strategy):
    pipe = _pipe(arch, strategy)
    prompts = make_prompts(5, seed=3)
    news = [12, 5, 20, 9, 14]
    got, session = _staggered(pipe, prompts, news)
    assert session.requests == [] and pipe.engine.runner.kv is None  # the finished rows' cache is freed
    for i, p in enumerate(prompts):
        assert got[i] == _offline(pipe, p, news[i]), (strategy, i)


def test_removed_row_leaves_at_once_and_others_are_unchanged():
    pipe = _pipe("llama", "ngram")
    prompts = make_prompts(4, seed=5)
    news = [16, 16, 16, 16]
    got, _ = _staggered(pipe, prompts, news, remove_at=(1, 3))
    assert 0 < len(got[1]) < 16
    for i in (0, 2, 3):
        assert got[i] == _offline(pipe, prompts[i], 16)


def test_kv_cache_holds_only_active_rows():
    pipe = _pipe("llama", "none")
    session = EngineSession(pipe.engine, SamplingParams(), eos_ids=set())
    prompts = make_prompts(3, seed=1)
    for i, p in enumerate(prompts):
        session.add(i, p, 8)
    assert pipe.engine.runner.kv.batch == 3
    session.remove(1)
    assert session.requests == [0, 2] and pipe.engine.runner.kv.batch == 2
    assert len(session.batch.rows) == 2


def test_seeded_sampling_row_is_independent_of_its_batch():
    pipe = _pipe("llama", "ngram")
    prompts = make_prompts(3, seed=7)
    sampling = SamplingParams(temperature=0.9, top_p=0.95)
    alone = EngineSession(pipe.engine, sampling, eos_ids=set())
    toks = alone.add(0, prompts[0], 10, seed=42).tokens
    while alone.requests:
        toks += [t for o in alone.step() for t in o.tokens]
    shared = EngineSession(pipe.engine, sampling, eos_ids=set())
    shared.add(5, prompts[1], 10, seed=1)
    shared.step()
    mine = shared.add(6, prompts[0], 10, seed=42).tokens
    shared.add(7, prompts[2], 4, seed=3)
    while shared.requests:
        mine += [t for o in shared.step() if o.request == 6 for t in o.tokens]
    assert mine == toks


def test_bad_admissions_are_refused():
    pipe = _pipe("llama", "none")
    session = EngineSession(pipe.engine, SamplingParams(), eos_ids=set())
    session.add(0, [5, 6, 7], 4)
    with pytest.raises(InvalidValueError, match="already"):
        session.add(0, [5, 6], 4)
    with pytest.raises(InvalidValueError, match="empty"):
        session.add(1, [], 4)
    with pytest.raises(InvalidValueError, match="context"):
        session.add(2, [5] * 10_000, 4)
    assert session.requests == [0]


def test_engine_run_unchanged_by_sessions():
    pipe = _pipe("llama", "ngram")
    prompts = make_prompts(3, seed=2)
    before = [r.token_ids for r in pipe.generate(prompts, max_new_tokens=10, ignore_eos=True)]
    _staggered(pipe, prompts, [10, 10, 10])
    after = [r.token_ids for r in pipe.generate(prompts, max_new_tokens=10, ignore_eos=True)]
    assert before == after
    assert torch.is_inference_mode_enabled() is False


class _Recorder:
    """Records the target hidden states handed to ``propose`` per (request, position); never drafts."""

    name = "recorder"
    hidden_layers = [1]

    def __init__(self):
        self.seen: dict[int, dict[int, torch.Tensor]] = {}

    def draft_cost_hints(self):
        return {self.name: 0.0}

    @hookimpl
    def lightspec_propose(self, ctx):
        if ctx.hidden_states:
            h, n, p = ctx.hidden_states[1], ctx.hidden_lengths.tolist(), ctx.hidden_positions.tolist()
            for b, rid in enumerate(ctx.row_ids):
                assert p[b] + n[b] == len(ctx.sequences[b]) - 1  # the documented invariant
                for j in range(n[b]):
                    self.seen.setdefault(rid, {})[p[b] + j] = h[b, j].clone()
        return None


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_joining_row_hands_its_prompt_states_to_the_strategy(arch):
    prompts = make_prompts(3, seed=4)
    news = [9, 6, 11]
    rec = _Recorder()
    pipe = MTPPipeline(cached_model(arch), ToyTokenizer(), strategy=rec, budget={"type": "static", "k": 2})
    _staggered(pipe, prompts, news)
    joined = rec.seen
    for i, p in enumerate(prompts):
        alone = _Recorder()
        MTPPipeline(cached_model(arch), ToyTokenizer(), strategy=alone, budget={"type": "static", "k": 2}).generate(
            [p], max_new_tokens=news[i], ignore_eos=True)
        want = alone.seen[0]
        # alone, the last step does not ask the strategy (no room to draft); in a batch it may
        assert set(want) <= set(joined[i]) <= set(range(len(p) + news[i] - 1))
        assert set(range(len(p))) <= set(want)  # every prompt position, the joining prefill's included
        for pos, h in want.items():
            torch.testing.assert_close(joined[i][pos], h, rtol=1e-5, atol=1e-5)


def test_step_stats_carry_the_queue_backlog():
    events = []

    class Sink:
        @hookimpl
        def lightspec_on_stats(self, event):
            if event.kind == "step":
                events.append(event.queue_backlog)

    pipe = MTPPipeline(cached_model("llama"), ToyTokenizer(), strategy="none", sinks=[Sink()])
    session = EngineSession(pipe.engine, SamplingParams(), eos_ids=set())
    session.add(0, make_prompts(1)[0], 4)
    session.step(queue_backlog=5)
    session.step()
    assert events == [5, 0]
