"""Budget policies: how many tokens to draft per row and step.

``dynamic`` (the default) is training-free and cost-aware.  Per row it keeps decayed
counts of accepted draft tokens and of rejections, which estimate the per-token
acceptance probability a (a geometric model: a verify of k drafts yields
(1 - a^(k+1)) / (1 - a) tokens).  It learns online, from the step statistics, what a
verify over q tokens costs relative to a plain step (``1 + beta * (q - 1)``) and what
one draft token costs (``d``), and picks the k in 0..max that maximises tokens per unit
of time.  k = 0 means plain decoding: speculation backs off where it does not pay, and
because the counts decay towards a prior it probes again later.

The draft-confidence rule runs inside model drafters: a row's draft stops when the
drafter's peak probability falls below ``min_confidence``.  The policy adapts that
threshold per row over a sliding window of recent verifies: high recent acceptance
lowers it (draft deeper), low acceptance raises it.
"""

from __future__ import annotations

from collections import deque

import torch

from .hookspecs import hookimpl
from .interfaces import Budget, StepContext


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
        if not (isinstance(decay, (int, float)) and 0 < decay < 1):
            raise ValueError(f"decay={decay!r} is invalid: use a number in (0, 1)")
        self.max_draft = max_draft
        self.window = window
        self.base_confidence = min_confidence
        self.beta = self.prior_beta = beta  # verify cost slope per extra token, learned online
        self.prior_draft_cost = draft_cost
        self.decay = decay
        self.t1: float | None = None  # EMA of a plain (q = 1) target forward, seconds
        self.draft_cost: dict[str, float] = {}  # per source: one draft token / plain step
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
        taus = [self.threshold.get(r, self.base_confidence) for r in ctx.row_ids]
        if ctx.deterministic:  # seeded sampling: decide from acceptance only, with the prior costs
            ks = [self.best_k(h.acceptance(), self.prior_draft_cost, self.prior_beta) for h in ctx.history]
            return Budget(torch.tensor(ks, dtype=torch.long, device=ctx.device), torch.tensor(taus, device=ctx.device))
        if self.t1 is None:  # calibrate: one plain step measures what a target forward costs
            return Budget(torch.zeros(B, dtype=torch.long, device=ctx.device), torch.tensor(taus, device=ctx.device))
        cheapest = min(self.draft_cost.values(), default=self.prior_draft_cost)
        ks = [self.best_k(h.acceptance(), cheapest) for h in ctx.history]
        by_source: dict[str, list[int]] = {}
        for src, cost in self.draft_cost.items():
            row_k = []
            for b, rid in enumerate(ctx.row_ids):
                acc, rej = self.per_source.get((rid, src), (0.0, 0.0))
                a = (acc + 0.6 * 2.0) / (acc + rej + 2.0)
                row_k.append(min(ks[b], self.best_k(a, cost)) if ks[b] else 0)
            by_source[src] = row_k
        return Budget(
            max_draft=torch.tensor(ks, dtype=torch.long, device=ctx.device),
            min_confidence=torch.tensor(taus, device=ctx.device),
            by_source=by_source,
        )

    def best_k(self, a: float, draft_cost: float | None = None, beta: float | None = None) -> int:
        """argmax_k E[tokens | k] / cost(k) for acceptance probability ``a``: a verify of k
        drafts yields 1 + a + ... + a^k tokens and costs 1 + (beta + draft_cost) * k steps."""
        d = self.prior_draft_cost if draft_cost is None else draft_cost
        slope = (self.beta if beta is None else beta) + d
        a = min(max(a, 0.0), 0.995)
        best_k, best = 0, 1.0  # k = 0: one token per plain step of cost 1
        gain = 1.0
        term = 1.0
        for k in range(1, self.max_draft + 1):
            term *= a
            gain += term
            cost = 1.0 + slope * k
            if gain / cost > best * 1.02:  # a 2% margin: don't draft for noise-level gains
                best_k, best = k, gain / cost
        return best_k

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        # learn the cost model from what the step measured
        q = event.verify_tokens
        t = event.target_forward_s
        if q == 1:
            self.t1 = t if self.t1 is None else 0.7 * self.t1 + 0.3 * t
        elif self.t1 and q > 1:
            # every step also tells what a plain step costs now (contexts grow, batches shrink),
            # so t1 tracks the current regime instead of going stale between plain steps
            beta = max(0.0, (t / self.t1 - 1.0) / (q - 1))
            self.beta = 0.9 * self.beta + 0.1 * min(beta, 2.0)
            self.t1 = 0.9 * self.t1 + 0.1 * t / (1.0 + self.beta * (q - 1))
        used = {s for s, d in zip(event.sources, event.drafted) if d}
        for src in self.draft_cost:  # unused sources drift back to the prior, so they get probed again
            if src not in used:
                self.draft_cost[src] = 0.97 * self.draft_cost[src] + 0.03 * self.prior_draft_cost
        if self.t1 and len(used) == 1 and event.drafted_max > 0:
            src = used.pop()
            if src not in self.warm:  # a drafter's first step also fills its own cache: not a typical cost
                self.warm.add(src)
                self.draft_cost.setdefault(src, self.prior_draft_cost)
            else:
                # model drafters report their forward time; for model-free drafters the draft stage is the cost
                spent = event.draft_forward_s - event.draft_setup_s if event.draft_forward_s > 0 else event.stage_s.get("draft", 0.0)
                per_token = min(spent / event.drafted_max / self.t1, 3.0)
                self.draft_cost[src] = 0.7 * self.draft_cost.get(src, self.prior_draft_cost) + 0.3 * per_token
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
