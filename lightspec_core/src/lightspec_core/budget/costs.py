"""The cost model: what a step costs, in plain target steps, learned from step statistics.

* Verify: a target forward over q tokens costs ``t1 * (1 + beta * (q - 1))`` seconds,
  fitted per cost key (rows, greedy?) from a window of recent forwards
  (``fit_forward_cost``); ``t1`` and ``beta`` are the fit of the batch being decided or
  measured (``use_fit``).
* Drafting: drafter s costs ``f_s + d_s * k`` plain steps for a draft of k tokens (a
  model drafter's first forward also feeds its cache the tokens accepted since its last
  draft), fitted from a window of its recent measurements (``fit_draft_cost``); an
  unused drafter's samples drift back to the cheapest line measured for it.
* Measured lengths: where a window holds ``MEASURED_AT`` samples of a verify width or a
  draft length, the median measured there replaces the line at that length
  (``extra_costs``): both costs are concave in the length, so a line through all of them
  under-prices the short drafts a policy tries most.
* Catch-up: a model drafter that did not draft on the last step first prefills what its
  cache missed (its ``setup_s``), charged over ``SETUP_HORIZON`` steps; one that has not
  drafted yet in this generation first reads the whole prompt (its start-up, learned from
  earlier generations' first drafts apart from the catch-ups of resumed drafts).
* Overhead: the extra engine time of a speculative step over a plain one
  (``spec_overhead``), outside model forwards.

All costs are relative to ``t1`` unless stated in seconds.  Medians over windows keep
one slow step from moving an estimate.  Why each rule is there (with the measurements):
``docs/design/budget.md``, "Cost model".
"""

from __future__ import annotations

from collections import deque
from statistics import median

from .windows import ForwardWindow, MedianWindow

FORWARD_WINDOW = 32  # target forwards per cost key
PLAIN_WINDOW = 16  # plain forwards per cost key (kept apart: a speculating batch has few)
DRAFT_WINDOW = 16  # measurements per drafter
FLOOR_AFTER = 8  # measurements before a drafter's cheapest line is remembered
MAX_BETA = 2.0
# a model drafter's catch-up (or start-up) is charged as a fixed cost spread over this many
# speculative steps, when it did not draft on the last step
SETUP_HORIZON = 8
MEASURED_AT = 3  # samples of one verify width or draft length before their median replaces the line there

CostKey = tuple[int, bool]  # (rows, greedy?)


def timed_drafters(event) -> dict[str, tuple[float, int]]:
    """The model drafters that timed themselves this step and drafted: {name: (seconds, tokens)}."""
    return {src: v for src, v in event.draft_by_source.items() if v[1] > 0}


def _weighted_line(pts: list[tuple[float, float, int]]) -> tuple[float, float, float]:
    """(x mean, y mean, slope) of the least-squares line through (x, y) weighted by n;
    needs at least two distinct x."""
    w = sum(n for _, _, n in pts)
    xm = sum(x * n for x, _, n in pts) / w
    ym = sum(y * n for _, y, n in pts) / w
    sxx = sum(n * (x - xm) ** 2 for x, _, n in pts)
    return xm, ym, sum(n * (x - xm) * (y - ym) for x, y, n in pts) / sxx


