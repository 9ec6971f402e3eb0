"""The ``feedback`` policy: B_{t+1} = clamp(alpha B_t + beta r_t, 0, max_draft) with r_t the
step's measured speed-up over plain decoding, on synthetic step statistics (fixed point,
clamps, probing after plain steps, the hold rule, batch sizes kept apart, seeded requests),
and a lossless pipeline run."""

from __future__ import annotations

import pytest
from lightspec_core.budget import FeedbackBudget
from lightspec_core.plugins import get_registry
from models import ToyTokenizer, cached_model, hf_greedy, make_prompts
from test_budget import ctx, history, step

from lightspec_core import MTPPipeline

TP = 0.010  # seconds of a plain step in these synthetic runs


def one_step(p, rows=1, ratio=1.0, accepted=None, deterministic=False, greedy=True):
    """Let ``p`` decide a step of ``rows`` rows, then report it: a plain step takes TP, a
    speculative one emits ``accepted + 1`` tokens per row (all drafts by default) in the
    time that makes its speed-up over plain decoding exactly ``ratio``.  Returns the Budget."""
    c = ctx([history(0, 0)] * rows, deterministic)
    if not greedy:
        c.sampling = type(c.sampling)(temperature=0.8)
    b = p.lightspec_budget(c)
    k = max(b.max_draft.tolist())
    if k == 0:
        ev = step(1, TP, drafted=(0,) * rows, accepted=(0,) * rows)
    else:
        a = k if accepted is None else min(accepted, k)
        ev = step(k + 1, TP, drafted=(k,) * rows, accepted=(a,) * rows)
        t_plain = plain_time(p, rows, greedy) if (rows, greedy) in p.loops else TP  # seeded: no loop
        ev.step_time_s = (a + 1) * t_plain / ratio
    p.lightspec_on_stats(ev)
    return b


def plain_time(p, rows, greedy=True):
    return p.loops[(rows, greedy)].plain.median()


def calibrated(rows=1, **opts) -> FeedbackBudget:
    p = FeedbackBudget(**opts)
    for _ in range(p.calibration):
        b = one_step(p, rows)
        assert b.max_draft.tolist() == [0] * rows and b.reason == "calibrating"
    return p


def test_calibrates_then_drafts_the_break_even_fixed_point():
    p = calibrated()
    assert plain_time(p, 1) == pytest.approx(TP)
    b = p.lightspec_budget(ctx([history(0, 0)]))
    assert b.max_draft.tolist() == [2] and b.reason == "feedback"  # beta / (1 - alpha) = 2
    assert b.estimates["B"] == pytest.approx(2.0) and b.estimates["t_plain"] == pytest.approx(TP)


@pytest.mark.parametrize("alpha, beta, ratio", [(0.5, 1.0, 1.5), (0.5, 1.0, 2.0), (0.8, 0.5, 1.2), (0.0, 2.0, 1.6)])
def test_converges_to_the_fixed_point_beta_r_over_one_minus_alpha(alpha, beta, ratio):
    p = calibrated(alpha=alpha, beta=beta, refresh=10_000)
    for _ in range(60):
        b = one_step(p, ratio=ratio)
    want = beta * ratio / (1 - alpha)
    assert p.loops[(1, True)].B == pytest.approx(want, rel=1e-6)
    assert b.max_draft.tolist() == [int(want + 0.5)] and b.estimates["ratio"] == pytest.approx(ratio)
    # the recursion itself, one step at a time
    loop = p.loops[(1, True)]
    loop.B = 1.0
    one_step(p, ratio=ratio)
    assert loop.B == pytest.approx(alpha * 1.0 + beta * ratio)


def test_the_measured_ratio_is_emitted_tokens_times_the_plain_latency_over_the_step_time():
    p = calibrated()
    b = p.lightspec_budget(ctx([history(0, 0)] * 1))
    k = int(b.max_draft[0])
    ev = step(k + 1, TP, drafted=(k,), accepted=(1,))  # 2 tokens emitted
    ev.step_time_s = 1.6 * TP
    p.lightspec_on_stats(ev)
    loop = p.loops[(1, True)]
    assert loop.ratio == pytest.approx(2 * TP / (1.6 * TP))
    assert loop.B == pytest.approx(0.5 * 2.0 + 1.0 * 1.25)


def test_b_is_clamped_to_zero_and_max_draft():
    p = calibrated(max_draft=4, refresh=10_000)
    for _ in range(30):
        b = one_step(p, ratio=10.0)
    assert p.loops[(1, True)].B == 4.0 and b.max_draft.tolist() == [4]
    q = calibrated(min_ratio=0.0)
    q.loops[(1, True)].B = 0.3
    assert one_step(q).max_draft.tolist() == [0]  # round(0.3) = 0: plain decoding


def test_a_plain_step_moves_b_towards_beta_over_one_minus_alpha_so_it_probes():
    """B = 0 is not absorbing: a plain step counts as r = 1."""
    p = calibrated(min_ratio=0.0)
    loop = p.loops[(1, True)]
    loop.B = 0.0
    b = one_step(p)
    assert b.max_draft.tolist() == [0] and loop.B == pytest.approx(1.0)  # 0.5 * 0 + 1 * 1
    assert one_step(p, ratio=0.05).max_draft.tolist() == [1]  # it probes
    ks = [int(one_step(p, ratio=0.05).max_draft[0]) for _ in range(40)]
    assert 0 in ks and 1 in ks  # speculation that never pays: alternating probes, B near 2 r


