"""The acceptance model: how far drafts hold, per row, per drafter and pooled.

A row's own record is ``RowHistory`` (decayed counts of accepted draft tokens and of
rejections, kept by the engine); its per-token acceptance probability a is the geometric
model's estimate ``(accepted + prior * w) / (accepted + rejected + w)``.  This module
keeps what the engine does not:

* per (request, drafter): the same decayed counts, for each drafter's own limit;
* pooled over every row of recent steps (decayed by ``POOL_DECAY`` per step), overall
  (source ``""``) and per drafter: the prior a new row starts from, so that a fresh row
  does not draft on a fixed guess;
* draft availability ("hit rate"): of the steps where a row was offered a draft (k > 0),
  in how many it got one (n-gram lookup finds no match on many rows of some workloads),
  per row and pooled.

Where the constants come from: ``docs/design/budget.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..interfaces import RowHistory

POOL_DECAY = 0.98  # per step: the pooled counts reflect the last ~50 steps
ACCEPTANCE_PRIOR = 0.6  # acceptance before any evidence (weight 2, ``RowHistory.acceptance``)
HIT_PRIOR = 0.9  # draft availability before any evidence


class AcceptanceModel:
    """Decayed acceptance and hit-rate counts.  ``decay`` is the per-step decay of the
    per-row counts (the policy's ``decay`` option), in (0, 1)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.per_source: dict[tuple[int, str], list[float]] = {}  # (request, source) -> [accepted, rejected]
        self.pooled: dict[str, list[float]] = {}  # source ("" = all) -> [accepted, rejected]
        self.hits: dict[int, list[float]] = {}  # request -> [steps with a draft, steps offered]
        self.pooled_hits = [0.0, 0.0]

    def new_generation(self) -> None:
        """Forget the per-request records (request ids restart); pooled counts stay."""
        self.per_source.clear()
        self.hits.clear()

    def pooled_acceptance(self, source: str) -> float:
        """Acceptance pooled over every row of the recent steps (all sources for ""), with
        the fixed prior 0.6 (weight 2) until there is evidence."""
        acc, rej = self.pooled.get(source, (0.0, 0.0))
        return RowHistory(acc, rej).acceptance(prior=ACCEPTANCE_PRIOR)

    def source_acceptance(self, request: int, source: str, prior: float = ACCEPTANCE_PRIOR) -> float:
        """Request ``request``'s acceptance of drafts by ``source``, from ``prior``."""
        return RowHistory(*self.per_source.get((request, source), (0.0, 0.0))).acceptance(prior=prior)

    def pooled_hit_rate(self) -> float:
        """How often rows of recent steps got a draft when offered one (prior 0.9)."""
        # the same estimate as acceptance: successes (a draft) against failures (none)
        hit, offered = self.pooled_hits
        return RowHistory(hit, offered - hit).acceptance(prior=HIT_PRIOR)

    def hit_rate(self, request: int, pooled: float | None = None) -> float:
        """How often this row got a draft when offered one, starting from the rate pooled
        over recent steps (``pooled_hit_rate``, which a caller asking for many rows passes)."""
        if pooled is None:
            pooled = self.pooled_hit_rate()
        hit, offered = self.hits.get(request, (0.0, 0.0))
        return RowHistory(hit, offered - hit).acceptance(prior=pooled)

    def learn(self, event, offered: bool, sources: Iterable[str]) -> None:
        """Count one step.  ``offered``: the policy let the rows draft (k > 0), so a row
        without a draft is a miss; ``sources``: the drafters whose per-request counts are
        kept (each decays on every step, whether it drafted or not)."""
        for counts in self.pooled.values():
            counts[0] *= POOL_DECAY
            counts[1] *= POOL_DECAY
        self.pooled_hits[0] *= POOL_DECAY
        self.pooled_hits[1] *= POOL_DECAY
        decay = self.decay
        # a row is rejected when it accepts less than its draft's depth (a tree's siblings are
        # rejected by design: a tree accepted to its depth counts as a chain accepted in full)
        for rid, src, d, a in zip(event.row_ids, event.sources, event.levels, event.accepted):
            if offered:
                got = 1.0 if d else 0.0
                row = self.hits.setdefault(rid, [0.0, 0.0])
                row[0] = row[0] * decay + got
                row[1] = row[1] * decay + 1.0
                self.pooled_hits[0] += got
                self.pooled_hits[1] += 1.0
            if d:
                for key in ("", src):
                    counts = self.pooled.setdefault(key, [0.0, 0.0])
                    counts[0] += a
                    counts[1] += 1.0 if a < d else 0.0
            for s in sources:
                st = self.per_source.setdefault((rid, s), [0.0, 0.0])
                st[0] *= decay
                st[1] *= decay
                if s == src and d:
                    st[0] += a
                    st[1] += 1.0 if a < d else 0.0
