"""Prompt/suffix lookup drafting (no model): find the latest earlier occurrence of the
context's last n tokens (longest n first) and propose what followed it.

How far to trust a match depends on its length: a single repeated token predicts the
next one far less often than a repeated 4-gram (measured on the zoo target's greedy
outputs: 17-36% against 72-100% for the first drafted token), and a context whose last
16+ tokens all repeat an earlier stretch is usually being copied (on the suite's code
prompts the target went on copying for 16+ more tokens after 84% of such matches, after
2% of single-token ones).  So each match gets a class from how far back the context
agrees with the earlier occurrence (1, 2, 3, 4-7, 8-15 or 16+ tokens, looked up with at
most ``max_ngram`` tokens and then extended backwards), and the drafter keeps, per class
and draft position j, how often the target accepted position j when it reached it
(decayed counts, shared by the rows).  It cuts each draft where the estimated chance
that all of its tokens so far are accepted falls below ``min_accept``.  A one-token match
then proposes a token or two, where a verify slot costs little, and a long copy proposes
up to ``max_draft``.

Drafting costs nothing here, only the verify's width does, and the drafter knows better
than a per-row average how far this particular match will hold.  So it declares a draft
cost of 0 (``draft_cost_hints``), and for a single row the dynamic budget then lets it
draft up to ``max_draft`` whenever speculation is on (see ``budget.py``).

The index is incremental: each row keeps, per n, a dict from n-gram to the position
right after its most recent occurrence, updated with the tokens that arrived since the
last step, so a lookup costs O(max_ngram) dict probes regardless of context length.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..hookspecs import hookimpl
from ..interfaces import DraftProposal, StepContext

PRIOR_WEIGHT = 2.0
STATS_DECAY = 0.98  # per verified draft: the estimates follow roughly the last 50 drafts
MATCH_CLASSES = (1, 2, 3, 4, 8, 16)  # a match's class: the largest of these <= its extended length
MAX_EXTEND = 16  # extending a match backwards stops here (the top class)


def match_class(length: int) -> int:
    """The statistics class of a match whose last ``length`` tokens agree (>= 1)."""
    return max(c for c in MATCH_CLASSES if c <= length)


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4, max_draft: int = 16, min_accept: float = 0.2):
        if not (isinstance(min_ngram, int) and min_ngram >= 1):
            raise ValueError(f"min_ngram={min_ngram!r} is invalid: use an integer >= 1")
        if not (isinstance(max_ngram, int) and max_ngram >= min_ngram):
            raise ValueError(f"max_ngram={max_ngram!r} is invalid: use an integer >= min_ngram ({min_ngram})")
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(min_accept, (int, float)) and not isinstance(min_accept, bool) and 0 <= min_accept < 1):
            raise ValueError(f"min_accept={min_accept!r} is invalid: use a number in [0, 1)")
        self.min_ngram, self.max_ngram, self.max_draft = min_ngram, max_ngram, max_draft
        self.min_accept = float(min_accept)
        self.indexes: dict[int, _RowIndex] = {}
        # per match class: decayed counts of drafts that reached position j and of those
        # the target accepted there (j = 0 .. max_draft - 1); kept across requests
        self.reached = {c: [0.0] * max_draft for c in MATCH_CLASSES}
        self.taken = {c: [0.0] * max_draft for c in MATCH_CLASSES}
        self.pending: dict[int, tuple[int, int]] = {}  # request -> (match class, tokens drafted) of its last draft
        self._estimate_cache: dict[tuple[int, bool], tuple[list[float], list[float]]] = {}

    def reset(self) -> None:
        self.indexes = {}
        self.pending = {}

    def acceptance(self, n: int, j: int) -> float:
        """Estimated chance that the target accepts draft position j (0-based) of a match of
        class n (``match_class``), given it accepted the ones before: the decayed counts
        with a prior of weight 2 (0.7 for matches of 2+ tokens, 0.4 for single tokens)."""
        prior = 0.7 if n >= 2 else 0.4
        return (self.taken[n][j] + PRIOR_WEIGHT * prior) / (self.reached[n][j] + PRIOR_WEIGHT)

    def _cut(self, n: int, draft: list[int], learned: bool = True) -> list[int]:
        """The longest prefix of ``draft`` whose estimated chance of full acceptance stays
        at least ``min_accept`` (``learned=False``: from the priors alone)."""
        p = 1.0
        for j in range(len(draft)):
            p *= self.acceptance(n, j) if learned else (0.7 if n >= 2 else 0.4)
            if p < self.min_accept:
                return draft[:j]
        return draft

    def draft_cost_hints(self) -> dict[str, float]:
        return {self.name: 0.0}  # a dictionary lookup: no model forward

    @hookimpl
    def lightspec_propose(self, ctx: StepContext) -> DraftProposal | None:
        B = ctx.batch
        drafts: list[list[int]] = []
        classes: list[int] = []  # each row's match class (1 for rows without a match)
        # a cascade's earlier drafts, as Python lists (one device sync for the batch)
        prefixes = ([p[:n] for p, n in zip(ctx.prefix.tolist(), ctx.prefix_lengths.tolist())]
                    if ctx.prefix is not None else [[]] * B)
        # a lookup costs nothing: take the budget's looser limit for model-free drafters
        free = ctx.free_max_draft_list
        for b in range(B):
            if free is None:
                limit = min(ctx.max_draft_list[b], self.max_draft)
            else:  # the free limit counts the whole draft, a cascade's prefix included
                limit = min(max(ctx.max_draft_list[b], free[b] - len(prefixes[b])), self.max_draft)
            seq = tuple(ctx.sequences[b]) + tuple(prefixes[b]) if prefixes[b] else ctx.sequences[b]
            if limit <= 0:
                drafts.append([])
                classes.append(1)
                continue
            rid = ctx.row_ids[b]
            index = self.indexes.get(rid)
            if index is None:
                index = self.indexes[rid] = _RowIndex(self.min_ngram, self.max_ngram)
            n, draft = index.lookup(seq, limit, committed=len(ctx.sequences[b]))
            # seeded requests must not depend on what other requests taught the counts
            draft = self._cut(n, draft, learned=not ctx.deterministic) if draft else draft
            if draft:
                self.pending[rid] = (n, len(draft))
            drafts.append(draft)
            classes.append(n or 1)
        k = max(len(d) for d in drafts)
        if k == 0:
            return None
        tokens = torch.tensor([d + [0] * (k - len(d)) for d in drafts], dtype=torch.long, device=ctx.device)
        lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long, device=ctx.device)
        # confidence: the estimated chance that the target accepts each node given the ones
        # before; entropy: that estimate's binary entropy (a lookup has no distribution of its own)
        rows = [self._estimates(c, ctx.deterministic) for c in classes]
        both = torch.tensor([[r[0][:k] for r in rows], [r[1][:k] for r in rows]], device=ctx.device)  # [2, B, k]
        return DraftProposal(tokens=tokens, lengths=lengths, source=self.name, confidence=both[0], entropy=both[1])

    def _estimates(self, n: int, prior_only: bool) -> tuple[list[float], list[float]]:
        """Per draft position of a class-``n`` match: (the estimated acceptance, its binary
        entropy), kept until the counts change (``lightspec_on_stats``)."""
        key = (n, prior_only)
        cached = self._estimate_cache.get(key)
        if cached is None:
            conf = [(0.7 if n >= 2 else 0.4) if prior_only else self.acceptance(n, j) for j in range(self.max_draft)]
            ent = [-(a * math.log(a) + (1 - a) * math.log(1 - a)) for a in conf]
            cached = self._estimate_cache[key] = (conf, ent)
        return cached

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        """Learn per-(match class, position) acceptance from the verified drafts."""
        if getattr(event, "kind", None) != "step":
            return
        for rid, src, d, a in zip(event.row_ids, event.sources, event.drafted, event.accepted):
            last = self.pending.pop(rid, None)
            if last is None or not d or not src.startswith(self.name):
                continue
            n, mine = last
            mine = min(mine, d)  # a cascade may have extended the draft after ours
            reached, taken = self.reached[n], self.taken[n]
            for j in range(self.max_draft):
                reached[j] *= STATS_DECAY
                taken[j] *= STATS_DECAY
            self._estimate_cache.pop((n, False), None)
            for j in range(min(mine, a + 1)):
                reached[j] += 1.0
                taken[j] += 1.0 if j < a else 0.0


class _RowIndex:
    """n-gram → position after its latest occurrence, for one sequence."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.maps = {n: {} for n in range(min_n, max_n + 1)}
        self.indexed = 0  # n-grams ending before this position are in the maps

    def lookup(self, seq: Sequence[int], limit: int, committed: int) -> tuple[int, list[int]]:
        """Draft up to ``limit`` tokens after ``seq``; only its first ``committed`` tokens
        (the ones the target accepted) are added to the index.  Returns (the match's class,
        from the n-gram found extended backwards up to ``MAX_EXTEND`` tokens, the draft),
        (0, []) without a match."""
        L = len(seq)
        # index the n-grams followed by a committed token; the suffix itself is not indexed yet
        upto = min(L, committed)
        for end in range(max(self.indexed, self.min_n), upto):
            for n, m in self.maps.items():
                if end >= n:
                    m[tuple(seq[end - n : end])] = end
        self.indexed = max(self.indexed, upto)
        for n in range(self.max_n, self.min_n - 1, -1):
            if L < n:
                continue
            key = tuple(seq[L - n :])
            pos = self.maps[n].get(key)
            if pos is not None and pos < L:
                length = n  # how far back the context agrees with this occurrence
                while length < MAX_EXTEND and pos - length - 1 >= 0 and seq[pos - length - 1] == seq[L - length - 1]:
                    length += 1
                return match_class(length), list(seq[pos : pos + limit])
        return 0, []
