"""Budget policies: how many tokens to draft per row and step.

``dynamic`` (the default) is training-free and cost-aware.  Per row it keeps decayed
counts of accepted draft tokens and of rejections, which estimate the per-token
acceptance probability a (a geometric model: a verify of k drafts yields
1 + a + ... + a^k tokens).  It learns online, from the step statistics, what a verify
over q tokens costs relative to a plain step (``1 + beta * (q - 1)``) and what a draft of
k tokens costs (``f + d * k``: a model drafter's first forward also catches its cache up
with the tokens accepted since its last draft, so one token costs more than each next
one), and picks the draft length that maximises tokens per unit of time.
k = 0 means plain decoding: speculation backs off where it does not pay.

A row's expected gain also counts how often it gets a draft at all when offered one (an
n-gram lookup finds no match on many rows of some workloads; such a row gains nothing
from a wider verify).  A new row has no record of its own, so its estimate starts from the acceptance pooled
over all rows of the last ~50 steps (overall, and per drafter for the per-source caps),
not from a fixed guess; seeded sampling keeps the fixed prior so that its output does not
depend on earlier requests.

Two rules keep that choice sound on a noisy machine (on the 2-core VM a forward's time
moves by 2x between identical calls):

* costs come from medians over a window of recent steps: the verify cost is a line
  through the median plain forward and the median forward time of each verify width
  seen in the last 32 steps, kept per batch size (and greedy or sampled), a drafter's
  cost a line through the median time of each draft length in its last 16
  measurements; one slow step does not switch speculation off.  A batch size seen for
  the first time is calibrated by ``BATCH_CALIBRATION`` plain steps (one for a single row);
  its first speculative step drafts one token, which measures its verify cost (until then
  it borrows the nearest batch size's), and a batch that speculated ``PLAIN_REFRESH``
  steps in a row takes one plain step to renew the plain forward its costs are measured
  against;
* an estimate that is not being measured drifts back: an unused drafter's cost towards
  the cheapest line measured for it (its prior until 8 measurements exist) by one
  sample per step, beta towards its prior by 10% per step once only plain steps remain
  in the window.  A policy that backed off because of acceptance or a slow period
  therefore probes again (after 9 to about 40 plain steps) instead of staying off for
  good, while a drafter that is simply too expensive for its acceptance (the cost of a
  draft token is a property of the drafter) is not probed again and again.  A batch's
  beta does not drift: at batch 8 a verified token costs 0.3-0.8 of a plain step on the
  zoo target, and drifting to the batch-1 prior (0.12) had `hybrid` probe at a loss in
  every generation.

In a batch every row pays for the widest verify, so the batch shares one draft length:
the k that maximises the batch's expected tokens per unit of time.  A batch that chose
k = 0 decides again only after ``RECHECK`` more plain steps, doubling up to
``MAX_RECHECK`` while it keeps choosing 0 (its estimates move little in a step, and the
decision cost ~1% of a batch-8 step); its plain steps' forward times are fitted when a
decision reads them, not on every step.

The model above can be wrong in ways it cannot see (at batch 8 a verify's extra width
costs more than at batch 1, rows without an n-gram match gain nothing, padding and
drafting overheads), so a *throughput guard* checks the outcome: over each window of 12
speculative steps it compares the wall time spent with the time plain decoding would
have needed for the same tokens (``t1`` times the measured step/forward ratio of plain
steps).  If speculation was slower, the policy decodes plainly for a hold period (16
steps, doubling on each repeated loss up to 128, back to 16 after a win), then probes
again.  Each generation (``reset``) starts with a clean guard, except that the guard
remembers, per kind of batch (one row or several; greedy or sampled), how its recent
checks went (an average of spent / plain-equivalent time over the last few windows,
across generations): when speculation was losing on that kind of batch, a new
generation of the same kind starts with a 16-step hold, then probes.  At batch 8 a
generation is only ~60 steps, and re-learning the loss in each one cost 5-15%.  Batches
(several rows) also carry the hold and its back-off from one generation into the next
(up to 512 steps), so where speculation keeps losing a batch probes about once in eight
generations rather than in every one.

A batch's guard measures "plain decoding" where it can: the mean of the generation's
plain steps with as many rows (once there are 3), else the model's ``t1`` (one row keeps
``t1``).  The model's ``t1`` is the intercept of a line through verify widths; while a
batch speculates few plain steps are in its window, and at batch 8 it read 14 ms where
plain steps took 20 ms.

The guard's windows also calibrate the cost model for batches: a batch's speculative
steps measured 5-25% slower than modelled (padding, rows that finish early), so per kind
of batch the measured / modelled time (``cost_scale``, 1 to 1.5) scales the modelled cost
of drafting.

A batch drafts only for a modelled gain of at least its kind's ``margin``, learned from
whole generations.  Rows that speculate finish at different steps and the last ones run in
small batches that cost nearly a full step each (at batch 8 on `code` the steps with fewer
than 8 rows took 4.2 s for tokens that full-batch plain steps make in 3.3 s, ~6% of the
run), which no per-step check sees.  So when a batch's generation ends (at the next
``reset``) the time of all its steps is compared with plain decoding of the same tokens at
the full batch's plain step, and the measured ratio multiplies the margin (from
``batch_margin``, 1.15, up to 2; a generation that did not speculate lets it drift back
by a quarter of its excess).

Model drafters time themselves (``StepTimer.record``), so each drafter of a cascade is
priced from its own forwards; before, a step in which some rows drafted by n-gram lookup
and others by the draft model measured nothing, and at batch 8 the draft model kept its
structural estimate (0.16 of a target step per token) where it measured 0.26.

A batch also charges a model drafter that did not draft on the last step for its
catch-up (the prefill of every token its cache missed meanwhile, reported as the drafter's
``setup_s``; ~10 ms for the zoo draft at batch 8, 2-3 plain steps), learned per drafter
and spread over ``SETUP_HORIZON`` speculative steps.

For a single row that speculates, model-free drafters (n-gram lookup, which declares a
draft cost of 0) may draft up to ``free_max_draft`` tokens instead of k
(``Budget.free_max_draft``): k is the row's average, the lookup knows how long its
current match is, and it cuts its own drafts.  A model drafter in the same cascade still
extends only up to k.

The draft-confidence rule runs inside model drafters: a row's draft stops when the
drafter's peak probability falls below ``min_confidence``.  The policy adapts that
threshold per row over a sliding window of recent verifies: high recent acceptance
lowers it (draft deeper), low acceptance raises it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

import torch

from .hookspecs import hookimpl
from .interfaces import Budget, RowHistory, StepContext

POOL_DECAY = 0.98  # per step: the pooled acceptance reflects the last ~50 steps
GUARD_WINDOW = 12  # speculative steps per throughput check
GUARD_HOLD = 16  # plain steps after a check that speculation lost
GUARD_MAX_HOLD = 128
BATCH_MAX_HOLD = 512  # a batch's hold and back-off carry across generations (see ``reset``)
GUARD_MEMORY = 0.5  # weight of the newest window in the per-kind record of guard checks
SCALE_DECAY = 0.95  # per plain step: an unmeasured cost scale drifts back towards 1
MAX_MARGIN = 2.0  # the most modelled gain a batch can be asked for before it drafts
MAX_SCALE = 1.5  # the scale is for what the model misses; a slow period is the guard's hold's job
# a batch that chose plain decoding decides again only after this many more plain steps:
# its inputs (decayed acceptance, drifting costs) move little in a step, and deciding cost
# ~70 us of a ~6 ms batch-8 step (1.2%, in every step of a batch that has backed off)
RECHECK = 2
# ... and each time it chooses plain decoding again, the interval doubles, up to this many
# steps (a batch that backed off at batch 8 on the zoo target re-decided on every third
# step, ~20 us a step on average, 0.6% of a 3.5 ms step, for the same answer)
MAX_RECHECK = 8
# a batch size seen for the first time is calibrated by this many plain steps (their median
# is the plain forward a draft has to beat): one alone was the batch size's first forward
# in the process, and at batch 8 its cold-start time (~1.5x a plain step) made the one-token
# probe's verify look free (beta ~0), after which `hybrid` drafted 8 tokens on every step,
# never measured a plain step again and ran at 0.75x `none` (run U, `code`)
BATCH_CALIBRATION = 3
# ... and a batch that has speculated on this many steps in a row since its last plain
# forward takes one plain step, so that its anchor stays current (1 step in 33 at most)
PLAIN_REFRESH = 32
# a batch charges a model drafter's catch-up (the prefill of every token its cache missed
# since it last drafted: ~10 ms for the zoo draft at batch 8 after a pause, 2-3 plain steps)
# as a fixed cost spread over this many speculative steps, when it did not draft last step
SETUP_HORIZON = 8


def _timed_drafters(event) -> dict[str, tuple[float, int]]:
    """The model drafters that timed themselves this step and drafted: {name: (seconds, tokens)}."""
    return {src: v for src, v in event.draft_by_source.items() if v[1] > 0}


class _MedianWindow:
    """The last ``size`` values, with their median kept until the next one arrives (a batch-1
    policy reads it on every step)."""

    def __init__(self, size: int):
        self.values: deque[float] = deque(maxlen=size)
        self._median: float | None = None

    def append(self, value: float) -> None:
        self.values.append(value)
        self._median = None

    def median(self) -> float:
        if self._median is None:
            self._median = median(self.values)
        return self._median

    def __len__(self) -> int:
        return len(self.values)


class _ForwardWindow:
    """The last ``size`` target forwards of one cost key as (verify width q, seconds), kept
    grouped by width as they arrive and leave, with each width's median cached until its
    group changes: a step changes at most two groups, and the fit reads every group's
    median on every step at batch 1 (rebuilding the groups and all medians from the window
    took about half of the budget's per-step statistics)."""

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


@dataclass
class _Generation:
    """One ``generate`` call's totals, for the budget's end-of-generation check."""

    rows: int  # rows at its first step
    kind: tuple[bool, bool] | None  # (several rows?, greedy?)
    deterministic: bool  # every request seeded
    tokens: int = 0  # emitted over all steps and rows
    seconds: float = 0.0  # wall time of all its steps
    spec_steps: int = 0


class StaticBudget:
    """Always draft ``k`` tokens per row (the comparison baseline)."""

    name = "static"

    def __init__(self, k: int = 4):
        if not (isinstance(k, int) and k >= 0):
            raise ValueError(f"k={k!r} is invalid: use an integer >= 0")
        self.k = k

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        B = ctx.batch
        return Budget(
            max_draft=torch.full((B,), self.k, dtype=torch.long, device=ctx.device),
            min_confidence=torch.zeros(B, device=ctx.device),
        )


class DynamicBudget:
    """Cost-aware draft length from online acceptance, plus an adaptive confidence stop."""

    name = "dynamic"

    def __init__(
        self,
        max_draft: int = 8,
        window: int = 16,
        min_confidence: float = 0.3,
        beta: float = 0.12,
        draft_cost: float = 0.05,
        decay: float = 0.9,
        guard: bool = True,
        batch_margin: float = 1.15,
        free_max_draft: int = 16,
    ):
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"window={window!r} is invalid: use an integer >= 1")
        if not (isinstance(min_confidence, (int, float)) and 0 <= min_confidence < 1):
            raise ValueError(f"min_confidence={min_confidence!r} is invalid: use a number in [0, 1)")
        if not (isinstance(beta, (int, float)) and beta >= 0):
            raise ValueError(f"beta={beta!r} is invalid: use a number >= 0")
        if not (isinstance(draft_cost, (int, float)) and draft_cost >= 0):
            raise ValueError(f"draft_cost={draft_cost!r} is invalid: use a number >= 0")
        if not (isinstance(decay, (int, float)) and 0 < decay < 1):
            raise ValueError(f"decay={decay!r} is invalid: use a number in (0, 1)")
        if not isinstance(guard, bool):
            raise ValueError(f"guard={guard!r} is invalid: use true or false")
        if not (isinstance(batch_margin, (int, float)) and not isinstance(batch_margin, bool) and batch_margin >= 1):
            raise ValueError(f"batch_margin={batch_margin!r} is invalid: use a number >= 1")
        if not (isinstance(free_max_draft, int) and not isinstance(free_max_draft, bool) and free_max_draft >= 0):
            raise ValueError(f"free_max_draft={free_max_draft!r} is invalid: use an integer >= 0")
        self.guard = guard
        self.max_draft = max_draft
        self.free_max_draft = free_max_draft
        self.window = window
        self.base_confidence = min_confidence
        self.prior_beta = beta
        self.prior_draft_cost = draft_cost
        self.decay = decay
        # cost windows, per cost key (rows, greedy?): (verify tokens, seconds) of recent target
        # forwards and, kept apart, recent plain forwards' seconds (see ``_fit_forward_cost``);
        # the fit per key, and the beta last fitted from verifies per key.  ``t1`` and ``beta``
        # are the fit of the batch being decided or measured (``_use_fit``)
        self.forward_samples: dict[tuple[int, bool], _ForwardWindow] = {}
        self.plain_forwards: dict[tuple[int, bool], _MedianWindow] = {}
        self.fits: dict[tuple[int, bool], tuple[float, float]] = {}
        self.verified_beta: dict[tuple[int, bool], float] = {}
        self.unfitted: set[tuple[int, bool]] = set()  # keys whose window changed since their fit
        self.plain_age: dict[tuple[int, bool], int] = {}  # steps since the key's last plain forward
        self.draft_samples: dict[str, deque[tuple[int, float]]] = {}  # (tokens drafted, cost relative to t1)
        self.t1: float | None = None
        self.beta = beta
        self.draft_cost: dict[str, float] = {}  # per source: d, the cost of each draft token
        self.draft_fixed: dict[str, float] = {}  # per source: f, the cost of drafting at all
        self.draft_floor: dict[str, tuple[float, float]] = {}  # per source: the cheapest (f, d) fitted (after 8 measurements)
        self.last_drafted: dict[str, int] = {}
        self.settled: dict[str, tuple[int, float]] = {}  # per source: the drift sample its whole window holds
        # per source: a batch's catch-up cost when it resumes drafting (decayed mean, relative
        # to t1), and whether it drafted on the last step (then there is nothing to catch up)
        self.setup_cost: dict[str, float] = {}
        self.drafted_last: set[str] = set()
        self.hints: dict[str, float] = {}  # the drafters' structural cost estimates (draft_cost_hints)
        self.measured: dict[str, int] = {}
        self.per_source: dict[tuple[int, str], list[float]] = {}  # (request, source) -> [accepted, rejected]
        self.recent: dict[int, deque] = {}
        self.threshold: dict[int, float] = {}
        self.warm: set[str] = set()
        # throughput guard: recent speculative steps as (tokens per row, wall seconds)
        self.spec_window: deque[tuple[float, float]] = deque(maxlen=GUARD_WINDOW)
        self.plain_ratio: deque[float] = deque([1.03], maxlen=16)  # plain step time / its forward time
        self.hold = 0  # steps of plain decoding left before probing again
        self.recheck = 0  # plain steps left before a batch decides again (RECHECK)
        self.recheck_rows = 0  # ... of that many rows
        self.recheck_every = RECHECK  # the interval, doubling while the batch keeps choosing k = 0
        self.backoff = GUARD_HOLD
        # per kind of batch (several rows?, greedy?): decayed mean of spent / plain-equivalent
        # time over recent guard windows, kept across generations
        self.guard_record: dict[tuple[bool, bool], float] = {}
        # per kind of batch: (hold left, back-off) when its last generation ended
        self.carried: dict[tuple[bool, bool], tuple[int, int]] = {}
        self.kind: tuple[bool, bool] | None = None  # the current generation's kind, set on its first step
        # per kind of batch: measured / modelled time of speculative steps (>= 1), from the
        # guard's windows; it scales the modelled cost of drafting (see ``_guard``)
        self.cost_scale: dict[tuple[bool, bool], float] = {}
        self.batch_margin = float(batch_margin)
        # per kind of batch: the modelled gain a batch needs before it drafts, learned from
        # whole generations (see ``_end_generation``); starts at batch_margin
        self.margin: dict[tuple[bool, bool], float] = {}
        # this generation's plain steps' wall times per (rows, greedy): the batch guard's and
        # the generation check's reference for "what plain decoding costs here"
        self.plain_times: dict[tuple[int, bool], deque[float]] = {}
        self.gen: _Generation | None = None  # the generation in progress
        self.deterministic = False  # the current generation's requests are all seeded
        self.fresh = True
        # acceptance over all rows of recent steps (decayed), overall ("") and per source: the
        # prior a new row starts from, so a fresh batch does not draft on a fixed guess
        self.pooled: dict[str, list[float]] = {}
        # draft availability: of the steps where a row was offered k > 0, in how many did it
        # get a draft at all (n-gram lookup finds no match on most rows of some workloads)
        self.hits: dict[int, list[float]] = {}  # request -> [steps with a draft, steps offered]
        self.pooled_hits = [0.0, 0.0]
        self.last_k = 0
        # engine overhead (outside model forwards) per step, relative to t1: a speculative
        # step does more bookkeeping than a plain one (per-row acceptance, cache rollback),
        # which at batch 8 is several percent of a step
        self.overhead: dict[bool, deque[float]] = {False: deque(maxlen=16), True: deque(maxlen=16)}
        self._spec_overhead: float | None = 0.0  # None: recompute (``spec_overhead``)
        self.first_spec = True  # no speculative step yet in this generation
        self._tensors: dict[tuple, torch.Tensor] = {}  # _tensor's cache
        self._plain_budgets: dict[tuple, Budget] = {}  # _plain's

    def reset(self) -> None:
        self._end_generation()
        self.plain_times.clear()
        self.warm.clear()
        self.per_source.clear()
        self.recent.clear()
        self.threshold.clear()
        # one row: the guard judges each generation afresh (what lost on one request may pay on
        # the next).  A batch carries its hold and back-off into the next batch of its kind: a
        # batch generation is only ~60 steps, and when every new one probed again, 12 losing
        # steps per generation cost `hybrid` ~4% at batch 8 (lockstep, 0.956x `none`)
        if self.kind is not None and self.kind[0]:
            self.carried[self.kind] = (self.hold, self.backoff)
        self.spec_window.clear()
        self.hold = 0
        self.recheck = self.recheck_rows = 0
        self.recheck_every = RECHECK
        self.backoff = GUARD_HOLD
        self.fresh = True
        self.hits.clear()
        self.last_k = 0
        self.first_spec = True

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        B = ctx.batch
        self.deterministic = ctx.deterministic
        if ctx.deterministic:
            return self._reproducible(ctx, self._thresholds(ctx))
        self.last_k = 0
        if self.fresh:  # a new generation: start held where this kind of batch has been losing
            self.fresh = False
            self.kind = (B > 1, ctx.sampling.greedy)
            if self.guard and self.kind in self.carried:
                self.hold, self.backoff = self.carried[self.kind]
            if self.guard and self.guard_record.get(self.kind, 0.0) > 1.0:
                self.hold = max(self.hold, GUARD_HOLD)
        key = self._cost_key(B)
        plain = self.plain_forwards.get(key)
        if plain is None or (B > 1 and len(plain) < BATCH_CALIBRATION):
            # calibrate: plain steps measure what a target forward over this many rows costs
            return self._plain(B, ctx.device)
        if B > 1 and self.plain_age.get(key, 0) >= PLAIN_REFRESH:
            # a batch that speculated on every step for a while: one plain step renews its anchor
            return self._plain(B, ctx.device)
        if self.hold > 0:  # the guard saw speculation lose: decode plainly for a while
            self.hold -= 1
            return self._plain(B, ctx.device)
        if self.recheck > 0 and self.recheck_rows == B:  # this batch chose plain decoding a step or two ago (RECHECK)
            self.recheck -= 1
            return self._plain(B, ctx.device)
        self._use_fit(key)
        pooled = self.pooled_acceptance("")
        accs = [h.acceptance(prior=pooled) for h in ctx.history]
        pooled_hit = self.pooled_hit_rate()
        hits = [self.hit_rate(rid, pooled_hit) for rid in ctx.row_ids]
        # the cheapest drafter (by the cost of a one-token draft) decides whether to draft at all
        cheapest = min(self.draft_cost, key=lambda s: self.draft_fixed.get(s, 0.0) + self.draft_cost[s], default=None)
        # a batch prices a drafter it has not measured by its structural estimate (prior_cost)
        self.hints = (ctx.draft_cost_hints or {}) if B > 1 else {}
        d = min(self.hints.values(), default=self.prior_draft_cost) if cheapest is None else self.draft_cost[cheapest]
        f = 0.0 if cheapest is None else self.draft_fixed.get(cheapest, 0.0) + self._catch_up(cheapest, B)
        scale = self.cost_scale.get(self.kind, 1.0)
        margin = self.margin.get(self.kind, self.batch_margin) if B > 1 else None
        k = self.best_k(accs, d, fixed=self.spec_overhead + f, hits=hits, scale=scale, margin=margin)
        if k > 1 and B > 1 and key not in self.verified_beta:
            # a batch size whose verify was never measured: its beta is borrowed (``_use_fit``),
            # so probe with the narrowest verify; that step measures it
            k = 1
        self.last_k = k
        if k == 0 and B > 1:
            again = self.recheck_rows == B  # it chose plain decoding at its last decision too
            self.recheck_every = min(2 * self.recheck_every, MAX_RECHECK) if again else RECHECK
            self.recheck, self.recheck_rows = self.recheck_every, B
        elif k:
            self.recheck_rows = 0
        by_source: dict[str, list[int]] = {}
        if k and len(self.draft_cost) > 1:  # per-source limits only matter between several drafters
            for src, cost in self.draft_cost.items():
                prior = self.pooled_acceptance(src)
                src_accs = [RowHistory(*self.per_source.get((rid, src), (0.0, 0.0))).acceptance(prior=prior)
                            for rid in ctx.row_ids]
                fixed = self.spec_overhead + self.draft_fixed.get(src, 0.0) + self._catch_up(src, B)
                by_source[src] = [min(k, self.best_k(src_accs, cost, fixed=fixed, hits=hits, scale=scale, margin=margin))] * B
        # a single row that speculates lets model-free drafters (n-gram lookup) size their own
        # drafts: k comes from the row's average acceptance, while the lookup knows how long
        # this match is (a 16-token copy holds far longer than a one-token match), and its
        # draft costs only verify width.  A batch keeps k: every row pays the widest verify.
        if k == 0:
            return self._plain(B, ctx.device)
        free = [max(k, self.free_max_draft)] if B == 1 and self.free_max_draft > k else None
        return Budget(self._tensor((k,) * B, ctx.device), self._thresholds(ctx), by_source=by_source,
                      free_max_draft=free)

    @property
    def spec_overhead(self) -> float:
        """The extra engine overhead of a speculative step over a plain one, relative to
        ``t1``: the difference of the two windows' medians (0 until both hold a sample).
        Computed when read (a decision, a speculative step's modelled cost), not on every step."""
        if self._spec_overhead is None:
            spec, plain = self.overhead[True], self.overhead[False]
            self._spec_overhead = max(0.0, median(spec) - median(plain)) if spec and plain else 0.0
        return self._spec_overhead

    def _catch_up(self, source: str, rows: int) -> float:
        """What resuming ``source`` costs a batch per speculative step, in plain steps: its
        measured catch-up (``setup_cost``) over ``SETUP_HORIZON`` steps, when it did not
        draft last step (0 for one row, whose catch-up is short, and for drafters that have
        none: n-gram lookup)."""
        if rows < 2 or source in self.drafted_last:
            return 0.0
        return self.setup_cost.get(source, 0.0) / SETUP_HORIZON

    def _thresholds(self, ctx: StepContext) -> torch.Tensor:
        """Each row's confidence threshold, ``[B]`` float32."""
        return self._tensor(tuple(self.threshold.get(r, self.base_confidence) for r in ctx.row_ids), ctx.device)

    def _plain(self, rows: int, device) -> Budget:
        """No drafting this step (the thresholds are then unused: the base one for every row).
        One object per batch size, reused: a batch that backed off returns it on most steps."""
        key = (rows, device)
        b = self._plain_budgets.get(key)
        if b is None:
            b = self._plain_budgets[key] = Budget(self._tensor((0,) * rows, device),
                                                  self._tensor((float(self.base_confidence),) * rows, device))
        return b

    def _tensor(self, values: tuple, device) -> torch.Tensor:
        """A tensor of ``values`` (int64 for ints, float32 for floats), made once and then
        reused: a budget returns the same few small tensors step after step, and a tensor
        made right after a forward costs ~5 us on a cold cache.  Read-only by contract
        (``Budget.max_draft`` and ``min_confidence`` are never written in place)."""
        key = (values, device)  # the device object itself: str(torch.device) costs ~5 us
        t = self._tensors.get(key)
        if t is None:
            if len(self._tensors) > 256:
                self._tensors.clear()
            t = self._tensors[key] = torch.tensor(values, device=device)
        return t

    def _reproducible(self, ctx: StepContext, taus: torch.Tensor) -> Budget:
        """Seeded sampling: each row's k from its own acceptance and timing-free costs (the
        drafters' structural ``draft_cost_hints`` and the prior beta), so that a seeded
        request gets the same draft lengths, hence the same output, in every run and
        whatever shares its batch."""
        hints = ctx.draft_cost_hints or {}
        cheapest = min(hints.values(), default=self.prior_draft_cost)
        ks = [self.best_k(h.acceptance(), cheapest, self.prior_beta) for h in ctx.history]
        by_source = {}
        if any(ks):
            for src, cost in hints.items():
                by_source[src] = [min(k, self.best_k(RowHistory(*self.per_source.get((rid, src), (0.0, 0.0))).acceptance(),
                                                     cost, self.prior_beta))
                                  for k, rid in zip(ks, ctx.row_ids)]
        return Budget(torch.tensor(ks, dtype=torch.long, device=ctx.device), taus, by_source=by_source)

    def prior_cost(self, source: str) -> float:
        """A drafter's cost per token before it is measured.  In a batch: its structural
        estimate from ``draft_cost_hints()`` (the share of the target's work one draft token
        does: 0 for n-gram lookup, ~0.16 for the zoo draft, ~0.5 for layer skip).  With the
        flat ``draft_cost`` (0.05) layer skip looked nearly free to a fresh policy: at batch
        8 it drafted until the guard stopped it and measured 0.89x `none` (lockstep), 1.0x
        with its estimate.  A single row keeps the flat prior, so that an unmeasured
        drafter is tried where trying costs one row's step, not a whole batch's."""
        return self.hints.get(source, self.prior_draft_cost)

    def pooled_hit_rate(self) -> float:
        """How often rows of recent steps got a draft when offered one (prior 0.9)."""
        # the same estimate as acceptance: successes (a draft) against failures (none)
        hit, offered = self.pooled_hits
        return RowHistory(hit, offered - hit).acceptance(prior=0.9)

    def hit_rate(self, request: int, pooled: float | None = None) -> float:
        """How often this row got a draft when offered one, starting from the rate pooled
        over recent steps (``pooled_hit_rate``, which a caller asking for many rows passes)."""
        if pooled is None:
            pooled = self.pooled_hit_rate()
        hit, offered = self.hits.get(request, (0.0, 0.0))
        return RowHistory(hit, offered - hit).acceptance(prior=pooled)

    def pooled_acceptance(self, source: str) -> float:
        """Acceptance pooled over every row of the recent steps (all sources for ""), with
        the fixed prior 0.6 (weight 2) until there is evidence."""
        acc, rej = self.pooled.get(source, (0.0, 0.0))
        return RowHistory(acc, rej).acceptance()

    def best_k(self, accs: list[float] | float, draft_cost: float | None = None, beta: float | None = None,
               fixed: float = 0.0, hits: list[float] | None = None, scale: float = 1.0,
               margin: float | None = None) -> int:
        """One draft length for the batch: argmax_k (sum over rows of E[tokens | k]) / cost(k).

        Row b with acceptance probability a_b yields 1 + a_b + ... + a_b^k tokens from a
        verify of k drafts, or 1 when it gets no draft (``hits[b]``: how often it gets one);
        the step costs ``scale * (1 + fixed + (beta + draft_cost) * k)`` plain steps for the
        whole batch when any row gets a draft, since every row waits for the widest verify
        (``fixed``: the extra engine overhead of a speculative step plus the drafter's
        per-draft cost; ``scale``: how much slower speculative steps measured than this
        model says), and 1 when none does.  k = 0 yields one token per row at cost 1."""
        if isinstance(accs, (int, float)):
            accs = [accs]
        d = self.prior_draft_cost if draft_cost is None else draft_cost
        slope = (self.beta if beta is None else beta) + d
        accs = [min(max(a, 0.0), 0.995) for a in accs]
        hits = [1.0] * len(accs) if hits is None else hits
        # the verify is only wider than a plain step when some row gets a draft
        p_any = 1.0
        for h in hits:
            p_any *= 1.0 - min(max(h, 0.0), 1.0)
        p_any = 1.0 - p_any
        # a 2% margin: don't draft for noise-level gains.  A batch needs batch_margin: its rows
        # finish at different steps when they speculate (the last ones pay nearly full steps
        # for fewer rows), which no per-step model sees; measured in lockstep at batch 8,
        # 1.15 moved `hybrid` from 0.987x to 0.999x `none` and `draft_model` from 0.972x to 0.987x
        if margin is None:
            margin = 1.02 if len(accs) == 1 else self.batch_margin
        # no k can win when even endless drafts (each row's a + a^2 + ... = a / (1 - a)) at
        # the cheapest speculative step (k = 1) stay below the margin: the usual answer in
        # a batch that has backed off, found in one pass over the rows instead of k passes
        cheapest = 1.0 - p_any + p_any * scale * (1.0 + fixed + slope)
        ceiling = len(accs) + sum(h * a / (1.0 - a) for h, a in zip(hits, accs))
        if slope >= 0 and ceiling / cheapest <= len(accs) * margin:
            return 0
        best_k, best = 0, float(len(accs))
        terms = [1.0] * len(accs)
        gain = float(len(accs))
        for k in range(1, self.max_draft + 1):
            for i, a in enumerate(accs):
                terms[i] *= a
                gain += hits[i] * terms[i]
            rate = gain / (1.0 - p_any + p_any * scale * (1.0 + fixed + slope * k))
            if rate > best * margin:
                best_k, best = k, rate
        return best_k

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        self._learn_costs(event)
        self._track(event)
        self._guard(event)
        # per (request, source) acceptance, decaying towards the prior when unused
        for counts in self.pooled.values():
            counts[0] *= POOL_DECAY
            counts[1] *= POOL_DECAY
        self.pooled_hits[0] *= POOL_DECAY
        self.pooled_hits[1] *= POOL_DECAY
        for rid, src, d, a in zip(event.row_ids, event.sources, event.drafted, event.accepted):
            if self.last_k > 0:  # this row was offered a draft
                got = 1.0 if d else 0.0
                row = self.hits.setdefault(rid, [0.0, 0.0])
                row[0] = row[0] * self.decay + got
                row[1] = row[1] * self.decay + 1.0
                self.pooled_hits[0] += got
                self.pooled_hits[1] += 1.0
            if d:
                for key in ("", src):
                    counts = self.pooled.setdefault(key, [0.0, 0.0])
                    counts[0] += a
                    counts[1] += 1.0 if a < d else 0.0
            for s in self.draft_cost:
                st = self.per_source.setdefault((rid, s), [0.0, 0.0])
                st[0] *= self.decay
                st[1] *= self.decay
                if s == src and d:
                    st[0] += a
                    st[1] += 1.0 if a < d else 0.0
            if d == 0:
                continue
            # slide the row's window of acceptance and move its confidence threshold
            win = self.recent.setdefault(rid, deque(maxlen=self.window))
            win.append(a / d)
            rate = sum(win) / len(win)
            tau = self.threshold.get(rid, self.base_confidence)
            if rate > 0.8:
                tau = max(0.05, tau - 0.05)
            elif rate < 0.5:
                tau = min(0.9, tau + 0.05)
            self.threshold[rid] = tau

    def _guard(self, event) -> None:
        """The throughput guard: was the last window of speculative steps slower than
        plain decoding would have been for the same tokens?

        The same window also calibrates the cost model: the time its steps took against the
        time the model predicted for them (``_modelled_cost``) is kept per kind of batch
        as ``cost_scale`` (a decayed mean, between 1 and 1.5), and ``best_k`` multiplies the cost
        of a speculative step by it.  At batch 8 the model missed costs it does not see
        (rows that finish early while the others still pay a full step, padding, a
        cascade's drafters priced as one) and measured steps took 5-25% longer than
        modelled; drafting where the model saw a small gain then lost.  Only steps that
        draft measure the scale, so while nothing drafts it decays back towards 1.  One
        row is left unscaled: there the model holds (a lockstep A/B at batch 1 measured
        1.316x `none` for `hybrid` with the scale against 1.343x without)."""
        rows = len(event.row_ids)
        if not (self.guard and rows) or self.t1 is None:
            return
        if event.drafted_max == 0:
            if event.target_forward_s > 0:
                self.plain_ratio.append(event.step_time_s / event.target_forward_s)
            if self.kind in self.cost_scale:
                self.cost_scale[self.kind] = 1.0 + (self.cost_scale[self.kind] - 1.0) * SCALE_DECAY
            return
        # one row keeps the model's reference: its speculation was tuned against it, and
        # its plain steps are rare while it speculates
        ref = self._plain_reference(rows) if rows > 1 else self.t1 * median(self.plain_ratio)
        self.spec_window.append((sum(event.emitted) / rows, event.step_time_s, self._modelled_cost(event), ref))
        if len(self.spec_window) < GUARD_WINDOW:
            return
        plain_step = self.t1 * median(self.plain_ratio)  # the cost model's plain step
        spent = sum(t for _, t, _, _ in self.spec_window)
        plain = sum(n * ref for n, _, _, ref in self.spec_window)
        modelled = sum(c for _, _, c, _ in self.spec_window) * plain_step
        self.spec_window.clear()
        if self.kind is not None:
            old = self.guard_record.get(self.kind, spent / plain)
            self.guard_record[self.kind] = (1 - GUARD_MEMORY) * old + GUARD_MEMORY * spent / plain
        if self.kind is not None and self.kind[0]:  # batches only (see the docstring)
            old = self.cost_scale.get(self.kind, 1.0)
            self.cost_scale[self.kind] = min(MAX_SCALE, max(1.0, (1 - GUARD_MEMORY) * old + GUARD_MEMORY * spent / modelled))
        if spent > plain:
            self.hold = self.backoff
            self.backoff = min(2 * self.backoff, BATCH_MAX_HOLD if self.kind and self.kind[0] else GUARD_MAX_HOLD)
        else:
            self.backoff = GUARD_HOLD

    def _plain_reference(self, rows: int) -> float:
        """What a plain step of ``rows`` rows costs here, in seconds: the mean of this
        generation's plain steps of that many rows when there are 3 or more, else the cost
        model's (that many rows' ``t1`` times the plain steps' step/forward ratio).

        This generation's: a batch's step time depends on its prompts' lengths (at batch 8
        reading the KV cache is about as much memory traffic as the weights).  Not ``t1``
        when it can be helped: that is the intercept of a line through verify widths, and
        while a batch speculates few plain steps are in its window (at batch 8 it read
        14 ms where plain steps took 20 ms, so the guard took losing windows for wins).  A
        mean, not a median: it is compared with sums of speculative steps' times, and step
        times are skewed (a plain generation's steps averaged 6% above their median)."""
        key = self._cost_key(rows)
        samples = self.plain_times.get(key)
        if samples is not None and len(samples) >= 3:
            return sum(samples) / len(samples)
        return self.fits.get(key, (self.t1,))[0] * median(self.plain_ratio)

    def _track(self, event) -> None:
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
            self.gen = _Generation(rows, self.kind, self.deterministic)
        self.gen.tokens += sum(event.emitted)
        self.gen.seconds += event.step_time_s
        self.gen.spec_steps += event.drafted_max > 0

    def _end_generation(self) -> None:
        """Judge the generation that just ended, if it was a batch that speculated: its
        steps' total time against plain decoding's for the same tokens (each of the
        first step's rows one token per full-batch plain step).  This sees what no
        per-step check does: rows that speculate finish at different steps, and the last
        ones run in small, inefficient batches (at batch 8 on `code`, the steps with
        fewer than 8 rows took 4.2 s for tokens that full-batch plain steps make in 3.3 s,
        ~6% of the run), plus a drafter's set-up.  A loss raises the modelled gain this
        kind of batch needs before it drafts (``margin``, from ``batch_margin`` up to 2)
        by the measured loss; a win lowers it the same way, not below ``batch_margin``;
        a generation that did not speculate lets it drift back by a quarter."""
        gen, self.gen = self.gen, None
        if gen is None or not self.guard:
            return
        if gen.rows < 2 or gen.kind is None or gen.deterministic or self.t1 is None:
            return
        m = self.margin.get(gen.kind, self.batch_margin)
        if gen.spec_steps == 0:
            self.margin[gen.kind] = self.batch_margin + 0.75 * (m - self.batch_margin)
            return
        plain = gen.tokens / gen.rows * self._plain_reference(gen.rows)
        ratio = gen.seconds / plain if plain > 0 else 1.0
        self.margin[gen.kind] = min(MAX_MARGIN, max(self.batch_margin, m * ratio))

    def _modelled_cost(self, event) -> float:
        """What the cost model says this speculative step costs, in plain steps: 1 plus the
        extra overhead plus the drafter's ``f + d * k`` plus ``beta * k`` for the verify."""
        k = event.drafted_max
        timed = _timed_drafters(event)
        if timed:  # model drafters that timed themselves: each at its own draft length
            drafting = sum(self.draft_fixed.get(src, 0.0) + self.draft_cost.get(src, self.prior_cost(src)) * n
                           for src, (_, n) in timed.items())
            return 1.0 + self.spec_overhead + drafting + self.beta * k
        srcs = {s for s, d in zip(event.sources, event.drafted) if d}
        src = srcs.pop() if len(srcs) == 1 else None
        if src in self.draft_cost:
            f, d = self.draft_fixed.get(src, 0.0), self.draft_cost[src]
        else:
            f, d = 0.0, min(self.draft_cost.values(), default=self.prior_draft_cost)
        return 1.0 + self.spec_overhead + f + (self.beta + d) * k

    def _learn_costs(self, event) -> None:
        """Update the cost estimates from one step's measurements."""
        if event.verify_tokens >= 1 and event.row_ids:
            key = self._cost_key(len(event.row_ids))
            # get, not setdefault: a new window for every step's default cost ~5 us at batch 8
            window = self.forward_samples.get(key)
            if window is None:
                window = self.forward_samples[key] = _ForwardWindow(32)
            window.append(event.verify_tokens, event.target_forward_s)
            if event.verify_tokens == 1 and event.target_forward_s > 0:
                # kept apart: while a batch speculates, its window soon holds no plain forward
                plain = self.plain_forwards.get(key)
                if plain is None:
                    plain = self.plain_forwards[key] = _MedianWindow(16)
                plain.append(event.target_forward_s)
                self.plain_age[key] = 0
            else:
                self.plain_age[key] = self.plain_age.get(key, 0) + 1
            if key[0] > 1 and event.drafted_max == 0 and key in self.fits:
                # a batch's plain step: refitted when a decision reads it (``_use_fit``).  Its
                # beta does not drift, so the fit is a function of the window alone, and a
                # batch that backed off decides only every few steps (``recheck_every``)
                self.unfitted.add(key)
                self.t1, self.beta = self.fits[key]
            else:
                self._fit_forward_cost(key)
        timed = _timed_drafters(event)
        if self.t1:
            # the draft stage is costed as draft tokens (draft_cost): leave it out here.  When
            # model drafters timed themselves, only their forwards are draft cost, and the rest
            # of the draft stage (a cascade's lookups and fusion) stays in the step's overhead
            drafting = 0.0 if timed else max(0.0, event.stage_s.get("draft", 0.0) - event.draft_forward_s)
            spec = event.drafted_max > 0
            # a generation's first speculative step also builds the drafters' state (n-gram
            # indexes, a draft model's prefill): not what a speculative step costs
            if not (spec and self.first_spec):
                self.overhead[spec].append(max(0.0, event.overhead_s - drafting) / self.t1)
            self.first_spec = self.first_spec and not spec
            self._spec_overhead = None
        # the components that drafted (a cascade's row is labelled "ngram+draft_model")
        used = {part for s, d in zip(event.sources, event.drafted) if d for part in s.split("+")} | set(timed)
        if self.t1 and len(timed) == 1 and len(event.row_ids) > 1 and event.draft_setup_s > 0:
            # a batch's catch-up of the one model drafter that ran (its setup time)
            src = next(iter(timed))
            cost = event.draft_setup_s / self.t1
            old = self.setup_cost.get(src)
            self.setup_cost[src] = cost if old is None else 0.5 * old + 0.5 * cost
        self.drafted_last = set(timed)
        for src, samples in self.draft_samples.items():
            if src not in used:  # an unused drafter drifts back to its cheapest measured cost, so it gets probed again
                f, d = self.draft_floor.get(src, (0.0, self.prior_cost(src)))
                k = self.last_drafted.get(src, 1)
                drift = (k, f + d * k)
                if self.settled.get(src) == drift:  # the window holds nothing else: the fit cannot move
                    continue
                samples.append(drift)
                self._fit_draft_cost(src)
                if samples.count(drift) == len(samples):
                    self.settled[src] = drift
            else:
                self.settled.pop(src, None)
        if not (self.t1 and event.drafted_max > 0):
            return
        if timed:
            # each model drafter's own time and draft length; model-free drafters in the same
            # step (n-gram lookup in a cascade) are measured on the steps they draft alone
            measurements = [(src, spent, k) for src, (spent, k) in timed.items()]
        elif len(used) == 1:
            # one drafter that did not time itself: the draft stage is its cost
            spent = event.draft_forward_s - event.draft_setup_s if event.draft_forward_s > 0 else event.stage_s.get("draft", 0.0)
            measurements = [(next(iter(used)), spent, event.drafted_max)]
        else:
            return
        for src, spent, k in measurements:
            self._measure_draft(src, spent, k)

    def _measure_draft(self, src: str, spent: float, k: int) -> None:
        """One measurement of drafter ``src``: ``spent`` seconds for a draft of ``k`` tokens."""
        if src not in self.warm:  # a drafter's first step also fills its own cache: not a typical cost
            self.warm.add(src)
            self.draft_samples.setdefault(src, deque([(1, self.prior_cost(src))], maxlen=16))
            self.draft_cost.setdefault(src, self.prior_cost(src))
            self.draft_fixed.setdefault(src, 0.0)
            return
        samples = self.draft_samples.setdefault(src, deque(maxlen=16))
        samples.append((k, min(spent / self.t1, 3.0 * k)))
        self.last_drafted[src] = k
        self._fit_draft_cost(src)
        self.measured[src] = self.measured.get(src, 0) + 1
        if self.measured[src] >= 8:  # a drafter's cost is structural: remember the cheapest line seen (at k = 2)
            f, d = self.draft_fixed[src], self.draft_cost[src]
            old = self.draft_floor.get(src)
            if old is None or f + 2 * d < old[0] + 2 * old[1]:
                self.draft_floor[src] = (f, d)

    def _fit_draft_cost(self, src: str) -> None:
        """``f + d * k`` through the median cost of each draft length k in the source's
        window (least squares, weighted by how often each k occurred).  With one length
        only, or a line that would make drafting free, all of it is charged per token."""
        by_k: dict[int, list[float]] = {}
        for k, c in self.draft_samples[src]:
            by_k.setdefault(k, []).append(c)
        pts = [(k, median(cs), len(cs)) for k, cs in by_k.items()]
        w = sum(n for _, _, n in pts)
        fixed, per = 0.0, sum(n * y for _, y, n in pts) / sum(n * x for x, _, n in pts)
        if len(pts) >= 2:
            xm = sum(x * n for x, _, n in pts) / w
            ym = sum(y * n for _, y, n in pts) / w
            sxx = sum(n * (x - xm) ** 2 for x, _, n in pts)
            slope = sum(n * (x - xm) * (y - ym) for x, y, n in pts) / sxx
            if slope > 0 and ym - slope * xm >= 0:
                fixed, per = ym - slope * xm, slope
        self.draft_fixed[src], self.draft_cost[src] = fixed, per

    def _cost_key(self, rows: int) -> tuple[int, bool]:
        """The cost windows' key for a batch of ``rows`` rows: (rows, greedy?).  Greedy and
        sampled verifies differ (a greedy one applies the lm_head only as far as the drafts
        hold), and so do row counts: a forward over 8 rows takes ~3x one over a single row."""
        return rows, True if self.kind is None else self.kind[1]

    def _use_fit(self, key: tuple[int, bool]) -> None:
        """Point ``t1`` and ``beta`` at the fit for ``key``; a key never fitted keeps ``t1``
        (its calibration step fits it) and borrows beta (``_borrowed_beta``)."""
        if key in self.unfitted:
            self._fit_forward_cost(key)
        fit = self.fits.get(key)
        self.t1, self.beta = fit if fit is not None else (self.t1, self._borrowed_beta(key))

    def _borrowed_beta(self, key: tuple[int, bool]) -> float:
        """The beta for a key whose verify was never measured: for one row the prior; for a
        batch the beta measured at the nearest batch size (the larger on a tie: beta grows
        with the rows, and a batch that over-estimates it only drafts less), else the prior."""
        rows, greedy = key
        if rows == 1:
            return self.prior_beta
        near = [(abs(r - rows), -r, b) for (r, g), b in self.verified_beta.items() if g == greedy and r > 1]
        return min(near)[2] if near else self.prior_beta

    def _fit_forward_cost(self, key: tuple[int, bool]) -> None:
        """Fit ``t(q) = t1 * (1 + beta * (q - 1))`` to the forwards of ``key`` (rows, greedy?).

        Where plain forwards (q = 1) were measured, ``t1`` is their median and ``beta`` the
        least-squares slope through that point and the median time of each verify width in
        the window (weighted by how often each width occurred).  Anchored there because that
        is the cost a draft has to beat, and because a verify's cost is not a line through
        widths: at batch 8 on the zoo target the first verified token costs ~0.5 of a plain
        step and each next one ~0.3-0.4, so a free line through widths 3-6 put its intercept
        at 5 ms where plain steps took 3.6 ms, and beta at 0.1.  Without a plain forward yet,
        a free line through the window's widths; with a single width the two cannot be told
        apart: t1 follows from the last beta.

        While no verify is in the window beta is not being measured: one row drifts back to
        the prior (its verify width is cheap, and what lost may be a slow period), a batch
        keeps what it measured, since there a verified token's cost is structural (0.3-0.8
        of a plain step at batch 8 on the zoo target against the prior 0.12; drifting to the
        prior had it probe at a loss in every generation).

        One window and fit per key, chosen for each decision (``_use_fit``): a window that
        mixed row counts (a batch's last steps run a row or two; the next batch starts with
        8) fitted lines through unrelated points, and one fit carried from the last step of
        a generation into the first of the next: at batch 8 on `code` the batch-1 beta (0.0
        after a warm-up) made `draft_model` draft at the first step of every generation and
        measure 0.95x `none`."""
        prev = self.fits.get(key)
        beta = prev[1] if prev is not None else self._borrowed_beta(key)
        widths = self.forward_samples[key].medians()  # (q, median seconds, count)
        plain = self.plain_forwards.get(key)
        verified = False
        if plain:
            t1 = plain.median()
            pts = [(q - 1, m, n) for q, m, n in widths if q > 1]
            if pts:
                sxx = sum(n * x * x for x, _, n in pts)
                beta = min(max(sum(n * x * (y / t1 - 1.0) for x, y, n in pts) / sxx, 0.0), 2.0)
                verified = True
            elif key[0] == 1:
                beta = 0.9 * beta + 0.1 * self.prior_beta
        else:
            pts = [(q - 1, m, n) for q, m, n in widths]
            t1 = None
            if len(pts) >= 2:
                w = sum(n for _, _, n in pts)
                xm = sum(x * n for x, _, n in pts) / w
                ym = sum(y * n for _, y, n in pts) / w
                sxx = sum(n * (x - xm) ** 2 for x, _, n in pts)
                slope = sum(n * (x - xm) * (y - ym) for x, y, n in pts) / sxx
                if ym - slope * xm > 0:
                    t1 = ym - slope * xm
                    beta = min(max(slope / t1, 0.0), 2.0)
                    verified = True
            if t1 is None:
                x, y, _ = pts[0]
                t1 = y / (1.0 + beta * x)
        self.unfitted.discard(key)
        if verified:
            self.verified_beta[key] = beta
        self.fits[key] = (t1, beta)
        self.t1, self.beta = t1, beta
