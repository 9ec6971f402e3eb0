"""``feedback``: a draft length steered by the measured speed-up of each step.

The controller::

    B_{t+1} = clamp(alpha * B_t + beta * r_t, 0, max_draft),    r_t = T_actual / T_target

* ``B_t``: draft tokens per row per step, a real number in [0, max_draft].  Step t drafts
  ``k = floor(B_t + 0.5)`` tokens per row (B rounded half up; 0 = plain decoding).
* ``T_target`` (seconds): what step t actually took, drafting and verify included
  (``StepStats.step_time_s``).
* ``T_actual`` (seconds): what plain decoding would have needed for the tokens step t
  emitted: the emitted tokens per row (mean over the step's rows) times the plain step
  latency at this batch size.  That latency is the median of the last 16 plain steps of
  this batch size (and greedy or sampled): the first time a batch size is seen the policy
  takes ``calibration`` plain steps to measure it, and after ``refresh`` speculative
  steps in a row it takes one plain step to keep it current.
* So ``r_t`` is the step's measured speed-up over plain decoding (> 1: speculation paid),
  dimensionless.  A plain step has r = 1 by definition (it is plain decoding).

Each batch size (and greedy or sampled) has its own loop: B, plain latency, hold.

Stability.  With r constant (open loop) B converges geometrically, by a factor alpha a
step, to the fixed point ``B* = beta * r / (1 - alpha)`` for any |alpha| < 1 (here alpha
is in [0, 1)); the defaults alpha = 0.5, beta = 1 give B* = 2r: 2 tokens at break-even
(r = 1), 4 at r = 2.  In closed loop r depends on the draft length, r = r(B), typically
rising while more drafts are accepted and falling once verify and drafting cost dominate.
A fixed point is where the line ``B (1 - alpha) / beta`` meets the curve r(B); linearised
there, a deviation evolves as ``dB_{t+1} = (alpha + beta r'(B*)) dB_t``, so the fixed
point is locally stable iff ``|alpha + beta r'(B*)| < 1``, i.e.
``-(1 + alpha) / beta < r'(B*) < (1 - alpha) / beta`` (with the defaults -1.5 < r' < 0.5):
crossings where r(B) cuts the line from above attract, crossings from below repel (B
runs off to the next crossing or a clamp).  Rounding B to k makes r piecewise constant
in B, so B can cycle between neighbouring k around a crossing.  The controller does not
maximise r: it settles where its line meets r(B), drafting more where speculation pays
more.  B = 0 is not absorbing: a plain step feeds r = 1, so B returns to beta, then
towards beta / (1 - alpha) (it probes).

When speculation never pays (r < 1 at every k), the loop still settles at about
``beta * r / (1 - alpha)`` > 0 and keeps drafting at a loss.  Hence the hold rule: an
EWMA of r over speculative steps (weight alpha on the old value) below ``min_ratio`` for
``patience`` speculative steps in a row holds plain decoding for ``hold`` steps; the
plain steps pull B back to beta / (1 - alpha), and the loop probes again after the hold
(with a fresh EWMA).  ``min_ratio=0`` turns the rule off.

Seeded requests (``ctx.deterministic``) must not depend on timing: every seeded step
drafts the fixed ``k = floor(beta / (1 - alpha) + 0.5)`` (clamped to max_draft), the
open-loop fixed point at break-even, and seeded steps do not feed the loop.

``Budget.reason``: ``"calibrating"``, ``"refresh"``, ``"hold"``, ``"feedback"`` (k from
B) or ``"seeded"``.  ``Budget.estimates``: ``B`` (the B_t rounded to this step's k),
``ratio`` (the last r), ``ratio_ewma`` and ``t_plain`` (seconds) where known.
Analysis and examples: ``docs/design/budget.md``, "The feedback policy".
"""

from __future__ import annotations

import math

from ..hookspecs import hookimpl
from ..interfaces import Budget, StepContext
from .tensors import TensorCache
from .windows import MedianWindow

PLAIN_WINDOW = 16  # plain steps whose median is the plain step latency


