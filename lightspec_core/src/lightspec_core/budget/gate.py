"""The confidence gate: each row's ``min_confidence`` (``Budget.min_confidence``).

Model drafters stop a row's draft when the peak probability of their next token falls
below the row's threshold tau.  The gate learns tau per row from a sliding window of the
row's last ``window`` verifies (steps where the row drafted).  Each verify gives, for the
row's *first* draft token (the only one the step statistics carry): its peak probability
p (``StepStats.confidence[b]``), its entropy h in nats (``StepStats.entropy[b]``), either
of which may be None (n-gram lookup has neither), whether it was accepted (a >= 1), and
the fraction of the draft accepted (a / d).

The rule, per row after each verify:

1. Boundary rule.  Over the window's verifies with a value, the mean p of accepted first
   tokens (p_acc) and of rejected ones (p_rej), and likewise h_acc and h_rej.  Where a
   feature has at least ``MIN_CLASS_SAMPLES`` verifies in each class and separates them
   the right way round, it gives a candidate threshold:

   * peak probability, when p_acc > p_rej: tau_p = (p_acc + p_rej) / 2;
   * entropy, when h_rej > h_acc: the boundary h* = (h_acc + h_rej) / 2, translated into
     a peak probability tau_h = exp(-h*).  A distribution whose peak is p has entropy at
     least -ln p (min-entropy <= Shannon entropy), so a token with p < exp(-h*) certainly
     has entropy above h*: stopping there stops only drafts past the entropy boundary.

   The candidates' mean, rounded to a multiple of 0.05 (the acceptance rule's grid) and
   clamped to [0.05, 0.9], becomes tau when it is more than one grid step away from the
   current tau; otherwise tau stays.  (The means of a 16-verify window are noisy: without
   the grid and the dead band, a batch's thresholds changed on nearly every step, and
   the policy built a new ``min_confidence`` tensor each time.)  The threshold learnt on
   first tokens is applied at every draft position.
2. Acceptance rule (no candidate: no confidence or entropy values, as with n-gram drafts,
   or not enough rejected or accepted verifies, or values that do not separate them).
   The mean of a / d over the window moves tau by 0.05 a verify: down (draft deeper) when
   above 0.8, not below 0.05; up when below 0.5, not above 0.9.  With only None values
   this is exactly the gate's behaviour before peak probability and entropy were used.

A row starts at the policy's ``min_confidence`` (``base``).
"""

from __future__ import annotations

import math
from collections import deque

MIN_CLASS_SAMPLES = 2  # verifies per class (accepted / rejected first token) before a feature counts
TAU_MIN, TAU_MAX, TAU_STEP = 0.05, 0.9, 0.05
HYSTERESIS = TAU_STEP * 1.001  # the boundary rule moves tau only by more than one grid step


class ConfidenceGate:
    """Per-row confidence thresholds over a window of ``window`` verifies, from ``base``."""

    def __init__(self, window: int, base: float):
        self.window = window
        self.base = base
        self.recent: dict[int, deque[float]] = {}  # request -> a / d of its last verifies
        # request -> [n, sum of p] for rejected then accepted first tokens, then the same for
        # h, then the deque of its last verifies' (p, h, accepted?): kept as samples enter
        # and leave, so that a verify costs O(1) per row (the policy runs on every step)
        self.stats: dict[int, list] = {}
        self.threshold: dict[int, float] = {}

    def new_generation(self) -> None:
        """Forget every row (request ids restart)."""
        self.recent.clear()
        self.stats.clear()
        self.threshold.clear()

    def thresholds(self, row_ids: list[int]) -> tuple[float, ...]:
        """Each row's tau, in row order."""
        get, base = self.threshold.get, self.base
        return tuple(get(r, base) for r in row_ids)

    def learn(self, event) -> None:
        """Slide each drafting row's windows by this step's verify and move its tau."""
        rows = event.row_ids
        confidence, entropy = event.confidence, event.entropy
        if len(confidence) != len(rows):
            confidence = [None] * len(rows)
        if len(entropy) != len(rows):
            entropy = [None] * len(rows)
        window, threshold = self.window, self.threshold
        for rid, d, a, p, h in zip(rows, event.levels, event.accepted, confidence, entropy):
            if d == 0:
                continue
            win = self.recent.get(rid)
            if win is None:
                win = self.recent[rid] = deque(maxlen=window)
            win.append(a / d)
            st = self.stats.get(rid)
            if st is not None or p is not None or h is not None:
                if st is None:
                    st = self.stats[rid] = [0, 0.0, 0, 0.0, 0, 0.0, 0, 0.0, deque()]
                samples = st[8]
                if len(samples) == window:  # the oldest verify leaves (an emptied sum is exactly 0)
                    op, oh, i = samples.popleft()
                    if op is not None:
                        st[i] -= 1
                        st[i + 1] = st[i + 1] - op if st[i] else 0.0
                    if oh is not None:
                        st[i + 4] -= 1
                        st[i + 5] = st[i + 5] - oh if st[i + 4] else 0.0
                i = 2 if a >= 1 else 0  # accepted or rejected first token
                samples.append((p, h, i))
                if p is not None:
                    st[i] += 1
                    st[i + 1] += p
                if h is not None:
                    st[i + 4] += 1
                    st[i + 5] += h
                # the boundary rule: a candidate per feature that separates the classes
                total, n = 0.0, 0
                if st[0] >= MIN_CLASS_SAMPLES and st[2] >= MIN_CLASS_SAMPLES:
                    rej, acc = st[1] / st[0], st[3] / st[2]
                    if acc > rej:
                        total, n = total + 0.5 * (acc + rej), n + 1
                if st[4] >= MIN_CLASS_SAMPLES and st[6] >= MIN_CLASS_SAMPLES:
                    rej, acc = st[5] / st[4], st[7] / st[6]
                    if rej > acc:
                        total, n = total + math.exp(-0.5 * (acc + rej)), n + 1
                if n:
                    tau = min(TAU_MAX, max(TAU_MIN, round(total / n / TAU_STEP) * TAU_STEP))
                    old = threshold.get(rid, self.base)
                    if abs(tau - old) > HYSTERESIS:
                        threshold[rid] = tau
                    continue
            rate = sum(win) / len(win)  # the acceptance rule
            tau = threshold.get(rid, self.base)
            if rate > 0.8:
                tau = max(TAU_MIN, tau - TAU_STEP)
            elif rate < 0.5:
                tau = min(TAU_MAX, tau + TAU_STEP)
            threshold[rid] = tau
