"""Sliding windows of timings with medians kept between appends.

A policy reads these medians on every decode step (at batch 1 a step is ~2 ms), so each
window caches what it computed until a new sample changes it.
"""

from __future__ import annotations

from collections import deque
from statistics import median


class MedianWindow:
    """The last ``size`` values, with their median cached until the next one arrives."""

    def __init__(self, size: int):
        self.values: deque[float] = deque(maxlen=size)
        self._median: float | None = None

    def append(self, value: float) -> None:
        self.values.append(value)
        self._median = None

    def median(self) -> float:
        """The median of the window; the window must not be empty."""
        if self._median is None:
            self._median = median(self.values)
        return self._median

    def __len__(self) -> int:
        return len(self.values)


class ForwardWindow:
    """The last ``size`` target forwards of one cost key as (verify width q, seconds),
    grouped by width incrementally as samples arrive and leave, each width's median cached
    until its group changes (an append changes at most two groups)."""

    def __init__(self, size: int):
        self.size = size
        self.samples: deque[tuple[int, float]] = deque()
        self.by_q: dict[int, list[float]] = {}
        self._medians: dict[int, float] = {}

    def append(self, q: int, seconds: float) -> None:
        if len(self.samples) == self.size:
            q0, t0 = self.samples.popleft()
            group = self.by_q[q0]
            group.remove(t0)
            if not group:
                del self.by_q[q0]
            self._medians.pop(q0, None)
        self.samples.append((q, seconds))
        self.by_q.setdefault(q, []).append(seconds)
        self._medians.pop(q, None)

    def medians(self) -> list[tuple[int, float, int]]:
        """(q, median seconds, count) for every width in the window, in first-seen order."""
        out = []
        for q, group in self.by_q.items():
            m = self._medians.get(q)
            if m is None:
                m = self._medians[q] = median(group)
            out.append((q, m, len(group)))
        return out

    def __len__(self) -> int:
        return len(self.samples)
