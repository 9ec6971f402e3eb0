"""The confidence gate: each row's ``min_confidence`` (``Budget.min_confidence``).

Model drafters stop a row's draft when the peak probability of their next token falls
below the row's threshold tau.  The gate moves tau per row over a sliding window of the
row's last ``window`` verifies (steps where the row drafted): the mean fraction of the
draft accepted (a / d) moves tau by 0.05 a verify, down (draft deeper) when above 0.8,
not below 0.05; up when below 0.5, not above 0.9.  A row starts at ``base``.
"""

from __future__ import annotations

from collections import deque

TAU_MIN, TAU_MAX, TAU_STEP = 0.05, 0.9, 0.05


class ConfidenceGate:
    """Per-row confidence thresholds over a window of ``window`` verifies, from ``base``."""

    def __init__(self, window: int, base: float):
        self.window = window
        self.base = base
        self.recent: dict[int, deque[float]] = {}  # request -> a / d of its last verifies
        self.threshold: dict[int, float] = {}

    def new_generation(self) -> None:
        """Forget every row (request ids restart)."""
        self.recent.clear()
        self.threshold.clear()

    def thresholds(self, row_ids: list[int]) -> tuple[float, ...]:
        """Each row's tau, in row order."""
        get, base = self.threshold.get, self.base
        return tuple(get(r, base) for r in row_ids)

    def learn(self, event) -> None:
        """Slide each drafting row's window by this step's verify and move its tau."""
        for rid, d, a in zip(event.row_ids, event.drafted, event.accepted):
            if d == 0:
                continue
            win = self.recent.get(rid)
            if win is None:
                win = self.recent[rid] = deque(maxlen=self.window)
            win.append(a / d)
            rate = sum(win) / len(win)
            tau = self.threshold.get(rid, self.base)
            if rate > 0.8:
                tau = max(TAU_MIN, tau - TAU_STEP)
            elif rate < 0.5:
                tau = min(TAU_MAX, tau + TAU_STEP)
            self.threshold[rid] = tau
