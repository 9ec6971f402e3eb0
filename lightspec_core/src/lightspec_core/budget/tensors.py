"""Small tensors a budget policy returns step after step, made once and reused."""

from __future__ import annotations

import torch


class TensorCache:
    """``get(values, device)``: a tensor of ``values`` (int64 for ints, float32 for
    floats), made on first use and then returned again for the same values and device.

    A policy returns the same few small tensors on most steps, and a tensor made right
    after a forward costs microseconds on a cold cache.  The tensors are read-only by
    contract (``Budget.max_draft`` and ``min_confidence`` are never written in place).
    At most ``limit`` tensors are kept; past that the cache starts over."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._tensors: dict[tuple, torch.Tensor] = {}

    def get(self, values: tuple, device) -> torch.Tensor:
        key = (values, device)  # the device object itself: str(torch.device) costs microseconds
        t = self._tensors.get(key)
        if t is None:
            if len(self._tensors) > self.limit:
                self._tensors.clear()
            t = self._tensors[key] = torch.tensor(values, device=device)
        return t
