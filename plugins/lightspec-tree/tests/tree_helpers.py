"""Helpers for the tree plugin's tests: a small drafter implementing the tree expansion
protocol, and the two-sample chi-square test of the core's sampling tests."""

from __future__ import annotations

import torch


class LookupTreeDrafter:
    """The tree expansion protocol over a full-context model forward (no cache of its own,
    so no ``tree_commit``): the children of a node are the model's distribution after the
    node's path.  ``calls`` counts the protocol calls, ``nodes`` the nodes it was given."""

    name = "lookup_tree_drafter"

    def __init__(self, model):
        self.model = model
        self.calls = {"tree_start": 0, "tree_step": 0}
        self.nodes = 0
        self.events = 0  # step events passed on by the tree strategy

    def lightspec_on_stats(self, event) -> None:
        self.events += event.kind == "step"

    @torch.inference_mode()
    def _next(self, seqs: list[list[int]]) -> torch.Tensor:
        return torch.stack([torch.log_softmax(self.model(input_ids=torch.tensor([s])).logits[0, -1].float(), -1)
                            for s in seqs])

    def tree_start(self, ctx) -> torch.Tensor:
        self.calls["tree_start"] += 1
        self.paths = [[list(seq)] for seq in ctx.sequences]  # per row: the root's context, then each node's
        self.given = [0] * ctx.batch
        return self._next([p[0] for p in self.paths])

    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        self.calls["tree_step"] += 1
        B, F = tokens.shape
        out = []
        for b in range(B):
            for t, p in zip(tokens[b].tolist(), parents[b].tolist()):
                assert -1 <= p < len(self.paths[b]) - 1, f"parent {p} is not a node given so far"
                self.paths[b].append(self.paths[b][p + 1] + [t])
                self.nodes += 1
            out.append(self._next(self.paths[b][-F:]))
        return torch.stack(out)
