"""The throughput guard: checks the cost model's decisions against measured time.

* Per window of ``GUARD_WINDOW`` speculative steps it compares the wall time spent with
  the time plain decoding would have needed for the same tokens (``plain_reference`` per
  token per row).  Speculation that lost holds plain decoding for ``hold`` steps (from
  ``GUARD_HOLD``, doubling on each repeated loss up to ``GUARD_MAX_HOLD``, or
  ``BATCH_MAX_HOLD`` for batches; back to ``GUARD_HOLD`` after a win), then probes.
* It remembers per kind of batch (several rows?, greedy?) how its checks went
  (``record``: a decayed mean of spent / plain-equivalent time, across generations): a
  new generation of a kind that was losing starts held.  Batches also carry their hold
  and back-off into the next generation of their kind (``carried``).
* A single row whose strategy mixes model-free drafters (n-gram lookup) with model drafters
  has a second guard, over the model drafters alone: its steps where a model drafter
  drafted fill their own window, judged the same way; a loss holds only the model drafters
  (``model_hold`` steps, from ``GUARD_HOLD`` doubling up to ``MODEL_MAX_HOLD``) while the free
  ones go on, and that hold and back-off carry into the next generation of the same kind.
  The strategy's own window then holds only the steps where nothing but free drafters
  drafted.
* The same windows calibrate the cost model for batches: measured / modelled time of
  speculative steps (``cost_scale``, in [1, ``MAX_SCALE``]) scales the modelled cost of
  drafting; it decays back towards 1 while nothing drafts.
* The generation check: when a batch's generation ends, its whole time against plain
  decoding of the same tokens at the full batch's plain step multiplies the modelled gain
  that kind of batch needs before it drafts (``margin``, in [batch_margin, ``MAX_MARGIN``]).

Why (and the measurements behind each constant): ``docs/design/budget.md``, "Guard".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

from .costs import CostModel

GUARD_WINDOW = 12  # speculative steps per throughput check
GUARD_HOLD = 16  # plain steps after a check that speculation lost
GUARD_MAX_HOLD = 128
BATCH_MAX_HOLD = 512  # a batch's hold and back-off carry across generations
MODEL_MAX_HOLD = 512  # a held model drafter costs the free drafters nothing, and carries across generations
GUARD_MEMORY = 0.5  # weight of the newest window in the per-kind record of checks
SCALE_DECAY = 0.95  # per plain step: an unmeasured cost scale drifts back towards 1
MAX_MARGIN = 2.0  # the most modelled gain a batch can be asked for before it drafts
MAX_SCALE = 1.5  # the scale is for what the model misses; a slow period is the hold's job
PLAIN_RATIO_PRIOR = 1.03  # plain step time / its forward time, before one is measured

Kind = tuple[bool, bool]  # (several rows?, greedy?)


@dataclass
class Generation:
    """One ``generate`` call's totals, for the end-of-generation check."""

    rows: int  # rows at its first step
    kind: Kind | None
    deterministic: bool  # every request seeded
    tokens: int = 0  # emitted over all steps and rows
    seconds: float = 0.0  # wall time of all its steps
    spec_steps: int = 0