class CostModel:
    """Online estimates of verify, draft, catch-up and overhead costs.

    ``prior_beta`` and ``prior_draft_cost`` are the estimates before any measurement.
    ``greedy`` (set by the policy per generation) selects the cost keys; ``hints`` (set
    per decision) are the drafters' structural cost estimates a batch starts from."""

    def __init__(self, prior_beta: float, prior_draft_cost: float):
        self.prior_beta = prior_beta
        self.prior_draft_cost = prior_draft_cost
        self.greedy = True
        self.t1: float | None = None  # seconds of a plain forward, for the current key
        self.beta = prior_beta
        self.forward_samples: dict[CostKey, ForwardWindow] = {}
        self.plain_forwards: dict[CostKey, MedianWindow] = {}
        self.fits: dict[CostKey, tuple[float, float]] = {}  # key -> (t1, beta)
        self.verified_beta: dict[CostKey, float] = {}  # key -> the beta last fitted from verifies
        self.unfitted: set[CostKey] = set()  # keys whose window changed since their fit
        self.plain_age: dict[CostKey, int] = {}  # steps since the key's last plain forward
        self.draft_samples: dict[str, deque[tuple[int, float]]] = {}  # (tokens drafted, cost)
        self.draft_cost: dict[str, float] = {}  # per source: d, the cost of each draft token
        self.draft_fixed: dict[str, float] = {}  # per source: f, the cost of drafting at all
        self.draft_floor: dict[str, tuple[float, float]] = {}  # per source: the cheapest (f, d) fitted
        self.draft_by_k: dict[str, dict[int, float]] = {}  # per source: median cost per draft length with MEASURED_AT samples
        self.last_drafted: dict[str, int] = {}
        self.settled: dict[str, tuple[int, float]] = {}  # per source: the drift sample its whole window holds
        self.measured: dict[str, int] = {}
        self.warm: set[str] = set()  # drafters measured once this generation (the first fills caches)
        self.setup_cost: dict[str, float] = {}  # per source: its catch-up when resuming (decayed mean)
        self.start_cost: dict[str, float] = {}  # per source: its first draft's catch-up in a generation (decayed mean)
        self.drafted_last: set[str] = set()  # drafters that drafted on the last step
        self.hints: dict[str, float] = {}
        # engine overhead per step relative to t1, of plain (False) and speculative (True) steps
        self.overhead: dict[bool, deque[float]] = {False: deque(maxlen=16), True: deque(maxlen=16)}
        self._spec_overhead: float | None = 0.0  # None: recompute
        self.first_spec = True  # no speculative step yet in this generation

    def new_generation(self) -> None:
        self.warm.clear()
        self.first_spec = True

    def key(self, rows: int) -> CostKey:
        """The cost windows' key for a batch of ``rows`` rows: (rows, greedy?).  Greedy and
        sampled verifies differ (a greedy one applies the lm_head only as far as the drafts
        hold), and so do row counts."""
        return rows, self.greedy

    @property
    def spec_overhead(self) -> float:
        """The extra engine overhead of a speculative step over a plain one, relative to
        ``t1``: the difference of the two windows' medians (0 until both hold a sample),
        computed when read."""
        if self._spec_overhead is None:
            spec, plain = self.overhead[True], self.overhead[False]
            self._spec_overhead = max(0.0, median(spec) - median(plain)) if spec and plain else 0.0
        return self._spec_overhead

    def prior_cost(self, source: str) -> float:
        """A drafter's cost per token before it is measured: its structural estimate
        (``hints``, set for batches) or the flat prior (a single row tries any drafter)."""
        return self.hints.get(source, self.prior_draft_cost)

    def catch_up(self, source: str) -> float:
        """What resuming ``source`` costs per speculative step, in plain steps, when it did
        not draft last step: its measured catch-up over ``SETUP_HORIZON`` steps, its
        start-up if it has not drafted yet in this generation (0 for drafters without
        catch-up: n-gram lookup)."""
        if source in self.drafted_last:
            return 0.0
        if source not in self.warm and source in self.start_cost:
            return self.start_cost[source] / SETUP_HORIZON
        return self.setup_cost.get(source, 0.0) / SETUP_HORIZON

    def modelled_cost(self, event) -> float:
        """What the model says this speculative step costs, in plain steps: 1 plus the
        extra overhead plus each drafter's draft plus the verify's extra width, each priced
        as ``extra_costs`` prices it (measured at that length, else the line)."""
        k = event.drafted_max
        verify = self._verified(len(event.row_ids)).get(k, self.beta * k)
        timed = timed_drafters(event)
        if timed:  # model drafters that timed themselves: each at its own draft length
            drafting = sum(self._drafted(src, n, self.draft_fixed.get(src, 0.0),
                                         self.draft_cost.get(src, self.prior_cost(src)))
                           for src, (_, n) in timed.items())
            return 1.0 + self.spec_overhead + drafting + verify
        srcs = {s for s, d in zip(event.sources, event.drafted) if d}
        src = srcs.pop() if len(srcs) == 1 else None
        if src in self.draft_cost:
            f, d = self.draft_fixed.get(src, 0.0), self.draft_cost[src]
        else:
            f, d = 0.0, min(self.draft_cost.values(), default=self.prior_draft_cost)
        return 1.0 + self.spec_overhead + self._drafted(src, k, f, d) + verify

    def extra_costs(self, source: str | None, rows: int, max_k: int, per_token: float, fixed: float) -> list[float]:
        """What a step drafting k = 1..``max_k`` tokens with ``source`` costs beyond a plain
        step, in plain steps, list index k - 1: the verify of k + 1 slots beyond a plain
        forward plus the draft of k tokens.  Each is the median measured at that length
        where the window of ``rows``'s cost key (verify) or of ``source`` (draft) holds
        ``MEASURED_AT`` samples of it, else its line: ``beta * k`` and ``fixed + per_token *
        k`` (the caller's draft line: an unmeasured source's prior, or its fit).  Call after
        ``use_fit`` for the same key."""
        verified, drafted, beta = self._verified(rows), self.draft_by_k.get(source, {}), self.beta
        return [verified.get(k, beta * k) + drafted.get(k, fixed + per_token * k) for k in range(1, max_k + 1)]

    def _verified(self, rows: int) -> dict[int, float]:
        """{k: the median verify of k + 1 slots beyond a plain forward, in plain steps} for
        the widths ``rows``'s window holds ``MEASURED_AT`` times."""
        window = self.forward_samples.get(self.key(rows))
        if window is None or not self.t1:
            return {}
        t1 = self.t1
        return {q - 1: m / t1 - 1.0 for q, m, n in window.medians() if n >= MEASURED_AT and q > 1}

    def _drafted(self, source: str | None, k: int, fixed: float, per_token: float) -> float:
        """A draft of ``k`` tokens by ``source``: its median at k when measured ``MEASURED_AT``
        times in its window, else ``fixed + per_token * k``."""
        return self.draft_by_k.get(source, {}).get(k, fixed + per_token * k)

    # -- learning ------------------------------------------------------------------------

    def learn(self, event) -> None:
        """Update every estimate from one step's measurements."""
        if event.verify_tokens >= 1 and event.row_ids:
            self._learn_forward(event)
        timed = timed_drafters(event)
        if self.t1:
            # the draft stage is costed as draft tokens: leave it out of the overhead.  When
            # model drafters timed themselves, only their forwards are draft cost
            drafting = 0.0 if timed else max(0.0, event.stage_s.get("draft", 0.0) - event.draft_forward_s)
            spec = event.drafted_max > 0
            # a generation's first speculative step also builds the drafters' state
            if not (spec and self.first_spec):
                self.overhead[spec].append(max(0.0, event.overhead_s - drafting) / self.t1)
            self.first_spec = self.first_spec and not spec
            self._spec_overhead = None
        # the components that drafted (a cascade's row is labelled "ngram+draft_model")
        used = {part for s, d in zip(event.sources, event.drafted) if d for part in s.split("+")} | set(timed)
        src = next(iter(timed)) if len(timed) == 1 else None
        if self.t1 and src and event.draft_setup_s > 0:
            # the catch-up of the one model drafter that ran: its start-up in this generation
            # (the whole prompt) or a resumed draft's
            costs = self.setup_cost if src in self.warm else self.start_cost
            cost, old = event.draft_setup_s / self.t1, costs.get(src)
            costs[src] = cost if old is None else 0.5 * old + 0.5 * cost
        self.drafted_last = set(timed)
        self._drift_unused(used)
        if not (self.t1 and event.drafted_max > 0):
            return
        if timed:
            # each model drafter's own time and draft length; model-free drafters in the same
            # step are measured on the steps they draft alone
            measurements = [(src, spent, k) for src, (spent, k) in timed.items()]
        elif len(used) == 1:
            # one drafter that did not time itself: the draft stage is its cost
            spent = (event.draft_forward_s - event.draft_setup_s if event.draft_forward_s > 0
                     else event.stage_s.get("draft", 0.0))
            measurements = [(next(iter(used)), spent, event.drafted_max)]
        else:
            return
        for src, spent, k in measurements:
            self._measure_draft(src, spent, k)

    def _learn_forward(self, event) -> None:
        key = self.key(len(event.row_ids))
        window = self.forward_samples.get(key)  # get, not setdefault: no new window per step
        if window is None:
            window = self.forward_samples[key] = ForwardWindow(FORWARD_WINDOW)
        window.append(event.verify_tokens, event.target_forward_s)
        if event.verify_tokens == 1 and event.target_forward_s > 0:
            plain = self.plain_forwards.get(key)
            if plain is None:
                plain = self.plain_forwards[key] = MedianWindow(PLAIN_WINDOW)
            plain.append(event.target_forward_s)
            self.plain_age[key] = 0
        else:
            self.plain_age[key] = self.plain_age.get(key, 0) + 1
        if key[0] > 1 and event.drafted_max == 0 and key in self.fits:
            # a batch's plain step: refitted when a decision reads it (``use_fit``); a batch's
            # beta does not drift, so the fit depends on the window alone
            self.unfitted.add(key)
            self.t1, self.beta = self.fits[key]
        else:
            self.fit_forward_cost(key)

    def _drift_unused(self, used: set[str]) -> None:
        """An unused drafter's window drifts back to its cheapest measured cost (one sample a
        step), so that a drafter dropped in a slow period is probed again."""
        for src, samples in self.draft_samples.items():
            if src in used:
                self.settled.pop(src, None)
                continue
            f, d = self.draft_floor.get(src, (0.0, self.prior_cost(src)))
            k = self.last_drafted.get(src, 1)
            drift = (k, f + d * k)
            if self.settled.get(src) == drift:  # the window holds nothing else: the fit cannot move
                continue
            samples.append(drift)
            self.fit_draft_cost(src)
            if samples.count(drift) == len(samples):
                self.settled[src] = drift

    def _measure_draft(self, src: str, spent: float, k: int) -> None:
        """One measurement of drafter ``src``: ``spent`` seconds for a draft of ``k`` tokens."""
        if src not in self.warm:  # a drafter's first step also fills its own cache: not a typical cost
            self.warm.add(src)
            self.draft_samples.setdefault(src, deque([(1, self.prior_cost(src))], maxlen=DRAFT_WINDOW))
            self.draft_cost.setdefault(src, self.prior_cost(src))
            self.draft_fixed.setdefault(src, 0.0)
            return
        samples = self.draft_samples.setdefault(src, deque(maxlen=DRAFT_WINDOW))
        samples.append((k, min(spent / self.t1, 3.0 * k)))
        self.last_drafted[src] = k
        self.fit_draft_cost(src)
        self.measured[src] = self.measured.get(src, 0) + 1
        if self.measured[src] >= FLOOR_AFTER:  # structural: remember the cheapest line seen (at k = 2)
            f, d = self.draft_fixed[src], self.draft_cost[src]
            old = self.draft_floor.get(src)
            if old is None or f + 2 * d < old[0] + 2 * old[1]:
                self.draft_floor[src] = (f, d)

    def fit_draft_cost(self, src: str) -> None:
        """``f + d * k`` through the median cost of each draft length k in the source's
        window (least squares, weighted by how often each k occurred).  With one length
        only, or a line that would make drafting free, all of it is charged per token."""
        by_k: dict[int, list[float]] = {}
        for k, c in self.draft_samples[src]:
            by_k.setdefault(k, []).append(c)
        pts = [(k, median(cs), len(cs)) for k, cs in by_k.items()]
        self.draft_by_k[src] = {k: m for k, m, n in pts if n >= MEASURED_AT}
        fixed, per = 0.0, sum(n * y for _, y, n in pts) / sum(n * x for x, _, n in pts)
        if len(pts) >= 2:
            xm, ym, slope = _weighted_line(pts)
            if slope > 0 and ym - slope * xm >= 0:
                fixed, per = ym - slope * xm, slope
        self.draft_fixed[src], self.draft_cost[src] = fixed, per

    # -- verify cost fits ----------------------------------------------------------------

    def use_fit(self, key: CostKey) -> None:
        """Point ``t1`` and ``beta`` at the fit for ``key``; a key never fitted keeps ``t1``
        and borrows beta (``borrowed_beta``)."""
        if key in self.unfitted:
            self.fit_forward_cost(key)
        fit = self.fits.get(key)
        self.t1, self.beta = fit if fit is not None else (self.t1, self.borrowed_beta(key))

    def borrowed_beta(self, key: CostKey) -> float:
        """The beta for a key whose verify was never measured: for one row the prior; for a
        batch the beta measured at the nearest batch size (the larger on a tie: beta grows
        with the rows, and over-estimating it only drafts less), else the prior."""
        rows, greedy = key
        if rows == 1:
            return self.prior_beta
        near = [(abs(r - rows), -r, b) for (r, g), b in self.verified_beta.items() if g == greedy and r > 1]
        return min(near)[2] if near else self.prior_beta

    def fit_forward_cost(self, key: CostKey) -> None:
        """Fit ``t(q) = t1 * (1 + beta * (q - 1))`` to the forwards of ``key``.

        With plain forwards (q = 1) measured, ``t1`` is their median and ``beta`` the
        least-squares slope through that point and the median time of each verify width in
        the window (weighted by count), clamped to [0, 2]: anchored at the cost a draft has
        to beat (verify costs are concave in width, so a free line misplaces the intercept).
        Without a plain forward, a free line through the widths; with a single width, t1
        follows from the last beta.

        While no verify is in the window, beta is not measured: one row drifts back to the
        prior by 10% a step, a batch keeps what it measured (a batch's verified-token cost
        is structural)."""
        prev = self.fits.get(key)
        beta = prev[1] if prev is not None else self.borrowed_beta(key)
        widths = self.forward_samples[key].medians()  # (q, median seconds, count)
        plain = self.plain_forwards.get(key)
        verified = False
        if plain:
            t1 = plain.median()
            pts = [(q - 1, m, n) for q, m, n in widths if q > 1]
            if pts:
                sxx = sum(n * x * x for x, _, n in pts)
                beta = min(max(sum(n * x * (y / t1 - 1.0) for x, y, n in pts) / sxx, 0.0), MAX_BETA)
                verified = True
            elif key[0] == 1:
                beta = 0.9 * beta + 0.1 * self.prior_beta
        else:
            pts = [(q - 1, m, n) for q, m, n in widths]
            t1 = None
            if len(pts) >= 2:
                xm, ym, slope = _weighted_line(pts)
                if ym - slope * xm > 0:
                    t1 = ym - slope * xm
                    beta = min(max(slope / t1, 0.0), MAX_BETA)
                    verified = True
            if t1 is None:
                x, y, _ = pts[0]
                t1 = y / (1.0 + beta * x)
        self.unfitted.discard(key)
        if verified:
            self.verified_beta[key] = beta
        self.fits[key] = (t1, beta)
        self.t1, self.beta = t1, beta
