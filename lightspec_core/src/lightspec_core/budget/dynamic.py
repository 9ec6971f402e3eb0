"""``dynamic``: the default budget policy, training-free and cost-aware.

Per decision it estimates each row's per-token acceptance a (``AcceptanceModel``; a
verify of k drafts then yields 1 + a + ... + a^k tokens) and how often the row gets a
draft at all, prices a step (``CostModel``: verify ``1 + beta * (q - 1)``, drafting
``f + d * k``, catch-up, overhead, scaled by the guard's ``cost_scale``) and picks the
k in 0..max_draft that maximises the batch's tokens per unit of time (``best_k``); k = 0
is plain decoding.  A batch shares one k (every row waits for the widest verify) and
needs a modelled gain of at least its kind's margin; one row needs 2%.

Plain steps the policy takes on its own, each with its ``Budget.reason``:

* ``"calibrating"``: a batch size seen for the first time is measured by plain steps
  (``BATCH_CALIBRATION`` for a batch, one for a single row);
* ``"refresh"``: a batch that speculated ``PLAIN_REFRESH`` steps in a row takes one plain
  step to renew the plain forward its costs are measured against;
* ``"hold"``: the throughput guard saw speculation lose (``ThroughputGuard``);
* ``"hold_free"``: a single row whose strategy mixes model-free and model drafters has a
  guard over the model drafters' steps alone; while it holds, the free drafters draft and
  the model drafters do not;
* ``"recheck"``: a batch that chose k = 0 decides again only after ``RECHECK`` more plain
  steps, doubling up to ``MAX_RECHECK`` while it keeps choosing 0; so does a single row
  whose strategy has only model drafters and that does not explore (a model-free drafter
  costs a row nothing when it finds no draft, and waiting lost n-gram lookup its matches).
  The statistics of those plain steps are learned together when the next decision needs
  them (``lightspec_on_stats`` defers them), which leaves every estimate as it would be
  had each been learned at its step.

One speculative step it may take on its own: ``"explore"`` (option ``explore_after``, off by
default; ``EXPLORE_AFTER`` is the value tried): a single row whose model chose k = 0 for
``explore_after`` decisions in a row drafts one token, so that the acceptance and
costs the model decides from are measured again (a k = 0 decision measures neither: without
it a drafter judged too slow once, e.g. on another kind of prompt or while the machine was
busy, would never draft again).  The interval doubles up to ``MAX_EXPLORE_AFTER`` while the
model keeps choosing 0 after it, and is reset when the model chooses to draft.

Otherwise the reason is ``"model"`` (the cost model's k, 0 included), ``"probe"`` (a
batch size whose verify was never measured drafts one token, which measures it) or
``"seeded"`` (every request seeded: each row's k from its own acceptance and timing-free
costs, so that the output does not depend on timing or on the other rows).

The confidence gate (``ConfidenceGate``) sets each row's ``min_confidence``.  For a
single row that speculates, model-free drafters may draft up to ``free_max_draft``.
The measurements behind these rules: ``docs/design/budget.md``.
"""

from __future__ import annotations

import torch

from ..hookspecs import hookimpl
from ..interfaces import Budget, StepContext
from .acceptance import AcceptanceModel
from .costs import CostModel
from .gate import ConfidenceGate
from .guard import ThroughputGuard
from .tensors import TensorCache

RECHECK = 2  # plain steps before a batch that chose k = 0 decides again ...
MAX_RECHECK = 8  # ... doubling up to this many while it keeps choosing 0
BATCH_CALIBRATION = 3  # plain steps that calibrate a batch size seen for the first time
PLAIN_REFRESH = 32  # speculative steps in a row after which a batch takes one plain step
SINGLE_ROW_MARGIN = 1.02  # one row drafts for a modelled gain of at least 2%
EXPLORE_AFTER = 64  # explore_after as measured: k = 0 decisions in a row before one exploratory draft ...
MAX_EXPLORE_AFTER = 1024  # ... doubling up to this many while the model keeps choosing 0