class ThroughputGuard:
    """The guard over ``cost`` (whose ``t1``, fits and modelled costs it reads).
    ``enabled=False`` leaves the hold at 0 and learns no record, scale or margin."""

    def __init__(self, cost: CostModel, enabled: bool, batch_margin: float):
        self.cost = cost
        self.enabled = enabled
        self.batch_margin = float(batch_margin)
        self.kind: Kind | None = None  # the current generation's kind, set on its first decision
        # recent speculative steps: (tokens per row, wall seconds, modelled cost, plain reference)
        self.spec_window: deque[tuple[float, float, float, float]] = deque(maxlen=GUARD_WINDOW)
        self.plain_ratio: deque[float] = deque([PLAIN_RATIO_PRIOR], maxlen=16)  # plain step / forward time
        self.hold = 0  # steps of plain decoding left before probing again
        self.backoff = GUARD_HOLD
        self.record: dict[Kind, float] = {}
        self.carried: dict[Kind, tuple[int, int]] = {}  # per kind: (hold left, back-off) at its last generation's end
        self.cost_scale: dict[Kind, float] = {}
        self.margin: dict[Kind, float] = {}
        # this generation's plain steps' wall times per cost key
        self.plain_times: dict[tuple[int, bool], deque[float]] = {}
        self.gen: Generation | None = None
        # the model drafters' own guard (a single row whose strategy also has free drafters)
        self.mixed = False  # set by the policy at each decision
        self.model_window: deque[tuple[float, float, float, float]] = deque(maxlen=GUARD_WINDOW)
        self.model_hold = 0
        self.model_backoff = GUARD_HOLD
        self.model_carried: dict[Kind, tuple[int, int]] = {}

    def start_generation(self, kind: Kind) -> None:
        """A new generation's first decision: start held where this kind has been losing."""
        self.kind = kind
        if self.enabled and kind in self.carried:
            self.hold, self.backoff = self.carried[kind]
        if self.enabled and kind in self.model_carried:
            self.model_hold, self.model_backoff = self.model_carried[kind]
        if self.enabled and self.record.get(kind, 0.0) > 1.0:
            self.hold = max(self.hold, GUARD_HOLD)

    def reset(self) -> None:
        """The generation ended: judge it, carry a batch's hold, start the next one clean."""
        self.end_generation()
        self.plain_times.clear()
        if self.kind is not None and self.kind[0]:
            self.carried[self.kind] = (self.hold, self.backoff)
        if self.kind is not None:
            self.model_carried[self.kind] = (self.model_hold, self.model_backoff)
        self.spec_window.clear()
        self.hold = 0
        self.backoff = GUARD_HOLD
        self.model_hold = 0
        self.model_backoff = GUARD_HOLD

    def scale(self) -> float:
        """The current kind's cost scale (1 where unmeasured)."""
        return self.cost_scale.get(self.kind, 1.0)

    def current_margin(self) -> float:
        """The modelled gain the current kind of batch needs before it drafts."""
        return self.margin.get(self.kind, self.batch_margin)

    def plain_reference(self, rows: int) -> float:
        """What a plain step of ``rows`` rows costs here, in seconds: the mean of this
        generation's plain steps of that many rows once there are 3, else the cost model's
        (that key's ``t1`` times the plain steps' step/forward ratio).  A mean, not a
        median: it is compared with sums of step times, which are skewed."""
        key = self.cost.key(rows)
        samples = self.plain_times.get(key)
        if samples is not None and len(samples) >= 3:
            return sum(samples) / len(samples)
        return self.cost.fits.get(key, (self.cost.t1,))[0] * median(self.plain_ratio)

    def track(self, event, deterministic: bool) -> None:
        """Record plain steps' times per number of rows, and the generation's totals."""
        rows = len(event.row_ids)
        if not rows:
            return
        greedy = True if self.kind is None else self.kind[1]
        if event.drafted_max == 0:
            times = self.plain_times.get((rows, greedy))
            if times is None:
                times = self.plain_times[(rows, greedy)] = deque(maxlen=32)
            times.append(event.step_time_s)
        if self.gen is None:
            self.gen = Generation(rows, self.kind, deterministic)
        self.gen.tokens += sum(event.emitted)
        self.gen.seconds += event.step_time_s
        self.gen.spec_steps += event.drafted_max > 0

    def check(self, event) -> None:
        """Add a step to the window; a full window of speculative steps is judged: slower
        than plain decoding holds plain decoding, and (batches) updates the cost scale.
        One row is not scaled: there the model holds."""
        rows = len(event.row_ids)
        t1 = self.cost.t1
        if not (self.enabled and rows) or t1 is None:
            return
        if event.drafted_max == 0:
            if event.target_forward_s > 0:
                self.plain_ratio.append(event.step_time_s / event.target_forward_s)
            if self.kind in self.cost_scale:
                self.cost_scale[self.kind] = 1.0 + (self.cost_scale[self.kind] - 1.0) * SCALE_DECAY
            return
        # one row keeps the model's reference: its plain steps are rare while it speculates
        ref = self.plain_reference(rows) if rows > 1 else t1 * median(self.plain_ratio)
        sample = (sum(event.emitted) / rows, event.step_time_s, self.cost.modelled_cost(event), ref)
        if rows == 1 and self.mixed and any(n > 0 for _, n in event.draft_by_source.values()):
            self._check_model(sample)
            return
        self.spec_window.append(sample)
        if len(self.spec_window) < GUARD_WINDOW:
            return
        plain_step = t1 * median(self.plain_ratio)  # the cost model's plain step
        spent = sum(t for _, t, _, _ in self.spec_window)
        plain = sum(n * ref for n, _, _, ref in self.spec_window)
        modelled = sum(c for _, _, c, _ in self.spec_window) * plain_step
        self.spec_window.clear()
        kind = self.kind
        if kind is not None:
            old = self.record.get(kind, spent / plain)
            self.record[kind] = (1 - GUARD_MEMORY) * old + GUARD_MEMORY * spent / plain
        if kind is not None and kind[0]:
            old = self.cost_scale.get(kind, 1.0)
            self.cost_scale[kind] = min(MAX_SCALE, max(1.0, (1 - GUARD_MEMORY) * old + GUARD_MEMORY * spent / modelled))
        if spent > plain:
            self.hold = self.backoff
            self.backoff = min(2 * self.backoff, BATCH_MAX_HOLD if kind and kind[0] else GUARD_MAX_HOLD)
        else:
            self.backoff = GUARD_HOLD

    def _check_model(self, sample: tuple[float, float, float, float]) -> None:
        """A single row's step where a model drafter drafted, next to free drafters: a full
        window that took longer than plain decoding of its tokens holds the model drafters."""
        self.model_window.append(sample)
        if len(self.model_window) < GUARD_WINDOW:
            return
        spent = sum(t for _, t, _, _ in self.model_window)
        plain = sum(n * ref for n, _, _, ref in self.model_window)
        self.model_window.clear()
        if spent > plain:
            self.model_hold = self.model_backoff
            self.model_backoff = min(2 * self.model_backoff, MODEL_MAX_HOLD)
        else:
            self.model_backoff = GUARD_HOLD

    def end_generation(self) -> None:
        """Judge the generation that just ended, if it was a batch that speculated: its
        steps' total time against plain decoding of the same tokens (each of its first
        step's rows one token per full-batch plain step).  A loss raises that kind's
        ``margin`` by the measured ratio (up to ``MAX_MARGIN``), a win lowers it (not below
        ``batch_margin``); a generation that did not speculate lets it drift back by a
        quarter of its excess.  Single rows and seeded generations are not judged."""
        gen, self.gen = self.gen, None
        if gen is None or not self.enabled:
            return
        if gen.rows < 2 or gen.kind is None or gen.deterministic or self.cost.t1 is None:
            return
        m = self.margin.get(gen.kind, self.batch_margin)
        if gen.spec_steps == 0:
            self.margin[gen.kind] = self.batch_margin + 0.75 * (m - self.batch_margin)
            return
        plain = gen.tokens / gen.rows * self.plain_reference(gen.rows)
        ratio = gen.seconds / plain if plain > 0 else 1.0
        self.margin[gen.kind] = min(MAX_MARGIN, max(self.batch_margin, m * ratio))
