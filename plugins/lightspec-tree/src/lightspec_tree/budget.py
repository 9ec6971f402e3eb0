"""The ``tree`` budget policy: a node budget for token trees, and plain decoding where
speculation measured slower (docs/design/tree.md).

The core's ``dynamic`` budget prices a draft as a chain: k nodes, per-token acceptance.
A tree spends most of its nodes on siblings that are rejected by design, so that model
shrinks a tree below the size at which it pays.  This policy gives every row the tree's
whole node budget (``max_nodes``), within a verify width of ``2 * max_nodes`` slots for the
whole batch (at batch 8: 4 nodes a row; on a CPU a verify costs about what a forward over
that many tokens costs), and leaves the shape (depth, width, or a chain) to the tree
strategy's shaper, which measures each shape's acceptance and cost.  It checks one
thing itself: that speculating beats plain decoding.  Every ``probe_every`` speculative
steps it runs one plain step per batch size to measure plain decoding (tokens per
second of the whole batch), and while speculation's measured tokens per second stay below
plain's for ``patience`` steps it decodes plainly for ``hold`` steps, twice as long after
each hold that speculation lost again (up to 16 times ``hold``; reset when it wins).  Seeded
runs (every request seeded: decisions must not depend on timings) always draft.
"""

from __future__ import annotations

import torch

from lightspec_core import Budget, hookimpl


class TreeBudget:
    """``max_nodes`` draft nodes per row, or 0 while speculation measures slower than plain
    decoding (module docstring).  ``Budget.reason``: ``"tree"``, ``"probe"`` or ``"hold"``."""

    name = "tree"

    def __init__(self, max_nodes: int = 16, probe_every: int = 32, patience: int = 4, hold: int = 32,
                 decay: float = 0.8):
        for key, v in (("max_nodes", max_nodes), ("probe_every", probe_every), ("patience", patience), ("hold", hold)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{key}={v!r} is invalid: use an integer >= 1")
        if not (isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 <= decay < 1):
            raise ValueError(f"decay={decay!r} is invalid: use a number in [0, 1)")
        self.max_nodes, self.probe_every, self.patience, self.hold, self.decay = max_nodes, probe_every, patience, hold, decay
        self.forget()

    def reset(self) -> None:
        """A new ``generate()``: the measurements and a running hold are about the machine,
        not the requests, so they are kept."""

    def forget(self) -> None:
        """Drop every measurement."""
        self.plain: dict[int, float] = {}  # batch size -> EWMA tokens/s of plain steps
        self.spec: dict[int, float] = {}  # batch size -> EWMA tokens/s of speculative steps
        self.since_probe = 0
        self.slow = 0  # speculative steps in a row measured slower than plain
        self.holding = 0  # plain steps left in a hold
        self.backoff = 1  # the next hold lasts hold * backoff steps

    @hookimpl
    def lightspec_budget(self, ctx) -> Budget:
        B = ctx.batch
        k, reason = min(self.max_nodes, max(1, 2 * self.max_nodes // B)), "tree"
        if not ctx.deterministic:
            if self.holding > 0:
                self.holding -= 1
                k, reason = 0, "hold"
            elif B not in self.plain or self.since_probe >= self.probe_every:
                self.since_probe = 0
                k, reason = 0, "probe"
            else:
                self.since_probe += 1
        est = {"plain_tok_s": self.plain.get(B, 0.0), "spec_tok_s": self.spec.get(B, 0.0)}
        return Budget(max_draft=torch.full((B,), k, dtype=torch.long, device=ctx.device),
                      min_confidence=torch.zeros(B, device=ctx.device), reason=reason, estimates=est)

    def _ewma(self, table: dict[int, float], key: int, value: float) -> float:
        table[key] = value if key not in table else self.decay * table[key] + (1 - self.decay) * value
        return table[key]

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if getattr(event, "kind", None) != "step" or event.failure or event.step_time_s <= 0:
            return
        B = len(event.row_ids)
        rate = sum(event.emitted) / event.step_time_s
        if sum(event.drafted) == 0:
            self._ewma(self.plain, B, rate)
            return
        spec = self._ewma(self.spec, B, rate)
        if B not in self.plain:
            return
        if spec >= self.plain[B]:
            self.slow, self.backoff = 0, 1
            return
        self.slow += 1
        if self.slow >= self.patience:
            self.slow, self.holding = 0, self.hold * self.backoff
            self.backoff = min(2 * self.backoff, 16)
            self.spec.pop(B)  # after the hold speculation is measured afresh
