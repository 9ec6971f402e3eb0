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
    ):
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"window={window!r} is invalid: use an integer >= 1")
        if not 0 <= min_confidence < 1:
            raise ValueError(f"min_confidence={min_confidence!r} is invalid: use a number in [0, 1)")
        self.max_draft = max_draft
        self.window = window
        self.base_confidence = min_confidence
        self.beta = beta  # verify cost slope per extra token, learned online
        self.draft_cost = draft_cost  # cost of one draft token relative to a plain step, learned online
        self.t1: float | None = None  # EMA of a plain (q = 1) target forward, seconds
        self.recent: dict[int, deque] = {}
        self.threshold: dict[int, float] = {}

    def reset(self) -> None:
        self.recent.clear()
        self.threshold.clear()

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        ks, taus = [], []
        for b, hist in enumerate(ctx.history):
            a = hist.acceptance()
            ks.append(self.best_k(a))
            taus.append(self.threshold.get(ctx.row_ids[b], self.base_confidence))
        return Budget(
            max_draft=torch.tensor(ks, dtype=torch.long, device=ctx.device),
            min_confidence=torch.tensor(taus, device=ctx.device),
        )

    def best_k(self, a: float) -> int:
        """argmax_k E[tokens | k] / cost(k) for acceptance probability ``a``."""
        a = min(max(a, 0.0), 0.995)
        best_k, best = 0, 1.0  # k = 0: one token per plain step of cost 1
        gain = 1.0
        term = 1.0
        for k in range(1, self.max_draft + 1):
            term *= a
            gain += term  # 1 + a + ... + a^k
            cost = 1.0 + self.beta * k + self.draft_cost * k
            if gain / cost > best:
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
            self.t1 = t if self.t1 is None else 0.9 * self.t1 + 0.1 * t
        elif self.t1 and q > 1:
            beta = max(0.0, (t / self.t1 - 1.0) / (q - 1))
            self.beta = 0.9 * self.beta + 0.1 * min(beta, 2.0)
        if self.t1 and event.drafted_total > 0 and event.draft_forward_s > 0:
            per_token = event.draft_forward_s / max(event.drafted_max, 1) / self.t1
            self.draft_cost = 0.9 * self.draft_cost + 0.1 * min(per_token, 5.0)
        # slide each row's window of acceptance and move its confidence threshold
        for rid, d, a in zip(event.row_ids, event.drafted, event.accepted):
            if d == 0:
                continue
            win = self.recent.setdefault(rid, deque(maxlen=self.window))
            win.append(a / d)
            rate = sum(win) / len(win)
            tau = self.threshold.get(rid, self.base_confidence)
            if rate > 0.8:
                tau = max(0.05, tau - 0.05)
            elif rate < 0.5:
                tau = min(0.9, tau + 0.05)
            self.threshold[rid] = tau
