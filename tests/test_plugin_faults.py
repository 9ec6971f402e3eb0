"""Stateful drafters after a failure inside ``propose``.

A drafter that raises makes that step decode plainly (the core's guarantee, tested with
the fault plugins in ``test_fault_injection.py``).  The model drafters (the core's
``draft_model`` and the plugins of issues 26 and 27) keep state across steps (KV caches,
context stores, pending hidden states), and a failure can strike halfway through updating
it.  Here a fault is injected at the k-th tensor operation of one ``propose`` call (a
``TorchFunctionMode``: no knowledge of the drafter's code), for k at the first, a middle and
the last operation, on the zoo target with the shipped heads, three requests in one batch,
and the generation must

* stay the target's own greedy output,
* report that one failure and no other (a drafter left inconsistent would fail again),
* draft afterwards what it drafts without the fault: wherever both runs draft for a
  request from the same committed prefix after the fault, the drafts are the same (a
  stale cache entry, or a token the cache was taken to hold, changes them).

A second test fails a drafter for longer than the engine keeps hidden states (a gap).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

import lightspec_zoo
from lightspec_core import MTPPipeline
from lightspec_core.plugins import get_registry
from lightspec_core.strategy_files import build_strategy, strategy_spec

# history-free settings, so that a run with a fault must draft what the run without one does:
# no learned n-gram cut (min_accept 0), a tree of fixed shape (adaptive false)
NGRAM = {"type": "ngram", "min_accept": 0}
STRATEGIES = {
    "draft_model": {"type": "draft_model", "max_draft": 4},
    "eagle3": "eagle3",
    "eagle3_tree": "eagle3_tree:adaptive=false",
    "dspark": "dspark",
    "mtp": "mtp",
    "ngram_then_draft_model": {"type": "combination", "kind": "cascade",
                               "components": [NGRAM, {"type": "draft_model", "max_draft": 4}]},
    "union": {"type": "combination", "kind": "union", "lazy": True,
              "components": [NGRAM, {"type": "draft_model", "max_draft": 4}]},
}
FAULTY_CALL = 3  # the third propose of a generation: the prompts' states and two steps are in
N_NEW = 96


class _FailAt(TorchFunctionMode):
    """Counts tensor operations; raises at operation ``at`` (1-based) when given."""

    def __init__(self, at: int | None = None):
        super().__init__()
        self.at, self.ops = at, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if self.ops == self.at:
            raise RuntimeError(f"injected fault at tensor operation {self.ops}")
        return func(*args, **(kwargs or {}))


class _Recorder:
    """Wraps a strategy class's ``lightspec_propose``: records each row's draft by request
    and the committed length it was made from; counts the operations of call
    ``FAULTY_CALL``, or fails the ``failing_calls`` calls from there at operation ``fail_at``."""

    def __init__(self, fail_at: int | None = None, failing_calls: int = 1):
        self.fail_at, self.calls, self.ops = fail_at, 0, None
        self.failing = range(FAULTY_CALL, FAULTY_CALL + failing_calls)
        self.drafts: dict[tuple[int, int], tuple[int, ...]] = {}  # (request, committed length) -> draft
        self.first_fault: dict[int, int] = {}  # request -> committed length at the first failing call
        self.last_fault: dict[int, int] = {}  # request -> committed length at the last failing call

    def wrap(self, propose):
        @functools.wraps(propose)  # keeps the hook marker
        def wrapped(strategy, ctx):
            self.calls += 1
            if self.calls not in self.failing:
                return self._record(ctx, propose(strategy, ctx))
            for rid, seq in zip(ctx.row_ids, ctx.sequences):
                self.first_fault.setdefault(rid, len(seq))
                self.last_fault[rid] = len(seq)
            with _FailAt(self.fail_at) as mode:
                out = propose(strategy, ctx)
            self.ops = mode.ops
            return self._record(ctx, out)

        return wrapped

    def _record(self, ctx, proposal):
        if proposal is not None:
            for b, (rid, seq) in enumerate(zip(ctx.row_ids, ctx.sequences)):
                n = int(proposal.lengths[b])
                if n:
                    self.drafts[(rid, len(seq))] = tuple(proposal.tokens[b, :n].tolist())
        return proposal

    def after_fault(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """The drafts made after each request's last failing call."""
        return {key: d for key, d in self.drafts.items() if key[1] > self.last_fault.get(key[0], 1 << 30)}


