"""Sliding-window attention masks for the holes layout of ``KVCache``.

transformers builds a sliding-window model's masks from column indices: a query at column
i sees key columns j with ``i - j < window``.  In ``KVCache``'s holes layout a row's columns
are not its positions (a right-padded prompt leaves padding between rows' tokens, a
rejected draft leaves a hole), so every token after a hole had its window shifted and a
ragged batch of Mistral or Gemma2 rows decoded differently from each row alone.  Here each
column's position is kept (``MaskBuilder.positions [B, capacity]``) and the masks are built
from positions instead: a query at position p sees the valid cached token at position
p' iff ``p - p' < window`` (and the causal/tree rule allows it).  The result is passed to
the model as a prepared 4D mask (transformers uses a 4D mask as given), or as a mapping
``{"full_attention": ..., "sliding_attention": ...}`` for models that mix both layer kinds
(Gemma2, Qwen2 with ``use_sliding_window``).
"""

from __future__ import annotations

from typing import Callable

import torch


class MaskBuilder:
    """Column positions of a holes-layout cache and the sliding-window masks made from them."""

    def __init__(self, window: int, mixed: bool, batch: int, capacity: int, device: torch.device):
        self.window = window
        self.mixed = mixed  # full and sliding layers: a mask per layer kind
        self.positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)

    @classmethod
    def for_model(cls, model, batch: int, capacity: int, device: torch.device) -> "MaskBuilder | None":
        """A builder for ``model`` if its config has sliding-window layers, else None."""
        cfg = getattr(model, "config", None)
        window = getattr(cfg, "sliding_window", None)
        if not isinstance(window, int) or window <= 0:
            return None
        kinds = set(getattr(cfg, "layer_types", None) or [])
        if kinds and "sliding_attention" not in kinds:
            return None
        return cls(window, mixed=len(kinds) > 1, batch=batch, capacity=capacity, device=device)

    def record(self, position_ids: torch.Tensor, start: int) -> None:
        """The positions ``[B, q]`` of the columns ``start .. start + q - 1`` just appended."""
        q = position_ids.shape[1]
        if start + q > self.positions.shape[1]:
            grown = self.positions.new_zeros(self.positions.shape[0], max(start + q, 2 * self.positions.shape[1]))
            grown[:, :start] = self.positions[:, :start]
            self.positions = grown
        self.positions[:, start : start + q] = position_ids

    def build(self, allowed: torch.Tensor, position_ids: torch.Tensor, end: int,
              convert: Callable[[torch.Tensor], torch.Tensor]):
        """``allowed [B, q, end]`` (the causal/tree/validity rule) → the model's mask argument:
        ``convert([B, 1, q, end])`` with the window applied, or a mapping per layer kind."""
        age = position_ids[:, :, None] - self.positions[:, None, :end]  # [B, q, end]
        sliding = allowed & (age < self.window)
        if not self.mixed:
            return convert(sliding[:, None])
        return {"full_attention": convert(allowed[:, None]), "sliding_attention": convert(sliding[:, None])}

    def compact(self, keep: torch.Tensor, dst: torch.Tensor) -> None:
        """Move positions as ``compact_kv`` moves keys: ``keep [B, M]`` source columns (-1: none)
        to ``dst[b] + j``."""
        for b in range(keep.shape[0]):
            src = keep[b][keep[b] >= 0]
            self.positions[b, int(dst[b]) : int(dst[b]) + src.numel()] = self.positions[b, src].clone()

    def gather(self, index: torch.Tensor, width: int) -> None:
        """Rebuild the first ``width`` columns from ``index [B, width]`` (old column ids)."""
        self.positions[:, :width] = self.positions.gather(1, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.positions = self.positions.index_select(0, rows)

    def copy_from(self, other: "MaskBuilder") -> None:
        self.positions = other.positions.clone()

    def append_rows(self, other: "MaskBuilder") -> None:
        """Add ``other``'s rows after this builder's (``KVCache.append_rows``)."""
        width = max(self.positions.shape[1], other.positions.shape[1])
        joined = self.positions.new_zeros(self.positions.shape[0] + other.positions.shape[0], width)
        joined[: self.positions.shape[0], : self.positions.shape[1]] = self.positions
        joined[self.positions.shape[0] :, : other.positions.shape[1]] = other.positions
        self.positions = joined
