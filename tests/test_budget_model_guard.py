"""The model drafters' own throughput guard (``ThroughputGuard``, docs/design/budget.md,
"Guard"): a single row whose strategy mixes model-free and model drafters judges the steps
where a model drafter drafted on their own, holds only the model drafters after a loss and
carries that hold into its next generation."""

from __future__ import annotations

from lightspec_core.budget import DynamicBudget
from lightspec_core.budget.guard import GUARD_HOLD, GUARD_WINDOW
from test_budget import T1, calibrate, ctx, history, slow_step, step

MIXED = {"ngram": 0.0, "draft_model": 0.16}


def model_step(seconds_per_token: float) -> object:
    """A single row's step where the draft model drafted 3 tokens and 2 were kept (3 emitted)."""
    ev = step(4, T1, drafted=(3,), accepted=(2,))
    ev.step_time_s = 3 * seconds_per_token
    ev.draft_by_source = {"draft_model": (0.3 * T1, 3)}
    return ev


def free_step(seconds_per_token: float) -> object:
    """A single row's step where only the n-gram lookup drafted (no model forward)."""
    ev = step(4, T1, drafted=(3,), accepted=(2,), source="ngram")
    ev.step_time_s = 3 * seconds_per_token
    return ev


def policy(hints=MIXED) -> tuple[DynamicBudget, object]:
    p = DynamicBudget(beta=0.1, draft_cost=0.01, free_max_draft=12)
    c = ctx([history(30, 3)])
    c.draft_cost_hints = hints
    p.lightspec_budget(c)  # the generation's first decision
    calibrate(p)
    p.lightspec_budget(c)
    return p, c


def test_losing_model_steps_hold_the_model_drafters_only_and_the_hold_doubles():
    p, c = policy()
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(model_step(2 * T1))  # 2 plain steps' time per token: a loss
    assert p.guard.model_hold == GUARD_HOLD and p.guard.hold == 0
    reasons = [p.lightspec_budget(c).reason for _ in range(GUARD_HOLD)]
    assert reasons == ["hold_free"] * GUARD_HOLD
    assert p.lightspec_budget(c).reason != "hold_free"  # the hold is over: the model drafts again
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(model_step(2 * T1))
    assert p.guard.model_hold == 2 * GUARD_HOLD  # a repeated loss doubles it


def test_winning_model_steps_and_losing_free_steps_are_judged_apart():
    p, c = policy()
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(model_step(0.5 * T1))  # half a plain step per token: a win
    assert p.guard.model_hold == 0 and p.guard.hold == 0
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(free_step(2 * T1))  # the free drafter itself lost: hold everything
    assert p.guard.hold == GUARD_HOLD and p.guard.model_hold == 0
    assert p.lightspec_budget(c).reason == "hold"


def test_the_model_drafters_hold_carries_into_the_next_generation():
    p, c = policy()
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(model_step(2 * T1))
    for _ in range(3):
        p.lightspec_budget(c)
    p.reset()  # the engine's call before the next generate()
    assert p.lightspec_budget(c).reason == "hold_free"
    assert p.guard.model_hold == GUARD_HOLD - 4


def test_strategies_with_one_kind_of_drafter_keep_one_guard():
    """A model drafter alone (or free drafters alone) fills the strategy's window: a loss there
    holds plain decoding, as before."""
    p, c = policy({"draft_model": 0.16})
    for _ in range(GUARD_WINDOW):
        p.lightspec_on_stats(model_step(2 * T1))
    assert p.guard.hold == GUARD_HOLD and p.guard.model_hold == 0
    p, c = policy()
    batch = ctx([history(30, 3)] * 2)
    batch.draft_cost_hints = MIXED
    p.lightspec_budget(batch)
    assert p.guard.mixed is False  # a batch shares one verify: one guard
    ev = slow_step(2)
    ev.draft_by_source = {"draft_model": (0.001, 1)}
    p.lightspec_on_stats(ev)
    assert len(p.guard.model_window) == 0