@functools.lru_cache(maxsize=None)
def _zoo():
    from lightspec_core.loading import load_model, load_tokenizer

    path = str(lightspec_zoo.model_path())
    return load_model(path, torch.device("cpu"), torch.float32), load_tokenizer(path)


def _prompts(n: int) -> list[str]:
    sets = lightspec_zoo.prompt_sets()
    return [sets[w][0] for w in ("code", "prose", "edit")][:n]


def _generate(name: str, recorder: _Recorder, monkeypatch, prompts: list[str], max_new_tokens: int = N_NEW):
    spec = STRATEGIES[name]
    strategy = build_strategy(spec if isinstance(spec, dict) else strategy_spec(spec), get_registry())
    cls = type(strategy)
    with monkeypatch.context() as m:
        m.setattr(cls, "lightspec_propose", recorder.wrap(cls.lightspec_propose))
        model, tok = _zoo()
        pipe = MTPPipeline(model, tok, strategy=strategy, draft_model=str(lightspec_zoo.model_path("draft")),
                           budget="static:k=4")
        return pipe.generate(prompts, max_new_tokens=max_new_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def clean():
    """Per strategy: the run without a fault (outputs, recorder), filled on first use."""
    return {}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_drafter_that_fails_midway_recovers(name, where, clean, monkeypatch):
    prompts = _prompts(3)
    if name not in clean:
        rec = _Recorder()
        clean[name] = (_generate(name, rec, monkeypatch, prompts), rec)
    base, base_rec = clean[name]
    assert base_rec.ops and base_rec.drafts, f"{name} drafted nothing: the test would show nothing"
    at = {"first": 1, "middle": max(1, base_rec.ops // 2), "last": base_rec.ops}[where]
    rec = _Recorder(fail_at=at)
    out = _generate(name, rec, monkeypatch, prompts)
    assert [o.token_ids for o in out] == [o.token_ids for o in base]
    for o in out:  # the failed step is every row's
        assert o.stats.failures == [f"propose failed: RuntimeError: injected fault at tensor operation {at}"], \
            o.stats.failures
    after = {key: d for key, d in rec.after_fault().items() if key in base_rec.drafts}
    assert len(after) >= 10, f"only {len(after)} drafts from common prefixes after the fault"
    differ = sorted(key for key, d in after.items() if d != base_rec.drafts[key])
    assert not differ, (f"{name}: after the fault at {rec.last_fault}, drafts differ at (request, length) {differ}: "
                        f"{[(after[key], base_rec.drafts[key]) for key in differ[:3]]}")


@pytest.mark.parametrize("name", ["eagle3", "dspark", "mtp"])
def test_a_hidden_state_drafter_restarts_after_a_gap(name, monkeypatch):
    """Failing for more steps than the engine keeps states (1,024 per row) leaves a gap in
    the states a drafter sees: it starts again from the first state it gets, fails no more,
    and its drafts are about as often right as those of a run that never failed.  (The
    engine backs off a failing strategy: after the 7th failure in a row it asks every 64
    steps, so 24 failing calls span ~1,200 steps.)"""
    from lightspec_core.engine_parts import MAX_PENDING_HIDDEN

    failing = 24
    prompts = _prompts(1)
    model, tok = _zoo()
    n_prompt = len(tok(prompts[0])["input_ids"])
    n_new = min(1400, model.config.max_position_embeddings - n_prompt)
    rec, clean = _Recorder(fail_at=1, failing_calls=failing), _Recorder()
    (out,) = _generate(name, rec, monkeypatch, prompts, max_new_tokens=n_new)
    (expected,) = _generate(name, clean, monkeypatch, prompts, max_new_tokens=n_new)
    assert out.token_ids == expected.token_ids
    assert len(out.stats.failures) == failing  # the injected ones, and no other
    assert rec.last_fault[0] - rec.first_fault[0] > MAX_PENDING_HIDDEN  # the failures left a gap

    def first_token_right(drafts) -> float:
        after = {n: d for (_, n), d in drafts.items() if n > rec.last_fault[0]}
        assert len(after) >= 20, f"{name} drafted {len(after)} times after the gap"
        return sum(d[0] == out.token_ids[n - n_prompt] for n, d in after.items()) / len(after)

    # after the gap the drafter has only the context since, so its drafts may be a little worse
    # than those of the run that never failed, never noise (a lost or misplaced state)
    assert first_token_right(rec.drafts) >= 0.8 * first_token_right(clean.drafts)
