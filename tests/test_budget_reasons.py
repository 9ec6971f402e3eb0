"""Every policy says why it chose its draft length (``Budget.reason``) and with which
numbers (``Budget.estimates``), for the per-step statistics."""

from __future__ import annotations

import pytest
from lightspec_core.budget import BATCH_CALIBRATION, PLAIN_REFRESH, RECHECK, DynamicBudget, StaticBudget
from test_budget import T1, calibrate, ctx, history, plain, rows_step, slow_step, step


def decide(p, histories, deterministic=False):
    b = p.lightspec_budget(ctx(histories, deterministic))
    return b.max_draft.tolist(), b.reason, b.estimates


def test_static_reports_static_and_its_k():
    b = StaticBudget(k=3).lightspec_budget(ctx([history(0, 0)] * 2))
    assert b.reason == "static" and b.estimates == {"k": 3.0}


def test_dynamic_reports_calibration_then_the_models_estimates():
    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    good = [history(accepted=20, rejected=2)]
    ks, reason, est = decide(p, good)
    assert ks == [0] and reason == "calibrating" and est == {}
    p.lightspec_on_stats(step(1, T1))
    ks, reason, est = decide(p, good)
    assert ks[0] >= 3 and reason == "model"
    assert set(est) == {"acceptance", "hit_rate", "t1", "beta", "draft_cost", "gain"}
    assert est["t1"] == pytest.approx(T1) and est["beta"] == pytest.approx(0.1) and est["draft_cost"] == 0.05
    assert est["acceptance"] == pytest.approx(0.6) and est["hit_rate"] == pytest.approx(0.9)  # the priors
    # the gain is the modelled tokens per row per plain step's time of the chosen k: the row
    # gets a draft with probability h (the hit rate), and the verify is paid only then
    a, h, k = good[0].acceptance(prior=0.6), est["hit_rate"], ks[0]
    assert est["gain"] == pytest.approx((1 + h * sum(a ** i for i in range(1, k + 1))) / (1 - h + h * (1 + 0.15 * k)))
    ks, reason, est = decide(p, [history(accepted=0, rejected=20)])
    assert ks == [0] and reason == "model" and est["gain"] == pytest.approx(1.0)  # plain decoding by the model


def test_dynamic_reports_hold_recheck_refresh_probe_and_seeded():
    batch = [history(accepted=30, rejected=3)] * 8
    pr = DynamicBudget(beta=0.1, draft_cost=0.01)
    assert decide(pr, batch)[1] == "calibrating"
    for _ in range(BATCH_CALIBRATION):
        pr.lightspec_on_stats(plain(8))
    ks, reason, est = decide(pr, batch)  # a batch size whose verify was never measured
    assert ks == [1] * 8 and reason == "probe" and "gain" not in est

    p = DynamicBudget(beta=0.1, draft_cost=0.01)
    assert decide(p, batch)[1] == "calibrating"  # the generation's first decision
    calibrate(p, 8)
    for _ in range(12):
        assert decide(p, batch)[1] == "model"
        p.lightspec_on_stats(slow_step(8))
    assert p.guard.hold == 16
    ks, reason, est = decide(p, batch)
    assert ks == [0] * 8 and reason == "hold" and est == {}

    q = DynamicBudget(beta=0.3, draft_cost=0.05)
    calibrate(q, 8)
    assert decide(q, [history(0, 40)] * 8)[:2] == ([0] * 8, "model")
    for _ in range(RECHECK):
        assert decide(q, [history(40, 1)] * 8)[:2] == ([0] * 8, "recheck")

    r = DynamicBudget(beta=0.12, draft_cost=0.0, guard=False)
    good = [history(40, 1)] * 8
    for _ in range(BATCH_CALIBRATION):
        r.lightspec_on_stats(rows_step(8, 3 * T1))
    calibrate(r, 8)
    for _ in range(PLAIN_REFRESH):
        r.lightspec_on_stats(rows_step(8, 4 * T1, drafted=1, accepted=1))
    assert decide(r, good)[:2] == ([0] * 8, "refresh")

    ks, reason, est = decide(DynamicBudget(), [history(20, 2)], deterministic=True)
    assert ks[0] > 0 and reason == "seeded" and est == {"beta": 0.12, "draft_cost": 0.05}