class DynamicBudget:
    """Cost-aware draft length from online acceptance, plus an adaptive confidence gate.

    Components (each in its own module): ``acceptance`` (``AcceptanceModel``), ``cost``
    (``CostModel``: ``t1``, ``beta``, draft costs), ``guard`` (``ThroughputGuard``: hold,
    cost scale, margin) and ``gate`` (``ConfidenceGate``)."""

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
        explore_after: int = 0,
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
        if not (isinstance(explore_after, int) and not isinstance(explore_after, bool) and explore_after >= 0):
            raise ValueError(f"explore_after={explore_after!r} is invalid: use an integer >= 0 (0: never explore)")
        self.max_draft = max_draft
        self.free_max_draft = free_max_draft
        self.first_explore = explore_after
        self.base_confidence = min_confidence
        self.prior_beta = beta
        self.prior_draft_cost = draft_cost
        self.batch_margin = float(batch_margin)
        self.acceptance = AcceptanceModel(decay)
        self.cost = CostModel(beta, draft_cost)
        self.guard = ThroughputGuard(self.cost, guard, batch_margin)
        self.gate = ConfidenceGate(window, min_confidence)
        self.recheck = 0  # plain steps left before a batch decides again (RECHECK)
        self.recheck_rows = 0  # ... of that many rows
        self.recheck_every = RECHECK  # the interval, doubling while the batch keeps choosing k = 0
        self.deterministic = False  # the current generation's requests are all seeded
        # the sources whose per-request acceptance seeded rows learn: the strategy's structural
        # ones (draft_cost_hints), known from the first step, not the ones with a measured
        # cost so far (those depend on what ran before and on the batch's other rows)
        self.hint_sources: tuple[str, ...] = ()
        self.fresh = True  # no decision yet in this generation
        self.last_k = 0  # the last decision's k (0 for plain and seeded steps)
        self.idle = 0  # a single row's k = 0 model decisions in a row (explore_after)
        self.explore_after = explore_after
        self._tensors = TensorCache()
        self._plain_budgets: dict[tuple, Budget] = {}
        self.rechecking = False  # the last decision was a recheck step: its statistics wait
        self.deferred: list = []  # the recheck steps' events, learned at the next decision

    def learn_deferred(self) -> None:
        """Learn the recheck steps' events (a decision other than a recheck step, and
        ``reset``, call this first)."""
        self.rechecking = False
        if self.deferred:
            events, self.deferred = self.deferred, []
            for event in events:
                self._learn(event)

    def reset(self) -> None:
        """A generation ended (the engine calls this before each ``generate`` run)."""
        self.learn_deferred()
        self.guard.reset()
        self.cost.new_generation()
        self.acceptance.new_generation()
        self.gate.new_generation()
        self.recheck = self.recheck_rows = 0
        self.recheck_every = RECHECK
        self.fresh = True
        self.last_k = 0

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        B = ctx.batch
        if not (self.rechecking and self.recheck > 0 and self.recheck_rows == B and not ctx.deterministic):
            # a recheck step reads nothing the deferred plain steps change (they set no hold,
            # calibrate nothing new and keep the plain forward fresh): the rest learn them first
            self.learn_deferred()
        self.deterministic = ctx.deterministic
        hints = ctx.draft_cost_hints or {}
        self.hint_sources = tuple(hints)
        free = [s for s, h in hints.items() if h == 0]
        self.guard.mixed = B == 1 and 0 < len(free) < len(hints)  # free and model drafters: two guards
        if ctx.deterministic:
            return self._reproducible(ctx, self._thresholds(ctx))
        self.last_k = 0
        cost, guard = self.cost, self.guard
        if self.fresh:  # a new generation: start held where this kind of batch has been losing
            self.fresh = False
            cost.greedy = ctx.sampling.greedy
            guard.start_generation((B > 1, ctx.sampling.greedy))
        key = cost.key(B)
        plain = cost.plain_forwards.get(key)
        if plain is None or (B > 1 and len(plain) < BATCH_CALIBRATION):
            return self._plain(B, ctx.device, "calibrating")
        if B > 1 and cost.plain_age.get(key, 0) >= PLAIN_REFRESH:
            return self._plain(B, ctx.device, "refresh")
        if guard.hold > 0:
            guard.hold -= 1
            return self._plain(B, ctx.device, "hold")
        if guard.mixed and guard.model_hold > 0 and self.free_max_draft >= 1:
            guard.model_hold -= 1
            return self._hold_free(ctx, free)
        if self.recheck > 0 and self.recheck_rows == B:
            self.recheck -= 1
            self.rechecking = True
            return self._plain(B, ctx.device, "recheck")
        cost.use_fit(key)
        acceptance = self.acceptance
        pooled = acceptance.pooled_acceptance("")
        accs = [h.acceptance(prior=pooled) for h in ctx.history]
        pooled_hit = acceptance.pooled_hit_rate()
        hits = [acceptance.hit_rate(rid, pooled_hit) for rid in ctx.row_ids]
        # the cheapest drafter (by the cost of a one-token draft) decides whether to draft at all
        costs, fixeds = cost.draft_cost, cost.draft_fixed
        cheapest = min(costs, key=lambda s: fixeds.get(s, 0.0) + costs[s], default=None)
        # a batch prices a drafter it has not measured by its structural estimate (prior_cost)
        cost.hints = (ctx.draft_cost_hints or {}) if B > 1 else {}
        d = min(cost.hints.values(), default=self.prior_draft_cost) if cheapest is None else costs[cheapest]
        f = 0.0 if cheapest is None else fixeds.get(cheapest, 0.0)
        catch_up = 0.0 if cheapest is None else cost.catch_up(cheapest)
        scale = guard.scale()
        margin = guard.current_margin() if B > 1 else None
        extra = cost.extra_costs(cheapest, B, self.max_draft, d, f)
        k, rate = self._search(accs, d, None, cost.spec_overhead + catch_up, hits, scale, margin, extra)
        reason = "model"
        if k > 1 and B > 1 and key not in cost.verified_beta:
            # a batch size whose verify was never measured borrows its beta: probe with the
            # narrowest verify, which measures it
            k, reason = 1, "probe"
        if B == 1:
            k, reason = self._explore(k, reason)
        self.last_k = k
        if k == 0 and (B > 1 or (reason == "model" and not self.first_explore and not free)):
            again = self.recheck_rows == B  # it chose plain decoding at its last decision too
            self.recheck_every = min(2 * self.recheck_every, MAX_RECHECK) if again else RECHECK
            self.recheck, self.recheck_rows = self.recheck_every, B
        elif k:
            self.recheck_rows = 0
        estimates = {"acceptance": pooled, "hit_rate": pooled_hit, "t1": cost.t1, "beta": cost.beta, "draft_cost": d}
        if reason == "model":
            estimates["gain"] = rate / B  # modelled tokens per row per plain step's time
        if k == 0:
            plain_budget = self._plain(B, ctx.device, reason)
            return Budget(plain_budget.max_draft, plain_budget.min_confidence, reason=reason, estimates=estimates)
        by_source: dict[str, list[int]] = {}
        if len(costs) > 1 and reason != "explore":  # per-source limits matter between several drafters
            for src, c in costs.items():
                prior = acceptance.pooled_acceptance(src)
                src_accs = [acceptance.source_acceptance(rid, src, prior) for rid in ctx.row_ids]
                extra = cost.extra_costs(src, B, self.max_draft, c, fixeds.get(src, 0.0))
                fixed = cost.spec_overhead + cost.catch_up(src)
                by_source[src] = [min(k, self.best_k(src_accs, c, fixed=fixed, hits=hits, scale=scale, margin=margin,
                                                     extra=extra))] * B
        # one row lets model-free drafters (n-gram lookup) size their own drafts: k is the
        # row's average, the lookup knows its match.  A batch keeps k (the widest verify).
        free_limit = [max(k, self.free_max_draft)] if B == 1 and self.free_max_draft > k else None
        return Budget(self._tensors.get((k,) * B, ctx.device), self._thresholds(ctx), by_source=by_source,
                      free_max_draft=free_limit, reason=reason, estimates=estimates)

    def _hold_free(self, ctx: StepContext, free: list[str]) -> Budget:
        """A step the model drafters' guard holds (a single row whose strategy combines
        model-free drafters, draft cost hint 0 such as n-gram lookup, with model drafters):
        the model drafters are capped at 0 by source and the free ones draft up to
        ``free_max_draft`` (``"hold_free"``; docs/design/budget.md, "Guard")."""
        by_source = {s: [0] for s in (ctx.draft_cost_hints or {}) if s not in free}
        return Budget(self._tensors.get((self.free_max_draft,), ctx.device), self._thresholds(ctx),
                      by_source=by_source, free_max_draft=[self.free_max_draft], reason="hold_free")

    def _explore(self, k: int, reason: str) -> tuple[int, str]:
        """A single row's model decision, or one exploratory 1-token draft after ``explore_after``
        decisions of k = 0 in a row (module docstring)."""
        if k > 0:
            self.idle, self.explore_after = 0, self.first_explore
            return k, reason
        self.idle += 1
        if not self.first_explore or self.idle < self.explore_after:
            return k, reason
        self.idle, self.explore_after = 0, max(self.explore_after, min(2 * self.explore_after, MAX_EXPLORE_AFTER))
        return 1, "explore"

    def best_k(self, accs: list[float] | float, draft_cost: float | None = None, beta: float | None = None,
               fixed: float = 0.0, hits: list[float] | None = None, scale: float = 1.0,
               margin: float | None = None, extra: list[float] | None = None) -> int:
        """One draft length for the batch: argmax_k (sum over rows of E[tokens | k]) / cost(k).

        Row b with acceptance probability a_b yields 1 + a_b + ... + a_b^k tokens from a
        verify of k drafts, or 1 when it gets no draft (``hits[b]``: how often it gets one);
        the step costs ``scale * (1 + fixed + (beta + draft_cost) * k)`` plain steps for the
        whole batch when any row gets a draft, and 1 when none does; ``extra[k - 1]``, when
        given (``CostModel.extra_costs``), replaces ``(beta + draft_cost) * k`` there.  k = 0
        yields one token per row at cost 1.  A k must beat the best so far by ``margin`` (default: 2%
        for one row, ``batch_margin`` for a batch).  ``draft_cost`` and ``beta`` default
        to the prior draft cost and the cost model's current beta."""
        if isinstance(accs, (int, float)):
            accs = [accs]
        return self._search(accs, draft_cost, beta, fixed, hits, scale, margin, extra)[0]

    def _search(self, accs: list[float], draft_cost: float | None, beta: float | None, fixed: float,
                hits: list[float] | None, scale: float, margin: float | None,
                extra: list[float] | None = None) -> tuple[int, float]:
        """``best_k``'s search: (k, its modelled tokens per plain step's time, summed over rows)."""
        if extra is None:
            d = self.prior_draft_cost if draft_cost is None else draft_cost
            slope = (self.cost.beta if beta is None else beta) + d
            extra = [slope * k for k in range(1, self.max_draft + 1)]
        accs = [min(max(a, 0.0), 0.995) for a in accs]
        hits = [1.0] * len(accs) if hits is None else hits
        n = float(len(accs))
        # the verify is only wider than a plain step when some row gets a draft
        p_any = 1.0
        for h in hits:
            p_any *= 1.0 - min(max(h, 0.0), 1.0)
        p_any = 1.0 - p_any
        if margin is None:
            margin = SINGLE_ROW_MARGIN if len(accs) == 1 else self.batch_margin
        # no k can win when even endless drafts (a + a^2 + ... = a / (1 - a) per row) at the
        # cheapest speculative step stay below the margin: found in one pass
        cheapest = 1.0 - p_any + p_any * scale * (1.0 + fixed + min(extra))
        ceiling = n + sum(h * a / (1.0 - a) for h, a in zip(hits, accs))
        if ceiling / cheapest <= n * margin:
            return 0, n
        best_k, best = 0, n
        terms = [1.0] * len(accs)
        gain = n
        for k in range(1, self.max_draft + 1):
            for i, a in enumerate(accs):
                terms[i] *= a
                gain += hits[i] * terms[i]
            rate = gain / (1.0 - p_any + p_any * scale * (1.0 + fixed + extra[k - 1]))
            if rate > best * margin:
                best_k, best = k, rate
        return best_k, best

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        if self.rechecking and event.drafted_max == 0:
            # learned with the next decision, when the caches are warm from the first of them:
            # each step's learning right after a forward cost ~0.1 ms at batch 1 on the CPU
            self.deferred.append(event)
            return
        self._learn(event)

    def _learn(self, event) -> None:
        self.cost.learn(event)
        self.guard.track(event, self.deterministic)
        self.guard.check(event)
        self.acceptance.learn(event, self.last_k > 0, self.hint_sources if self.deterministic else self.cost.draft_cost)
        self.gate.learn(event)

    def _thresholds(self, ctx: StepContext) -> torch.Tensor:
        """Each row's confidence threshold, ``[B]`` float32."""
        return self._tensors.get(self.gate.thresholds(ctx.row_ids), ctx.device)

    def _plain(self, rows: int, device, reason: str) -> Budget:
        """No drafting this step (the thresholds are then unused: the base one for every
        row).  One object per batch size and reason, reused (read-only, like its tensors)."""
        key = (rows, device, reason)
        b = self._plain_budgets.get(key)
        if b is None:
            b = self._plain_budgets[key] = Budget(self._tensors.get((0,) * rows, device),
                                                  self._tensors.get((float(self.base_confidence),) * rows, device),
                                                  reason=reason)
        return b

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
                by_source[src] = [min(k, self.best_k(self.acceptance.source_acceptance(rid, src), cost, self.prior_beta))
                                  for k, rid in zip(ks, ctx.row_ids)]
        return Budget(torch.tensor(ks, dtype=torch.long, device=ctx.device), taus, by_source=by_source,
                      reason="seeded", estimates={"beta": self.prior_beta, "draft_cost": cheapest})
