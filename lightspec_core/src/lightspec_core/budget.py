"""Budget policies: how many tokens to draft per row and step.

``dynamic`` (the default) is training-free and cost-aware.  Per row it keeps decayed
counts of accepted draft tokens and of rejections, which estimate the per-token
acceptance probability a (a geometric model: a verify of k drafts yields
1 + a + ... + a^k tokens).  It learns online, from the step statistics, what a verify
over q tokens costs relative to a plain step (``1 + beta * (q - 1)``) and what one draft
token costs (``d``), and picks the draft length that maximises tokens per unit of time.
k = 0 means plain decoding: speculation backs off where it does not pay.

Two rules keep that choice sound on a noisy machine (on the 2-core VM a forward's time
moves by 2x between identical calls):

* costs come from medians over a window of recent steps: the verify cost is a line
  fitted through the median forward time of each verify width seen in the last 32
  steps, the draft cost the median of the last 16 measurements; one slow step does
  not switch speculation off;
* an estimate that is not being measured drifts back: an unused drafter's cost towards
  the lowest median measured for it (its prior until 8 measurements exist) by one
  sample per step, beta towards its prior by 10% per step once only plain steps remain
  in the window.  A policy that backed off because of acceptance or a slow period
  therefore probes again (after 9 to about 40 plain steps) instead of staying off for
  good, while a drafter that is simply too expensive for its acceptance (the cost of a
  draft token is a property of the drafter) is not probed again and again.

In a batch every row pays for the widest verify, so the batch shares one draft length:
the k that maximises the batch's expected tokens per unit of time.

The draft-confidence rule runs inside model drafters: a row's draft stops when the
drafter's peak probability falls below ``min_confidence``.  The policy adapts that
threshold per row over a sliding window of recent verifies: high recent acceptance
lowers it (draft deeper), low acceptance raises it.
"""

from __future__ import annotations

from collections import deque
from statistics import median

import torch