def _number(name: str, value, ok, allowed: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{name}={value!r} is invalid: use {allowed}")
    return float(value)


def _integer(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} is invalid: use an integer >= {low}")
    return value


class _Loop:
    """One batch size's controller state."""

    __slots__ = ("B", "plain", "spec_run", "ratio", "ewma", "low", "hold")

    def __init__(self, B: float):
        self.B = B
        self.plain = MedianWindow(PLAIN_WINDOW)  # plain step latencies (seconds)
        self.spec_run = 0  # speculative steps since the last plain step
        self.ratio: float | None = None  # the last speculative step's r
        self.ewma: float | None = None  # EWMA of r over speculative steps (None after a hold)
        self.low = 0  # speculative steps in a row with the EWMA below min_ratio
        self.hold = 0  # plain steps left to hold


class FeedbackBudget:
    """The feedback controller ``B_{t+1} = alpha B_t + beta T_actual / T_target`` (see the
    module docstring for definitions, units, clamps and stability)."""

    name = "feedback"

    def __init__(self, alpha: float = 0.5, beta: float = 1.0, max_draft: int = 8, min_ratio: float = 0.9,
                 patience: int = 8, hold: int = 32, calibration: int = 3, refresh: int = 32,
                 min_confidence: float = 0.0):
        self.alpha = _number("alpha", alpha, lambda v: 0 <= v < 1, "a number in [0, 1)")
        self.beta = _number("beta", beta, lambda v: v > 0, "a number > 0")
        self.max_draft = _integer("max_draft", max_draft, 1)
        self.min_ratio = _number("min_ratio", min_ratio, lambda v: v >= 0, "a number >= 0")
        self.patience = _integer("patience", patience, 1)
        self.hold = _integer("hold", hold, 0)
        self.calibration = _integer("calibration", calibration, 1)
        self.refresh = _integer("refresh", refresh, 1)
        self.min_confidence = _number("min_confidence", min_confidence, lambda v: 0 <= v < 1, "a number in [0, 1)")
        self.start = self._clamp(self.beta / (1.0 - self.alpha))  # B at break-even, where each loop starts
        self.seeded_k = self._round(self.start)
        self.loops: dict[tuple[int, bool], _Loop] = {}
        self.pending: tuple[tuple[int, bool], int] | None = None  # (loop key, k) of the step decided last
        self._tensors = TensorCache()

    def _clamp(self, B: float) -> float:
        return min(max(B, 0.0), float(self.max_draft))

    @staticmethod
    def _round(B: float) -> int:
        return int(math.floor(B + 0.5))

    def reset(self) -> None:
        """A new generation: the loops keep their state (the controller runs over the
        stream of steps); only an undelivered decision is dropped."""
        self.pending = None

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        rows = ctx.batch
        if ctx.deterministic:
            self.pending = None
            return self._budget(rows, ctx.device, self.seeded_k, "seeded", {"B": float(self.seeded_k)})
        key = (rows, ctx.sampling.greedy)
        loop = self.loops.get(key)
        if loop is None:
            loop = self.loops[key] = _Loop(self.start)
        k = 0
        if len(loop.plain) < self.calibration:
            reason = "calibrating"
        elif loop.spec_run >= self.refresh:
            reason = "refresh"
        elif loop.hold > 0:
            loop.hold -= 1
            reason = "hold"
        else:
            k, reason = self._round(loop.B), "feedback"
        self.pending = (key, k)
        estimates = {"B": loop.B}
        if loop.ratio is not None:
            estimates["ratio"] = loop.ratio
        if loop.ewma is not None:
            estimates["ratio_ewma"] = loop.ewma
        if loop.plain:
            estimates["t_plain"] = loop.plain.median()
        return self._budget(rows, ctx.device, k, reason, estimates)

    def _budget(self, rows: int, device, k: int, reason: str, estimates: dict[str, float]) -> Budget:
        get = self._tensors.get
        return Budget(get((k,) * rows, device), get((self.min_confidence,) * rows, device), reason=reason,
                      estimates=estimates)

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        pending, self.pending = self.pending, None
        if pending is None:
            return
        key, k = pending
        rows = len(event.row_ids)
        if rows != key[0] or event.step_time_s <= 0:
            return  # not the step this policy decided, or no usable timing
        loop = self.loops[key]
        if k == 0:  # plain decoding: it measures the plain latency, and r = 1
            loop.plain.append(event.step_time_s)
            loop.spec_run = 0
            loop.B = self._clamp(self.alpha * loop.B + self.beta)
            return
        loop.spec_run += 1
        r = sum(event.emitted) / rows * loop.plain.median() / event.step_time_s
        loop.ratio = r
        loop.B = self._clamp(self.alpha * loop.B + self.beta * r)
        loop.ewma = r if loop.ewma is None else self.alpha * loop.ewma + (1.0 - self.alpha) * r
        if loop.ewma < self.min_ratio:
            loop.low += 1
            if loop.low >= self.patience:
                loop.hold, loop.low, loop.ewma = self.hold, 0, None
        else:
            loop.low = 0
