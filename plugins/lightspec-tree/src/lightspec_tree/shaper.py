"""Choosing a tree's shape per step from what each shape measured (docs/design/tree.md).

A strategy offers a few shapes (e.g. a chain, a narrow tree and a wide tree); the shaper
tries each ``probe`` times, then takes the shape with the most tokens per unit of cost,
``(1 + mean accepted) / cost``, and gives every other shape one more try each ``every``
steps so that a shape that became worth it is found again.  The cost is the measured step
time (seconds, an exponentially weighted mean per shape), or, when every request is seeded
(``ctx.deterministic``: choices must not depend on timings), the timing-free model
``1 + verify_slope * nodes + draft_cost * drafted`` given by the strategy.

A strategy may pass the step's ``candidates`` instead: the shapes as they would run this
step (a node budget of k cuts every shape to at most k nodes and k levels, so two shapes
can be the same draft, and one shape drafts differently at k = 2 and at k = 8).  Each
candidate keeps its own records, so shapes are compared on the drafts they actually made.
"""

from __future__ import annotations

from typing import Callable, Hashable


class Shaper:
    """Per-shape measurements and the choice of the next step's shape."""

    def __init__(self, shapes: list[Hashable], probe: int = 2, every: int = 32, decay: float = 0.8):
        if not shapes:
            raise ValueError("a shaper needs at least one shape")
        self.shapes = list(shapes)
        self.probe, self.every, self.decay = probe, every, decay
        self.forget()

    def reset(self) -> None:
        """A new ``generate()``: what the shapes measured is about the machine and the drafter,
        not the request, so it is kept; only a pending step is dropped."""
        self.pending = None

    def forget(self) -> None:
        """Drop every measurement."""
        self.tries: dict[Hashable, int] = {}
        self.accepted: dict[Hashable, float] = {}  # EWMA of the mean accepted nodes per drafted row
        self.seconds: dict[Hashable, float] = {}  # EWMA of the step time
        self.last_used: dict[Hashable, int] = {}
        for s in self.shapes:
            self._add(s)
        self.steps = 0
        self.pending: Hashable | None = None

    def _add(self, shape: Hashable) -> None:
        if shape not in self.tries:
            self.tries[shape], self.accepted[shape], self.seconds[shape], self.last_used[shape] = 0, 0.0, 0.0, 0

    def score(self, shape: Hashable, cost: Callable[[Hashable], float] | None = None) -> float:
        """Expected tokens per unit of cost; ``cost`` (timing-free) replaces the measured time."""
        c = cost(shape) if cost is not None else self.seconds[shape]
        return (1.0 + self.accepted[shape]) / max(c, 1e-9)

    def choose(self, cost: Callable[[Hashable], float] | None = None,
               candidates: list[Hashable] | None = None) -> Hashable:
        """The shape for this step, among ``candidates`` (default: the shapes given at
        construction), recorded until its statistics arrive."""
        self.steps += 1
        shapes = self.shapes if candidates is None else list(dict.fromkeys(candidates))
        for s in shapes:
            self._add(s)
        if len(shapes) == 1:
            pick = shapes[0]
        else:
            untried = [s for s in shapes if self.tries[s] < self.probe]
            if untried:
                pick = untried[0]
            elif self.steps % self.every == 0:
                pick = min(shapes, key=lambda s: self.last_used[s])
            else:
                pick = max(shapes, key=lambda s: (self.score(s, cost), -shapes.index(s)))
        self.last_used[pick] = self.steps
        self.pending = pick
        return pick

    def observe(self, event) -> None:
        """A ``"step"`` event: credit the pending shape with its acceptance and time."""
        shape, self.pending = self.pending, None
        if shape is None or getattr(event, "failure", None):
            return
        rows = [a for a, d in zip(event.accepted, event.drafted) if d > 0]
        if not rows:
            return
        acc = sum(rows) / len(rows)
        first = self.tries[shape] == 0
        d = 0.0 if first else self.decay
        self.accepted[shape] = d * self.accepted[shape] + (1 - d) * acc
        self.seconds[shape] = d * self.seconds[shape] + (1 - d) * float(event.step_time_s)
        self.tries[shape] += 1

    def summary(self) -> dict:
        """What each shape measured (for reports and tests)."""
        return {str(s): {"tries": self.tries[s], "accepted": self.accepted[s], "step_s": self.seconds[s]}
                for s in self.tries}
