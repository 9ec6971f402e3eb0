"""Prompt/suffix lookup drafting (no model): find the latest earlier occurrence of the
context's last n tokens (longest n first) and propose what followed it.

The index is incremental: each row keeps, per n, a dict from n-gram to the position
right after its most recent occurrence, updated with the tokens that arrived since the
last step, so a lookup costs O(max_ngram) dict probes regardless of context length.
"""

from __future__ import annotations

import torch

from ..hookspecs import hookimpl
from ..interfaces import DraftProposal, StepContext


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4, max_draft: int = 8):
        if not (isinstance(min_ngram, int) and min_ngram >= 1):
            raise ValueError(f"min_ngram={min_ngram!r} is invalid: use an integer >= 1")
        if not (isinstance(max_ngram, int) and max_ngram >= min_ngram):
            raise ValueError(f"max_ngram={max_ngram!r} is invalid: use an integer >= min_ngram ({min_ngram})")
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        self.min_ngram, self.max_ngram, self.max_draft = min_ngram, max_ngram, max_draft
        self.indexes: dict[int, _RowIndex] = {}

    def reset(self) -> None:
        self.indexes = {}

    def draft_cost_hints(self) -> dict[str, float]:
        return {self.name: 0.0}  # a dictionary lookup: no model forward

    @hookimpl
    def lightspec_propose(self, ctx: StepContext) -> DraftProposal | None:
        B = ctx.batch
        drafts: list[list[int]] = []
        for b in range(B):
            limit = min(ctx.max_draft_list[b], self.max_draft)
            seq = ctx.sequences[b]
            if ctx.prefix is not None and int(ctx.prefix_lengths[b]) > 0:
                seq = seq + ctx.prefix[b, : int(ctx.prefix_lengths[b])].tolist()
            if limit <= 0:
                drafts.append([])
                continue
            rid = ctx.row_ids[b]
            index = self.indexes.get(rid)
            if index is None:
                index = self.indexes[rid] = _RowIndex(self.min_ngram, self.max_ngram)
            drafts.append(index.lookup(seq, limit, committed=len(ctx.sequences[b])))
        k = max(len(d) for d in drafts)
        if k == 0:
            return None
        tokens = torch.zeros(B, k, dtype=torch.long)
        for b, d in enumerate(drafts):
            if d:
                tokens[b, : len(d)] = torch.tensor(d)
        lengths = torch.tensor([len(d) for d in drafts])
        return DraftProposal(tokens=tokens.to(ctx.device), lengths=lengths.to(ctx.device), source=self.name)


class _RowIndex:
    """n-gram → position after its latest occurrence, for one sequence."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.maps = {n: {} for n in range(min_n, max_n + 1)}
        self.indexed = 0  # n-grams ending before this position are in the maps

    def lookup(self, seq: list[int], limit: int, committed: int) -> list[int]:
        """Draft up to ``limit`` tokens after ``seq``; only its first ``committed`` tokens
        (the ones the target accepted) are added to the index."""
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
                return seq[pos : pos + limit]
        return []
