"""The plugins' stateful drafters after a failure inside ``propose``.

A drafter that raises makes that step decode plainly (the core's guarantee, tested with
the fault plugins in ``test_fault_injection.py``).  The drafters of issues 26 and 27 keep
state across steps (KV caches, context stores, pending hidden states), and a failure can
strike halfway through updating it.  Here a fault is injected at the k-th tensor operation
of one ``propose`` call (a ``TorchFunctionMode``: no knowledge of the plugin's internals),
for k at the first, a middle and the last operation, on the zoo target with the shipped
heads, and the generation must

* stay the target's own greedy output,
* report that one failure and no other (a drafter left inconsistent would fail again),
* draft afterwards what it drafts without the fault: wherever both runs draft from the same
  committed prefix after the fault, the drafts are the same (a stale cache entry or a lost
  context state changes them).
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
CASCADE = {"type": "combination", "kind": "cascade",
           "components": [{"type": "ngram", "min_accept": 0}, {"type": "draft_model", "max_draft": 4}]}
UNION = {"type": "combination", "kind": "union", "lazy": True,
         "components": [{"type": "ngram", "min_accept": 0}, {"type": "draft_model", "max_draft": 4}]}
STRATEGIES = {"eagle3": "eagle3", "eagle3_tree": "eagle3_tree:adaptive=false", "dspark": "dspark", "mtp": "mtp",
              "ngram_then_draft_model": CASCADE, "union": UNION}
FAULTY_CALL = 3  # the third propose of a generation: the prompt's states and two steps are in
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
    """Wraps a strategy class's ``lightspec_propose``: records each draft by the committed
    length it was made from, counts the operations of call ``FAULTY_CALL`` or fails there."""

    def __init__(self, fail_at: int | None = None, failing_calls: int = 1):
        self.fail_at, self.calls, self.ops = fail_at, 0, None
        self.failing = range(FAULTY_CALL, FAULTY_CALL + failing_calls)  # calls that fail (at ``fail_at``)
        self.drafts: dict[int, tuple[int, ...]] = {}  # committed length -> drafted tokens (row 0)
        self.first_fault_length: int | None = None  # the committed length at the first failing call
        self.fault_at_length: int | None = None  # the committed length at the last failing call

    def wrap(self, propose):
        @functools.wraps(propose)  # keeps the hook marker
        def wrapped(strategy, ctx):
            self.calls += 1
            if self.calls not in self.failing:
                return self._record(ctx, propose(strategy, ctx))
            self.fault_at_length = len(ctx.sequences[0])
            if self.first_fault_length is None:
                self.first_fault_length = self.fault_at_length
            with _FailAt(self.fail_at) as mode:
                out = propose(strategy, ctx)
            self.ops = mode.ops
            return self._record(ctx, out)

        return wrapped

    def _record(self, ctx, proposal):
        if proposal is not None and int(proposal.lengths[0]):
            self.drafts[len(ctx.sequences[0])] = tuple(proposal.tokens[0, : int(proposal.lengths[0])].tolist())
        return proposal


@functools.lru_cache(maxsize=None)
def _zoo():
    from lightspec_core.loading import load_model, load_tokenizer

    path = str(lightspec_zoo.model_path())
    return load_model(path, torch.device("cpu"), torch.float32), load_tokenizer(path)


def _prompt() -> str:
    return lightspec_zoo.prompt_sets()["code"][0]


def _generate(name: str, recorder: _Recorder, monkeypatch, max_new_tokens: int = N_NEW):
    spec = STRATEGIES[name]
    strategy = build_strategy(spec if isinstance(spec, dict) else strategy_spec(spec), get_registry())
    cls = type(strategy)
    with monkeypatch.context() as m:
        m.setattr(cls, "lightspec_propose", recorder.wrap(cls.lightspec_propose))
        model, tok = _zoo()
        pipe = MTPPipeline(model, tok, strategy=strategy, draft_model=str(lightspec_zoo.model_path("draft")),
                           budget="static:k=4")
        return pipe.generate(_prompt(), max_new_tokens=max_new_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def clean():
    """Per strategy: the run without a fault (its output, its drafts, the operations of the
    faulty call)."""
    return {}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("spec", list(STRATEGIES))
def test_a_drafter_that_fails_midway_recovers(spec, where, clean, monkeypatch):
    if spec not in clean:
        rec = _Recorder()
        clean[spec] = (_generate(spec, rec, monkeypatch), rec)
    base, base_rec = clean[spec]
    assert base_rec.ops and base_rec.drafts, f"{spec} drafted nothing: the test would show nothing"
    at = {"first": 1, "middle": max(1, base_rec.ops // 2), "last": base_rec.ops}[where]
    rec = _Recorder(fail_at=at)
    out = _generate(spec, rec, monkeypatch)
    assert out.token_ids == base.token_ids
    assert out.stats.failures == [f"propose failed: RuntimeError: injected fault at tensor operation {at}"], \
        out.stats.failures
    after = sorted(n for n in rec.drafts if n > rec.fault_at_length and n in base_rec.drafts)
    assert len(after) >= 3, f"only {len(after)} common positions after the fault"
    differ = [n for n in after if rec.drafts[n] != base_rec.drafts[n]]
    assert not differ, (f"{spec}: after the fault at length {rec.fault_at_length}, drafts differ at lengths {differ}: "
                        f"{[(rec.drafts[n], base_rec.drafts[n]) for n in differ[:3]]}")


@pytest.mark.parametrize("spec", ["eagle3", "dspark", "mtp"])
def test_a_hidden_state_drafter_restarts_after_a_gap(spec, monkeypatch):
    """Failing for more steps than the engine keeps states (1,024 per row) leaves a gap in
    the states a drafter sees: it starts again from the first state it gets, fails no more,
    and its drafts are right again.  (The engine backs off a failing strategy: after the
    7th failure in a row it asks every 64 steps, so 24 failing calls span ~1,200 steps.)"""
    from lightspec_core.engine_parts import MAX_PENDING_HIDDEN

    failing = 24
    rec = _Recorder(fail_at=1, failing_calls=failing)
    model, tok = _zoo()
    n_prompt = len(tok(_prompt())["input_ids"])
    n_new = min(1400, model.config.max_position_embeddings - n_prompt)
    out = _generate(spec, rec, monkeypatch, max_new_tokens=n_new)
    clean = _Recorder()
    expected = _generate(spec, clean, monkeypatch, max_new_tokens=n_new)
    assert out.token_ids == expected.token_ids
    assert len(out.stats.failures) == failing  # the injected ones, and no other
    assert rec.fault_at_length - rec.first_fault_length > MAX_PENDING_HIDDEN  # the failures left a gap

    def first_token_right(drafts) -> float:
        after = {n: d for n, d in drafts.items() if n > rec.fault_at_length}
        assert len(after) >= 20, f"{spec} drafted {len(after)} times after the gap"
        return sum(d[0] == out.token_ids[n - n_prompt] for n, d in after.items()) / len(after)

    # after the gap the drafter has only the context since, so its drafts may be a little worse
    # than those of the run that never failed, never noise (a lost or misplaced state)
    assert first_token_right(rec.drafts) >= 0.8 * first_token_right(clean.drafts)