from .hookspecs import hookimpl
from .interfaces import Budget, RowHistory, StepContext


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
        self.max_draft = max_draft
        self.window = window
        self.base_confidence = min_confidence
        self.prior_beta = beta
        self.prior_draft_cost = draft_cost
        self.decay = decay
        # cost windows: (verify tokens, seconds) of recent target forwards, and per source
        # the cost of one draft token relative to a plain step (its median is the estimate)
        self.forward_samples: deque[tuple[int, float]] = deque(maxlen=32)
        self.draft_samples: dict[str, deque[float]] = {}
        self.t1: float | None = None
        self.beta = beta
        self.draft_cost: dict[str, float] = {}
        self.draft_floor: dict[str, float] = {}  # per source: the lowest median cost measured (after 8 measurements)
        self.measured: dict[str, int] = {}
        self.per_source: dict[tuple[int, str], list[float]] = {}  # (request, source) -> [accepted, rejected]
        self.recent: dict[int, deque] = {}
        self.threshold: dict[int, float] = {}
        self.warm: set[str] = set()

    def reset(self) -> None:
        self.warm.clear()
        self.per_source.clear()
        self.recent.clear()
        self.threshold.clear()

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        B = ctx.batch
        taus = torch.tensor([self.threshold.get(r, self.base_confidence) for r in ctx.row_ids], device=ctx.device)
        accs = [h.acceptance() for h in ctx.history]
        if ctx.deterministic:  # seeded sampling: decide from acceptance only, with the prior costs
            k = self.best_k(accs, self.prior_draft_cost, self.prior_beta)
            return Budget(torch.full((B,), k, dtype=torch.long, device=ctx.device), taus)
        if self.t1 is None:  # calibrate: one plain step measures what a target forward costs
            return Budget(torch.zeros(B, dtype=torch.long, device=ctx.device), taus)
        k = self.best_k(accs, min(self.draft_cost.values(), default=self.prior_draft_cost))
        by_source: dict[str, list[int]] = {}
        if k:
            for src, cost in self.draft_cost.items():
                src_accs = [RowHistory(*self.per_source.get((rid, src), (0.0, 0.0))).acceptance() for rid in ctx.row_ids]
                by_source[src] = [min(k, self.best_k(src_accs, cost))] * B
        return Budget(torch.full((B,), k, dtype=torch.long, device=ctx.device), taus, by_source=by_source)

    def best_k(self, accs: list[float] | float, draft_cost: float | None = None, beta: float | None = None) -> int:
        """One draft length for the batch: argmax_k (sum over rows of E[tokens | k]) / cost(k).

        Row b with acceptance probability a_b yields 1 + a_b + ... + a_b^k tokens from a
        verify of k drafts; the step costs 1 + (beta + draft_cost) * k plain steps for the
        whole batch, since every row waits for the widest verify.  k = 0 yields one token
        per row at cost 1."""
        if isinstance(accs, (int, float)):
            accs = [accs]
        d = self.prior_draft_cost if draft_cost is None else draft_cost
        slope = (self.beta if beta is None else beta) + d
        accs = [min(max(a, 0.0), 0.995) for a in accs]
        best_k, best = 0, float(len(accs))
        terms = [1.0] * len(accs)
        gain = float(len(accs))
        for k in range(1, self.max_draft + 1):
            for i, a in enumerate(accs):
                terms[i] *= a
                gain += terms[i]
            rate = gain / (1.0 + slope * k)
            if rate > best * 1.02:  # a 2% margin: don't draft for noise-level gains
                best_k, best = k, rate
        return best_k

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        self._learn_costs(event)
        # per (request, source) acceptance, decaying towards the prior when unused
        for rid, src, d, a in zip(event.row_ids, event.sources, event.drafted, event.accepted):
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

    def _learn_costs(self, event) -> None:
        """Update the cost estimates from one step's measurements."""
        if event.verify_tokens >= 1:
            self.forward_samples.append((event.verify_tokens, event.target_forward_s))
            self._fit_forward_cost()
        used = {s for s, d in zip(event.sources, event.drafted) if d}
        for src, samples in self.draft_samples.items():
            if src not in used:  # an unused drafter drifts back to its best measured cost, so it gets probed again
                samples.append(self.draft_floor.get(src, self.prior_draft_cost))
                self.draft_cost[src] = median(samples)
        if not (self.t1 and len(used) == 1 and event.drafted_max > 0):
            return
        src = used.pop()
        if src not in self.warm:  # a drafter's first step also fills its own cache: not a typical cost
            self.warm.add(src)
            self.draft_samples.setdefault(src, deque([self.prior_draft_cost], maxlen=16))
            self.draft_cost.setdefault(src, self.prior_draft_cost)
            return
        # model drafters report their forward time; for model-free drafters the draft stage is the cost
        spent = event.draft_forward_s - event.draft_setup_s if event.draft_forward_s > 0 else event.stage_s.get("draft", 0.0)
        samples = self.draft_samples.setdefault(src, deque(maxlen=16))
        samples.append(min(spent / event.drafted_max / self.t1, 3.0))
        self.draft_cost[src] = median(samples)
        self.measured[src] = self.measured.get(src, 0) + 1
        if self.measured[src] >= 8:  # a drafter's cost is structural: remember the cheapest window seen
            self.draft_floor[src] = min(self.draft_floor.get(src, float("inf")), self.draft_cost[src])

    def _fit_forward_cost(self) -> None:
        """Fit ``t(q) = t1 * (1 + beta * (q - 1))`` to the window: the median time of each
        verify width q, then a least-squares line through those medians (weighted by how
        often each width occurred).  With a single width the two cannot be told apart:
        t1 follows from the last beta, and when that width is 1 (nothing verified in the
        window, so beta is not being measured) beta moves back towards its prior."""
        by_q: dict[int, list[float]] = {}
        for q, t in self.forward_samples:
            by_q.setdefault(q, []).append(t)
        pts = [(q - 1, median(ts), len(ts)) for q, ts in by_q.items()]
        if len(pts) >= 2:
            w = sum(n for _, _, n in pts)
            xm = sum(x * n for x, _, n in pts) / w
            ym = sum(y * n for _, y, n in pts) / w
            sxx = sum(n * (x - xm) ** 2 for x, _, n in pts)
            slope = sum(n * (x - xm) * (y - ym) for x, y, n in pts) / sxx
            t1 = ym - slope * xm
            if t1 > 0:
                self.t1, self.beta = t1, min(max(slope / t1, 0.0), 2.0)
                return
        x, y, _ = pts[0]
        if x == 0:
            self.beta = 0.9 * self.beta + 0.1 * self.prior_beta
        self.t1 = y / (1.0 + self.beta * x)
