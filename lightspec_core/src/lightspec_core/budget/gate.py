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

   tau is the mean of the candidates, clamped to [0.05, 0.9].  The threshold learnt on
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


class _Sums:
    """Running counts and sums of p and h per class over a row's window (kept as samples
    enter and leave, so that a step costs O(1) per row)."""

    __slots__ = ("n_p", "s_p", "n_h", "s_h")

    def __init__(self):
        self.n_p = [0, 0]  # [rejected, accepted]
        self.s_p = [0.0, 0.0]
        self.n_h = [0, 0]
        self.s_h = [0.0, 0.0]

    def add(self, p: float | None, h: float | None, ok: int, sign: int) -> None:
        if p is not None:
            self.n_p[ok] += sign
            self.s_p[ok] = self.s_p[ok] + sign * p if self.n_p[ok] else 0.0  # empty: exactly 0, no residue
        if h is not None:
            self.n_h[ok] += sign
            self.s_h[ok] = self.s_h[ok] + sign * h if self.n_h[ok] else 0.0

    def boundary(self) -> float | None:
        """The boundary rule's tau, or None when no feature gives a candidate."""
        cands = []
        n, s = self.n_p, self.s_p
        if n[0] >= MIN_CLASS_SAMPLES and n[1] >= MIN_CLASS_SAMPLES:
            rej, acc = s[0] / n[0], s[1] / n[1]
            if acc > rej:
                cands.append(0.5 * (acc + rej))
        n, s = self.n_h, self.s_h
        if n[0] >= MIN_CLASS_SAMPLES and n[1] >= MIN_CLASS_SAMPLES:
            rej, acc = s[0] / n[0], s[1] / n[1]
            if rej > acc:
                cands.append(math.exp(-0.5 * (acc + rej)))
        if not cands:
            return None
        return min(TAU_MAX, max(TAU_MIN, sum(cands) / len(cands)))


class ConfidenceGate:
    """Per-row confidence thresholds over a window of ``window`` verifies, from ``base``."""

    def __init__(self, window: int, base: float):
        self.window = window
        self.base = base
        self.recent: dict[int, deque[float]] = {}  # request -> a / d of its last verifies
        self.samples: dict[int, deque[tuple]] = {}  # request -> (p, h, accepted?) of its last verifies
        self.sums: dict[int, _Sums] = {}
        self.threshold: dict[int, float] = {}

    def new_generation(self) -> None:
        """Forget every row (request ids restart)."""
        self.recent.clear()
        self.samples.clear()
        self.sums.clear()
        self.threshold.clear()

    def thresholds(self, row_ids: list[int]) -> tuple[float, ...]:
        """Each row's tau, in row order."""
        get, base = self.threshold.get, self.base
        return tuple(get(r, base) for r in row_ids)

    def learn(self, event) -> None:
        """Slide each drafting row's windows by this step's verify and move its tau."""
        confidence, entropy = event.confidence, event.entropy
        for b, (rid, d, a) in enumerate(zip(event.row_ids, event.drafted, event.accepted)):
            if d == 0:
                continue
            win = self.recent.get(rid)
            if win is None:
                win = self.recent[rid] = deque(maxlen=self.window)
            win.append(a / d)
            p = confidence[b] if b < len(confidence) else None
            h = entropy[b] if b < len(entropy) else None
            sums = self.sums.get(rid)
            if p is not None or h is not None or sums is not None:
                if sums is None:
                    sums = self.sums[rid] = _Sums()
                    self.samples[rid] = deque()
                samples = self.samples[rid]
                if len(samples) == self.window:
                    sums.add(*samples.popleft(), -1)
                sample = (p, h, 1 if a >= 1 else 0)
                samples.append(sample)
                sums.add(*sample, 1)
                tau = sums.boundary()
                if tau is not None:
                    self.threshold[rid] = tau
                    continue
            rate = sum(win) / len(win)
            tau = self.threshold.get(rid, self.base)
            if rate > 0.8:
                tau = max(TAU_MIN, tau - TAU_STEP)
            elif rate < 0.5:
                tau = min(TAU_MAX, tau + TAU_STEP)
            self.threshold[rid] = tau
