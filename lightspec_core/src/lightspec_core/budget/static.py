"""``static``: always draft ``k`` tokens per row (the comparison baseline)."""

from __future__ import annotations

import torch

from ..hookspecs import hookimpl
from ..interfaces import Budget, StepContext


class StaticBudget:
    """Always draft ``k`` tokens per row, with no confidence stop (``min_confidence`` 0).
    ``Budget.reason`` is ``"static"``, ``Budget.estimates`` ``{"k": k}``."""

    name = "static"

    def __init__(self, k: int = 4):
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise ValueError(f"k={k!r} is invalid: use an integer >= 0")
        self.k = k
        self._estimates = {"k": float(k)}

    @hookimpl
    def lightspec_budget(self, ctx: StepContext) -> Budget:
        B = ctx.batch
        return Budget(
            max_draft=torch.full((B,), self.k, dtype=torch.long, device=ctx.device),
            min_confidence=torch.zeros(B, device=ctx.device),
            reason="static",
            estimates=self._estimates,
        )