def test_speculation_that_keeps_losing_is_held_then_probed_again():
    p = calibrated(patience=4, hold=10, min_ratio=0.9, refresh=10_000)
    reasons = [one_step(p, ratio=0.5).reason for _ in range(4)]
    assert reasons == ["feedback"] * 4
    loop = p.loops[(1, True)]
    assert loop.hold == 10 and loop.ewma is None
    held = [one_step(p, ratio=0.5) for _ in range(10)]
    assert all(b.reason == "hold" and b.max_draft.tolist() == [0] for b in held)
    assert loop.B == pytest.approx(2.0, abs=0.01)  # the plain steps pulled B back to beta / (1 - alpha)
    b = one_step(p, ratio=0.5)
    assert b.reason == "feedback" and b.max_draft.tolist() == [2]  # probing again
    # speculation that pays is never held
    w = calibrated(patience=4, hold=10, refresh=10_000)
    assert all(one_step(w, ratio=1.3).reason == "feedback" for _ in range(50))
    # a single losing step among winning ones does not hold either
    assert all(one_step(w, ratio=r).reason == "feedback" for r in (0.5, 1.3, 1.3, 0.5, 1.3, 1.3) * 5)


def test_a_plain_step_refreshes_the_plain_latency_every_refresh_steps():
    p = calibrated(refresh=5)
    reasons = [one_step(p, ratio=1.2).reason for _ in range(12)]
    assert reasons == ["feedback"] * 5 + ["refresh"] + ["feedback"] * 5 + ["refresh"]


def test_batch_sizes_are_kept_apart():
    """Each batch size (and greedy or sampled) has its own plain latency, B and hold."""
    p = calibrated(rows=1, refresh=10_000)
    for _ in range(20):
        one_step(p, rows=1, ratio=2.0)
    assert p.loops[(1, True)].B == pytest.approx(4.0)
    b = one_step(p, rows=8)  # a batch size never seen: calibrated first, from B at break-even
    assert b.reason == "calibrating" and p.loops[(8, True)].B == pytest.approx(2.0)
    for _ in range(p.calibration - 1):
        one_step(p, rows=8)
    for _ in range(20):
        one_step(p, rows=8, ratio=0.95)
    assert p.loops[(8, True)].B == pytest.approx(1.9) and p.loops[(1, True)].B == pytest.approx(4.0)
    assert one_step(p, rows=1, greedy=False).reason == "calibrating"  # sampled: its own loop
    # the plain latency of 8 rows is measured on 8-row plain steps only
    q = calibrated(rows=1)
    for _ in range(q.calibration):
        c = ctx([history(0, 0)] * 4)
        q.lightspec_budget(c)
        q.lightspec_on_stats(step(1, 3 * TP, drafted=(0,) * 4, accepted=(0,) * 4))
    assert plain_time(q, 4) == pytest.approx(3 * TP) and plain_time(q, 1) == pytest.approx(TP)


def test_seeded_requests_draft_a_fixed_length_whatever_the_timing():
    p = calibrated(refresh=10_000)
    for _ in range(10):
        one_step(p, ratio=3.0)
    assert p.loops[(1, True)].B > 5
    b = one_step(p, deterministic=True, ratio=0.1)
    assert b.max_draft.tolist() == [2] and b.reason == "seeded"
    B = p.loops[(1, True)].B
    assert one_step(p, deterministic=True, ratio=0.1).max_draft.tolist() == [2]
    assert p.loops[(1, True)].B == B  # seeded steps do not feed the loop
    assert one_step(FeedbackBudget(alpha=0.6), deterministic=True).max_draft.tolist() == [3]  # 2.5 rounds up
    assert one_step(FeedbackBudget(beta=5.0, max_draft=6), rows=2, deterministic=True).max_draft.tolist() == [6, 6]


@pytest.mark.parametrize("kw, bad", [({"alpha": 1.0}, "alpha=1.0"), ({"alpha": -0.1}, "alpha=-0.1"), ({"beta": 0}, "beta=0"),
                                     ({"max_draft": 0}, "max_draft=0"), ({"min_ratio": -1}, "min_ratio=-1"),
                                     ({"patience": 0}, "patience=0"), ({"hold": -1}, "hold=-1"),
                                     ({"calibration": 0}, "calibration=0"), ({"refresh": 1.5}, "refresh=1.5"),
                                     ({"min_confidence": 1}, "min_confidence=1"), ({"alpha": True}, "alpha=True")])
def test_feedback_rejects_bad_options(kw, bad):
    with pytest.raises(ValueError, match=bad):
        FeedbackBudget(**kw)


def test_feedback_is_registered_with_its_options():
    reg = get_registry()
    p = reg.create("budget", "feedback", alpha=0.6, hold=4)
    assert isinstance(p, FeedbackBudget) and p.alpha == 0.6 and p.hold == 4
    assert {"alpha", "beta", "max_draft", "min_ratio", "patience", "hold"} <= set(reg.get("budget", "feedback").params)


@pytest.mark.parametrize("strategy, draft", [("ngram", None), ("draft_model", "small")])
def test_a_pipeline_with_the_feedback_budget_is_lossless(strategy, draft):
    prompts = make_prompts(6, seed=3)
    model = cached_model("llama")
    refs = [hf_greedy(model, p, 24) for p in prompts]
    opts = {"min_ngram": 1} if strategy == "ngram" else {}
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=strategy, budget="feedback",
                       draft_model=cached_model("llama", 1, 1) if draft else None, **opts)
    assert isinstance(pipe.budget, FeedbackBudget)
    out = pipe.generate(prompts, max_new_tokens=24, ignore_eos=True)
    assert [o.token_ids for o in out] == refs
    one = pipe.generate([prompts[0]], max_new_tokens=24, ignore_eos=True)[0]
    assert one.token_ids == refs[0]
    assert sum(o.stats.drafted for o in out) + one.stats.drafted > 0  # it did speculate
