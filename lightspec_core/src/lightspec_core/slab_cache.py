"""Pre-allocated per-layer key/value slabs as a ``transformers`` Cache (``SlabCache``).

Why not ``DynamicCache``: it grows by ``torch.cat`` on every forward, which costs 17-34%
of a CPU decode step here.  ``SlabCache`` pre-allocates one slab per layer and hands the
model a *view* of the used prefix, so a step writes only the new columns and rolling back
rejected tokens is just moving an integer.  ``KVCache`` (``kvcache.py``) manages rows,
positions and masks on top of it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _SlabView:
    """``SlabLayer.keys``/``values``: the used prefix of the layer's slab, as a view made when
    read; what is assigned to it is kept only while the layer has no slab."""

    def __init__(self, slab: str):
        self.slab, self.stored = slab, "_" + slab + "_assigned"

    def __get__(self, layer, owner=None):
        if layer is None:
            return self
        slab = getattr(layer, self.slab)
        return getattr(layer, self.stored, None) if slab is None else slab[:, :, : layer.length]

    def __set__(self, layer, value) -> None:
        setattr(layer, self.stored, value)


class SlabLayer(DynamicLayer):
    """One layer's keys and values in a pre-allocated ``[B, H, capacity, D]`` slab.

    ``keys``/``values`` are views of the slab's used prefix, made when read: a step moves
    ``length`` twice (the forward appends, the rollback truncates), and re-making the two
    views of all layers each time cost ~20 us of a 2 ms step.  (Assignments to them, which
    transformers' base class makes, are kept only while there is no slab.)"""

    def __init__(self, capacity: int = 256):
        self.k_slab: torch.Tensor | None = None
        self.v_slab: torch.Tensor | None = None
        self.length = 0
        super().__init__()
        self.capacity = capacity

    keys = _SlabView("k_slab")
    values = _SlabView("v_slab")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.device = key_states.device
        self.k_slab = key_states.new_zeros(B, H, self.capacity, D)
        self.v_slab = value_states.new_zeros(B, H, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        for name in ("k_slab", "v_slab"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], old.shape[1], new_cap, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = new_cap

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.capacity:
            self._grow(end)
        self.k_slab[:, :, self.length : end] = key_states
        self.v_slab[:, :, self.length : end] = value_states
        self.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a count <= 0 of tokens to remove, got {tokens_to_remove}")
        self.set_length(self.length + tokens_to_remove)

    def set_length(self, length: int) -> None:
        self.length = length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.k_slab = self.k_slab.index_select(0, indices)
            self.v_slab = self.v_slab.index_select(0, indices)

    def append_rows(self, other: "SlabLayer", length: int) -> None:
        """Add ``other``'s rows after this layer's (slabs padded to the larger capacity); both
        layers then use ``length`` columns."""
        if other.is_initialized != self.is_initialized:
            raise ValueError("append_rows needs two layers that both have slabs or both have none (prefill both first)")
        if other.is_initialized:
            cap = max(self.capacity, other.capacity, length)
            for name in ("k_slab", "v_slab"):
                mine, theirs = getattr(self, name), getattr(other, name)
                joined = mine.new_zeros(mine.shape[0] + theirs.shape[0], mine.shape[1], cap, mine.shape[3])
                joined[: mine.shape[0], :, : mine.shape[2]] = mine
                joined[mine.shape[0] :, :, : theirs.shape[2]] = theirs
                setattr(self, name, joined)
            self.capacity = cap
        self.set_length(length)

    def gather_columns(self, index: torch.Tensor, new_length: int) -> None:
        """Rebuild the first ``new_length`` columns from ``index [B, new_length]`` (old column ids)."""
        if not self.is_initialized:
            self.set_length(new_length)
            return
        for name in ("k_slab", "v_slab"):
            slab = getattr(self, name)
            B, H, _, D = slab.shape
            moved = slab[:, :, : self.length].gather(2, index[:, None, :, None].expand(B, H, new_length, D))
            slab[:, :, :new_length] = moved
        self.set_length(new_length)


class SlabCache(Cache):
    """A ``transformers`` Cache whose layers are ``SlabLayer``s (created lazily per layer)."""

    def __init__(self, capacity: int = 256):
        super().__init__(layers=[])
        self.capacity = capacity

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(SlabLayer(self.capacity))
        return self.layers[layer_idx].update(key_states, value_states)

    def set_length(self, length: int) -> None:
        for layer in self.layers:
            layer.set_length(length)
