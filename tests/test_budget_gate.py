"""The confidence gate: each row's min_confidence, learnt from a window of its verifies:
the first draft token's peak probability and entropy where drafts were accepted and where
rejected; without those values, the acceptance rule."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from lightspec_core.budget import DynamicBudget
from lightspec_core.budget.gate import ConfidenceGate
from lightspec_core.stats import StepStats
from test_budget import T1, ctx, history, step


def grid(tau: float) -> float:
    """``tau`` on the gate's 0.05 grid."""
    return round(tau / 0.05) * 0.05


def verify(drafted, accepted, confidence=None, entropy=None, rows=None) -> StepStats:
    """One step of len(drafted) rows (request ids 0..B-1 unless ``rows``)."""
    B = len(drafted)
    ev = step(max(drafted) + 1, T1, drafted=tuple(drafted), accepted=tuple(accepted))
    ev.confidence = list(confidence) if confidence is not None else [None] * B
    ev.entropy = list(entropy) if entropy is not None else [None] * B
    if rows is not None:
        ev.row_ids = list(rows)
    return ev


def acceptance_rule(events, window, base):
    """The gate before peak probability and entropy were used (its reference)."""
    recent, tau = {}, {}
    for ev in events:
        for rid, d, a in zip(ev.row_ids, ev.drafted, ev.accepted):
            if d == 0:
                continue
            win = recent.setdefault(rid, deque(maxlen=window))
            win.append(a / d)
            rate = sum(win) / len(win)
            t = tau.get(rid, base)
            if rate > 0.8:
                t = max(0.05, t - 0.05)
            elif rate < 0.5:
                t = min(0.9, t + 0.05)
            tau[rid] = t
    return tau


def test_without_confidence_or_entropy_the_gate_is_the_acceptance_rule():
    rng = random.Random(0)
    events = []
    for _ in range(300):
        drafted = [rng.choice((0, 1, 3, 5)) for _ in range(3)]
        events.append(verify(drafted, [rng.randint(0, d) for d in drafted]))
    gate = ConfidenceGate(window=5, base=0.3)
    for ev in events:
        gate.learn(ev)
    assert gate.threshold == acceptance_rule(events, 5, 0.3) and gate.threshold


def test_peak_probability_puts_the_threshold_between_rejected_and_accepted_drafts():
    gate = ConfidenceGate(window=16, base=0.3)
    for i in range(8):  # accepted at peak 0.9 (and 0.8), rejected at 0.3 (and 0.4)
        ok = i % 2 == 0
        gate.learn(verify([4], [4 if ok else 0], confidence=[(0.9 if i % 4 == 0 else 0.8) if ok else (0.3 if i % 4 == 1 else 0.4)]))
    assert gate.thresholds([0]) == (pytest.approx((0.85 + 0.35) / 2),)


def test_entropy_gives_the_peak_probability_its_boundary_guarantees():
    gate = ConfidenceGate(window=16, base=0.3)
    for i in range(8):  # accepted at entropy 0.1 nats, rejected at 1.3
        ok = i % 2 == 0
        gate.learn(verify([4], [3 if ok else 0], entropy=[0.1 if ok else 1.3]))
    assert gate.thresholds([0]) == (pytest.approx(grid(math.exp(-0.7))),)  # 0.497 -> 0.5
    both = ConfidenceGate(window=16, base=0.3)
    for i in range(8):
        ok = i % 2 == 0
        both.learn(verify([4], [3 if ok else 0], confidence=[0.9 if ok else 0.3], entropy=[0.1 if ok else 1.3]))
    assert both.thresholds([0]) == (pytest.approx(grid((0.6 + math.exp(-0.7)) / 2)),)  # 0.548 -> 0.55


def test_the_boundary_moves_tau_only_by_more_than_one_grid_step():
    """Noise in the window's means does not move the threshold (nor make new tensors)."""
    gate = ConfidenceGate(window=4, base=0.3)
    for conf in (0.9, 0.5, 0.9, 0.5):  # boundary 0.7
        gate.learn(verify([2], [2 if conf > 0.6 else 0], confidence=[conf]))
    assert gate.thresholds([0]) == (pytest.approx(0.7),)
    for conf in (0.95, 0.5, 0.95, 0.5):  # boundary 0.725 -> 0.7 or 0.75: one step at most, tau stays
        gate.learn(verify([2], [2 if conf > 0.6 else 0], confidence=[conf]))
        assert gate.thresholds([0]) == (pytest.approx(0.7),)
    for conf in (0.98, 0.62, 0.98, 0.62):  # boundary 0.8: two steps away, tau moves
        gate.learn(verify([2], [2 if conf > 0.9 else 0], confidence=[conf]))
    assert gate.thresholds([0]) == (pytest.approx(0.8),)


def test_values_that_do_not_separate_the_classes_or_too_few_rejections_fall_back():
    inverted = ConfidenceGate(window=16, base=0.3)
    few = ConfidenceGate(window=16, base=0.3)
    events_inv, events_few = [], []
    for i in range(8):  # rejected drafts were the confident ones: peak probability says nothing here
        ok = i % 2 == 0
        events_inv.append(verify([2], [2 if ok else 0], confidence=[0.3 if ok else 0.9], entropy=[1.5 if ok else 0.1]))
    for i in range(8):  # one rejection only
        events_few.append(verify([2], [0 if i == 3 else 2], confidence=[0.2 if i == 3 else 0.9]))
    for ev in events_inv:
        inverted.learn(ev)
    for ev in events_few:
        few.learn(ev)
    assert inverted.threshold == acceptance_rule(events_inv, 16, 0.3)
    assert few.threshold == acceptance_rule(events_few, 16, 0.3)


def test_the_window_slides_and_rows_are_kept_apart():
    gate = ConfidenceGate(window=4, base=0.3)
    for i in range(4):  # row 0: accepted at 0.9, rejected at 0.5; row 1: no values
        ok = i % 2 == 0
        gate.learn(verify([2, 2], [2 if ok else 0, 2], confidence=[0.9 if ok else 0.5, None]))
    assert gate.thresholds([0, 1]) == (pytest.approx(0.7), pytest.approx(0.1))  # row 1: 4 full acceptances, 0.3 - 4 x 0.05
    for i in range(4):  # the drafter got sharper: accepted at 0.98, rejected at 0.82
        ok = i % 2 == 0
        gate.learn(verify([2, 2], [2 if ok else 0, 2], confidence=[0.98 if ok else 0.82, None]))
    assert gate.thresholds([0]) == (pytest.approx(0.9),)  # the old verifies left the window
    for _ in range(4):  # verifies without values push the samples out: back to the acceptance rule
        gate.learn(verify([2, 2], [2, 2], rows=[0, 1]))
    assert gate.thresholds([0]) == (pytest.approx(0.9 - 0.05),)
    gate.new_generation()
    assert gate.thresholds([0, 1]) == (0.3, 0.3)


def test_the_dynamic_policy_passes_the_learnt_threshold_to_the_drafters():
    p = DynamicBudget(min_confidence=0.3)
    p.lightspec_on_stats(step(1, T1))
    for i in range(8):
        ok = i % 2 == 0
        p.lightspec_on_stats(verify([3], [3 if ok else 0], confidence=[0.8 if ok else 0.4]))
    b = p.lightspec_budget(ctx([history(20, 2)]))
    assert int(b.max_draft[0]) > 0 and b.min_confidence.tolist() == [pytest.approx(0.6)]
