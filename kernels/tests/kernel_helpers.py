"""Shared test helpers: random inputs and output poisoning."""

from __future__ import annotations

import torch

SENTINEL_INT = -7777


def poison_empty(monkeypatch, bool_value: bool = True) -> None:
    """Make every torch.empty / torch.empty_like return sentinel-filled memory.

    Outputs that a kernel forgets to write then hold NaN / -7777 / ``bool_value``
    instead of whatever happened to be in memory, and the comparison fails.
    """
    real_empty = torch.empty

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bool:
            t.fill_(bool_value)
        elif t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int8, torch.uint8):
            t.fill_(77)
        else:
            t.fill_(SENTINEL_INT)
        return t

    def empty(*args, **kwargs):
        return fill(real_empty(*args, **kwargs))

    monkeypatch.setattr(torch, "empty", empty)


def random_parents(B: int, N: int, gen: torch.Generator, pad: bool = True) -> torch.Tensor:
    """Random valid trees [B, N]: node 0 root, parent < index, ragged (trailing padding -1)."""
    parents = torch.full((B, N), -1, dtype=torch.long)
    for b in range(B):
        n = int(torch.randint(1, N + 1, (), generator=gen)) if pad else N
        for j in range(1, n):
            # bias towards recent nodes to get deep trees as well as wide ones
            lo = max(0, j - 4) if torch.rand((), generator=gen) < 0.5 else 0
            parents[b, j] = int(torch.randint(lo, j, (), generator=gen))
    return parents


def softmax_probs(shape, gen, scale=3.0, dtype=torch.float32) -> torch.Tensor:
    return torch.softmax(torch.randn(shape, generator=gen) * scale, dim=-1).to(dtype)


def exponentials(B: int, V: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand((B, V), generator=gen, dtype=torch.float64)
    return (-torch.log1p(-u)).float()