def test_a_single_row_that_keeps_choosing_plain_decoding_explores_now_and_then():
    """A k = 0 decision measures neither acceptance nor cost, so it could never be revised:
    after EXPLORE_AFTER of them in a row one row drafts one token ("explore"), the interval
    doubles while the model keeps choosing 0, and a decision to draft resets it."""
    from lightspec_core.budget.dynamic import EXPLORE_AFTER, MAX_EXPLORE_AFTER

    assert DynamicBudget().first_explore == 0  # off by default (docs/design/budget.md)
    p = DynamicBudget(beta=0.1, draft_cost=0.05, explore_after=EXPLORE_AFTER)
    bad, good = [history(accepted=0, rejected=20)], [history(accepted=20, rejected=2)]
    decide(p, bad)
    p.lightspec_on_stats(step(1, T1))
    for interval in (EXPLORE_AFTER, 2 * EXPLORE_AFTER):
        for _ in range(interval - 1):
            assert decide(p, bad)[:2] == ([0], "model")
        ks, reason, est = decide(p, bad)
        assert ks == [1] and reason == "explore" and "gain" not in est and p.last_k == 1
    assert decide(p, good)[1] == "model" and p.explore_after == EXPLORE_AFTER  # drafting resets the interval
    p.explore_after = MAX_EXPLORE_AFTER
    p.idle = MAX_EXPLORE_AFTER - 1
    assert decide(p, bad)[1] == "explore" and p.explore_after == MAX_EXPLORE_AFTER
    batch = DynamicBudget(beta=0.1, draft_cost=0.05, explore_after=EXPLORE_AFTER)  # batches recheck instead
    calibrate(batch, 4)
    assert all(decide(batch, bad * 4)[1] in ("model", "recheck") for _ in range(3 * EXPLORE_AFTER))


def test_by_default_a_row_never_explores_and_bad_explore_after_values_are_named():
    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    bad = [history(accepted=0, rejected=20)]
    decide(p, bad)
    p.lightspec_on_stats(step(1, T1))
    reasons = [decide(p, bad) for _ in range(300)]
    assert all(ks == [0] for ks, *_ in reasons) and {r for _, r, *_ in reasons} == {"model", "recheck"}
    short = DynamicBudget(beta=0.1, draft_cost=0.05, explore_after=3)
    decide(short, bad)
    short.lightspec_on_stats(step(1, T1))
    assert [decide(short, bad)[1] for _ in range(9)] == ["model"] * 2 + ["explore"] + ["model"] * 5 + ["explore"]
    for v in (-1, 2.5, True):
        with pytest.raises(ValueError, match=f"explore_after={v!r} is invalid: use an integer >= 0"):
            DynamicBudget(explore_after=v)


@pytest.mark.parametrize("hints, rows", [
    ({"ngram": 0.0, "draft_model": 0.16}, 1),  # a union / hybrid of a free and a model drafter
    ({"draft_model": 0.16}, 1),
    ({"ngram": 0.0}, 1),
    ({"ngram": 0.0, "draft_model": 0.16}, 2),
])
def test_the_strategys_hold_decodes_plainly(hints, rows):
    """The strategy's own guard holds plain decoding, whatever its drafters (for a mixed single
    row that window holds only the steps where nothing but free drafters drafted)."""
    p = DynamicBudget(beta=0.1, draft_cost=0.01, free_max_draft=12)
    c = ctx([history(30, 3)] * rows)
    p.lightspec_budget(c)  # the generation's first decision
    calibrate(p, rows)
    p.guard.hold = 3
    c.draft_cost_hints = hints
    b = p.lightspec_budget(c)
    assert b.reason == "hold" and p.guard.hold == 2
    assert b.max_draft.tolist() == [0] * rows and not b.by_source


@pytest.mark.parametrize("hints, rows, want", [
    ({"ngram": 0.0, "draft_model": 0.16}, 1, "hold_free"),  # a union / hybrid of a free and a model drafter
    ({"draft_model": 0.16}, 1, "model"),                    # no free drafter: the model guard does not apply
    ({"ngram": 0.0}, 1, "model"),
    ({"ngram": 0.0, "draft_model": 0.16}, 2, "model"),      # a batch shares one verify: one guard
])
def test_the_model_drafters_hold_lets_a_single_rows_free_drafters_go_on(hints, rows, want):
    """While the model drafters' guard holds, a single row whose strategy has model-free
    drafters next to model drafters lets the free ones draft (the model drafters are capped at
    0 by source); it does not apply to any other strategy or to batches."""
    p = DynamicBudget(beta=0.1, draft_cost=0.01, free_max_draft=12)
    c = ctx([history(30, 3)] * rows)
    p.lightspec_budget(c)
    calibrate(p, rows)
    p.guard.model_hold = 3
    c.draft_cost_hints = hints
    b = p.lightspec_budget(c)
    assert b.reason == want
    if want == "hold_free":
        assert p.guard.model_hold == 2
        assert b.max_draft.tolist() == [12] and b.free_max_draft == [12]
        assert b.by_source == {"draft_model": [0]}
    else:
        assert p.guard.model_hold == 3
