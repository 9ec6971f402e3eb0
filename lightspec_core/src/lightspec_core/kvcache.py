"""The KV cache for B ragged rows, for the target and for model drafters (public: ``KVCache``).

Why not ``DynamicCache``: it grows by ``torch.cat`` on every forward, which costs
17-34% of a CPU decode step here.  ``SlabCache`` pre-allocates one slab per layer and
hands the model a *view* of the used prefix, so a step writes only the new columns and
rolling back rejected tokens is just moving an integer.

Ragged rows share one column axis.  Two layouts:

* per row (``KVCache.per_row``, where the model takes ``row_offsets``: LightSpec's
  chained lean forward): row b's tokens fill columns ``[0, npos[b])``, a step writes each
  row's new tokens where its own end, and rolling back is lowering ``npos[b]``.  A ragged
  verify (rows with drafts of different lengths, rows that accept different counts) leaves
  nothing behind, and each row's attention reads its own length only;
* holes (any other model): each row owns the columns whose ``valid`` flag is set;
  rejected draft slots and padding become *holes* (masked columns) instead of being
  copied around.  Position ids are per row (the number of valid tokens before the
  token), so a hole never shifts a position.  When holes waste too much of the slab the
  cache is compacted with one gather per layer.  Every later step's attention reads the
  holes too: at batch 8 that cost the speculating strategies more than their drafts won.

A forward may carry a token tree instead of a chain (``tree=``: each new slot's parent
slot): the new slots then attend to their ancestors only, at depth-based positions, and
``commit`` keeps one path of them (compacted with the kernels' ``compact_kv_layers``).
With ``tree_base`` a tree grows over several forwards (a drafter appends one level per
forward instead of re-running the tree): ``tree`` then lists the parents of every slot
appended since the base, and the new slots' mask covers the earlier ones.
Models with sliding-window attention on the holes layout get their masks built here from
each column's position (``kv_masks``): transformers' own sliding masks count columns, and a
hole or padding column shifted every later token's window.
"""

from __future__ import annotations

import inspect

import torch
from lightspec_kernels import compact_kv_layers, tree_attention_mask

from .kv_masks import MaskBuilder
from .slab_cache import SlabCache, SlabLayer  # noqa: F401 - part of this module's API


def takes_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` can skip the lm_head on all but the last n positions."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward keyword a model takes its cache by (transformers 5 renamed it)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class KVCache:
    """A model's KV cache for B ragged rows, with per-row positions (module docstring).

    ``lengths[b]`` (``npos[b]``) is how many tokens row b has cached, i.e. the position id of
    its next token.  Columns ``[0, cols)`` of the slabs are in use.  Per row (``per_row``):
    row b holds columns ``[0, npos[b])``.  With holes: ``valid[b, c]`` says whether column c
    holds a real token of row b.

    A model drafter keeps its own: ``forward`` appends (and runs the model), ``truncate``
    rolls rows back, ``commit`` keeps one path of a tree forward, ``select_rows`` drops rows.
    ``cache`` is the ``transformers`` Cache object (``SlabCache``) to pass to a module that
    calls ``cache.update(keys, values, layer_idx)`` itself.

    ``per_row``: ``None`` (default) uses the per-row layout where the model offers it
    (``row_offsets_ok``); ``False`` keeps holes (the exactness probe compares HF's forward
    and the lean one on the same layout).
    """

    def __init__(self, model: torch.nn.Module, batch: int, device: torch.device, capacity: int = 256,
                 per_row: bool | None = None):
        self.model = model
        self.cache = SlabCache(capacity)
        self.cache_kw = cache_kwarg(model)
        self.device = device
        self.cols = 0
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.npos = torch.zeros(batch, dtype=torch.long, device=device)
        self.has_holes = False
        self.block = (0, 0)  # (first column, width) of the last forward's new slots
        self.tree_col = 0  # holes layout: the first column of the current tree's slots (commit)
        # a model that takes row_offsets also makes its cache's slabs before a prefill (init_cache)
        offered = bool(getattr(model, "row_offsets_ok", False))
        if per_row and not offered:
            raise ValueError("per_row=True needs a model that takes row_offsets (a LeanDecoder with the chained forward)")
        self.per_row = offered if per_row is None else bool(per_row)
        # sliding-window models (holes layout) get masks built from column positions
        self.masks = None if self.per_row else MaskBuilder.for_model(model, batch, capacity, device)

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def lengths(self) -> list[int]:
        """Tokens cached per row (the next token's position), as Python ints."""
        return self.npos.tolist()

    def forward(self, input_ids: torch.Tensor, input_valid: torch.Tensor | None = None, tree: torch.Tensor | None = None,
                tree_base: torch.Tensor | list[int] | None = None, **model_kwargs):
        """Append ``input_ids [B, q]`` (each row's real tokens first, then padding marked False
        in ``input_valid [B, q]``) and run the model over them.

        ``tree [B, q]`` int64 (optional): the parent slot of each new slot among the q
        (``-1``: it continues the cached tokens; otherwise ``tree[b, j] < j``).  Each slot then
        attends to the cached tokens and its ancestors only, at position ``lengths[b] +
        depth``.  Without it the new slots are a chain.

        ``tree_base [B]`` (optional, with ``tree``; a list of ints or int64): a tree appended
        over several forwards.  ``tree_base[b]`` is row b's length when the tree began (its
        root, the last committed token, already cached), and ``tree [B, n]`` gives the parent
        of every slot appended since, counted from the base (slot 0 = the tree's first node,
        ``-1`` = the root; ``tree[b, j] < j``): the first ``n - q`` are cached already (by
        earlier forwards, tree or chain), the last q are ``input_ids``.  Every row must hold
        exactly ``n - q`` slots past its base, and no padding (``input_valid`` all True or
        None).  A new slot attends to columns ``[0, base)`` and to its ancestors-or-self among
        the tree's slots, at position ``tree_base[b] + depth`` (depth 0: a child of the root).
        ``commit(tree_base, path)`` then keeps one path, its slots numbered the same way.

        Returns the model output (``logits [B, q, V]`` unless the caller asked the model for none).
        """
        depth = tree_mask = None
        if tree_base is not None:
            tree_mask, depth, prior = self._tree_rows(input_ids, input_valid, tree, tree_base)
        elif tree is not None:
            mask, depth = tree_attention_mask(tree, 0)  # [B, 1, q, q] ancestors-or-self, depth [B, q]
            tree_mask, prior = mask[:, 0], 0
        else:
            prior = 0
        if self.per_row:
            return self._forward_per_row(input_ids, input_valid, tree_mask, depth, model_kwargs)
        B, q = input_ids.shape
        end = self.cols + q
        if end > self.valid.shape[1]:
            grown = torch.zeros(B, max(end, 2 * self.valid.shape[1]), dtype=torch.bool, device=self.device)
            grown[:, : self.cols] = self.valid[:, : self.cols]
            self.valid = grown
        if depth is not None:
            position_ids = self.npos[:, None] + depth
        elif input_valid is None:
            position_ids = self.npos[:, None] + torch.arange(q, device=self.device)
        else:  # padding slots get the position after the row's last real token; they are masked anyway
            position_ids = self.npos[:, None] + (input_valid.long().cumsum(1) - 1).clamp(min=0)
        self.valid[:, self.cols : end] = True if input_valid is None else input_valid
        if input_valid is None:
            self.npos += q
        else:
            self.npos += input_valid.sum(1)
            if not bool(input_valid.all()):
                self.has_holes = True
        self.block = (self.cols, q)
        self.tree_col = self.cols - prior  # the tree's earlier slots are the last `prior` columns
        self.cols = end
        kwargs = {self.cache_kw: self.cache}
        lean = hasattr(self.model, "row_offsets_ok")  # a LeanDecoder takes the tree's own mask
        if self.masks is not None or (tree_mask is not None and not lean):
            attention_mask = self._full_mask(position_ids, input_valid, tree_mask)
        else:
            attention_mask = self.valid[:, :end] if self.has_holes else None
            if tree_mask is not None:
                kwargs["tree_mask"] = tree_mask
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **kwargs, **model_kwargs)

    def _tree_rows(self, input_ids: torch.Tensor, input_valid: torch.Tensor | None, tree: torch.Tensor | None,
                   tree_base) -> tuple[torch.Tensor, torch.Tensor, int]:
        """For ``forward(..., tree, tree_base)``: checks them and returns ``(mask [B, q, n],
        offset [B, q], prior)``: which of the tree's n slots each new slot sees (its
        ancestors and itself), each new slot's position minus the row's length, and how many
        of the tree's slots were cached before this forward."""
        B, q = input_ids.shape
        if tree is None:
            raise ValueError("tree_base needs tree=: the parents of the tree's slots since the base [B, n]")
        if not (isinstance(tree, torch.Tensor) and tree.dtype == torch.int64 and tree.dim() == 2
                and tree.shape[0] == B and tree.shape[1] >= q):
            got = tuple(tree.shape) if isinstance(tree, torch.Tensor) else type(tree).__name__
            raise ValueError(f"tree={got} is invalid with tree_base: use int64 [B={B}, n >= q={q}], the parents of "
                             "every slot since the base, the new slots last")
        if input_valid is not None and not bool(input_valid.all()):
            raise ValueError("tree_base takes no padding: every row appends its q tree slots (input_valid all True)")
        base = torch.as_tensor(tree_base, dtype=torch.long, device=self.device).reshape(-1)
        if base.shape[0] != B:
            raise ValueError(f"tree_base has {base.shape[0]} entries; use one per row ({B})")
        n = tree.shape[1]
        prior = n - q
        if not bool((self.npos - base == prior).all()):
            raise ValueError(f"tree_base={base.tolist()} does not fit: the rows hold {(self.npos - base).tolist()} "
                             f"slots past it, tree= says {prior} (its parents of n={n} slots, q={q} of them new)")
        tree = tree.to(self.device)
        slot = torch.arange(n, device=self.device)
        if not bool(((tree >= -1) & (tree < slot)).all()):
            raise ValueError(f"tree={tree.tolist()} is invalid: slot j's parent must be -1 (the root) or a slot < j")
        if not self.per_row and prior and not bool(self.valid[:, self.cols - prior : self.cols].all()):
            raise ValueError("tree_base: the tree's earlier slots are not the cache's last columns "
                             "(something was appended with padding or rolled back since the base)")
        anc = (slot[prior:, None] == slot).expand(B, q, n).clone()  # [B, q, n]: itself
        cur = tree[:, prior:]  # [B, q]: walk up to the root, one level per pass
        depth = torch.zeros(B, q, dtype=torch.long, device=self.device)
        while True:
            live = cur >= 0
            if not bool(live.any()):
                break
            anc |= cur[:, :, None] == slot
            depth += live
            cur = torch.where(live, tree.gather(1, cur.clamp(min=0)), -1)
        return anc, depth - prior, prior

    def _full_mask(self, position_ids: torch.Tensor, input_valid: torch.Tensor | None, tree_mask: torch.Tensor | None):
        """The 4D mask (or per-layer-type masks) of a holes-layout forward: each new slot sees
        the row's valid cached columns and, among the new slots, its ancestors (a tree) or the
        ones before it (a chain), within the sliding window where the model has one."""
        start, q = self.block
        end = start + q
        allowed = self.valid[:, None, :end].expand(-1, q, -1).clone()  # [B, q, end]
        new = tree_mask if tree_mask is not None else torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        w = new.shape[-1]  # a tree over several forwards (tree_base) covers its earlier slots too
        if input_valid is not None:
            new = new & input_valid[:, None, :]
        # a slot always sees itself: a padding slot attending to nothing would give NaN keys to later layers
        new = new.expand(allowed.shape[0], q, w).clone()
        new[:, :, w - q :] |= torch.eye(q, dtype=torch.bool, device=self.device)
        allowed[:, :, end - w : end] = new
        if self.masks is None:
            return _as_model_mask(self.model, allowed[:, None])
        self.masks.record(position_ids, start)
        return self.masks.build(allowed, position_ids, end, lambda m: _as_model_mask(self.model, m))

    def _forward_per_row(self, input_ids: torch.Tensor, input_valid: torch.Tensor | None,
                         tree_mask: torch.Tensor | None, depth: torch.Tensor | None, model_kwargs: dict):
        """``forward`` in the per-row layout: row b's new tokens at columns ``npos[b]`` on."""
        q = input_ids.shape[1]
        offsets = self.npos
        position_ids = offsets[:, None] + (depth if depth is not None else torch.arange(q, device=self.device))
        kwargs = {self.cache_kw: self.cache}
        if tree_mask is not None:
            kwargs["tree_mask"] = tree_mask
        if self.cols == 0:
            # the first forward, a prefill of right-padded prompts, runs per row and packed too
            # once the slabs exist: its padding costs no product (at batch 8 the suite's code
            # prompts are 425 real tokens in 1,016 slots)
            self.model.init_cache(self.cache, input_ids.shape[0])
        out = self.model(input_ids=input_ids, attention_mask=input_valid, position_ids=position_ids, use_cache=True,
                         row_offsets=offsets, **kwargs, **model_kwargs)
        self.npos = offsets + (q if input_valid is None else input_valid.sum(1))
        self._set_cols(int(self.npos.max()))
        return out

    def _set_cols(self, cols: int) -> None:
        self.cols = cols
        self.cache.set_length(cols)

    def commit(self, start: list[int], slots: list[list[int]]) -> None:
        """After a tree's forward (or its forwards with ``tree_base=start``) from row lengths
        ``start`` (what ``lengths`` was before it), keep of row b's new slots exactly
        ``slots[b]`` (indices among the tree's slots since ``start``, in sequence order: a
        tree's accepted path, root first) and drop the rest: row b's length becomes
        ``start[b] + len(slots[b])``.  A prefix ``0 .. n-1`` is a truncation; anything else
        moves the kept keys and values into place with ``compact_kv_layers``."""
        if any(s != list(range(len(s))) for s in slots):
            width = max(len(s) for s in slots)
            base = [start[b] for b in range(self.batch)] if self.per_row else [self.tree_col] * self.batch
            keep = torch.tensor([[b0 + j for j in s] + [-1] * (width - len(s)) for b0, s in zip(base, slots)],
                                dtype=torch.long, device=self.device)
            dst = torch.tensor(base, dtype=torch.long, device=self.device)
            slabs = [t for layer in self.cache.layers if layer.is_initialized for t in (layer.k_slab, layer.v_slab)]
            if slabs:
                compact_kv_layers(slabs, keep, dst)
            if self.masks is not None:
                self.masks.compact(keep, dst)
        self.truncate([s0 + len(s) for s0, s in zip(start, slots)])

    def truncate(self, keep: torch.Tensor | list[int]) -> None:
        """Roll back: keep only the first ``keep[b]`` tokens of each row (``keep [B]`` int64, or
        a list of Python ints: a single row without holes then needs no tensor at all)."""
        if self.cols == 0:
            return
        if not self.has_holes and self.batch == 1:
            n = int(keep[0])
            self.cols = n
            self.npos.fill_(n)
            self.cache.set_length(n)
            return
        if self.per_row:  # lower each row's length; nothing is masked or moved
            if isinstance(keep, torch.Tensor):
                self.npos = torch.minimum(self.npos, keep)
                self._set_cols(int(self.npos.max()))
            else:
                lengths = [min(n, k) for n, k in zip(self.npos.tolist(), keep)]
                self.npos = torch.tensor(lengths, dtype=torch.long, device=self.device)
                self._set_cols(max(lengths))
            return
        if not isinstance(keep, torch.Tensor):
            keep = torch.tensor(keep, dtype=torch.long, device=self.device)
        valid = self.valid[:, : self.cols]
        counts = valid.long().cumsum(1)
        valid &= counts <= keep[:, None]
        self.npos = torch.minimum(self.npos, keep)
        used = valid.any(0)
        last = int(used.nonzero().max()) + 1 if bool(used.any()) else 0
        self.valid[:, last : self.cols] = False
        self.cols = last
        self.cache.set_length(last)
        self.has_holes = not bool(self.valid[:, : self.cols].all())
        if self.has_holes and self.cols > 64 and int(self.npos.max()) < 0.75 * self.cols:
            self.compact()

    def compact(self) -> None:
        """Remove holes: gather each row's valid columns, right-aligned, into the first columns."""
        width = int(self.npos.max())
        valid = self.valid[:, : self.cols]
        # column ids of each row's valid entries, right-aligned into `width` slots
        order = torch.argsort((~valid).long() * (self.cols + 1) + torch.arange(self.cols, device=self.device), dim=1, stable=True)
        npos = self.npos
        slot = torch.arange(width, device=self.device)[None, :]
        src_rank = slot - (width - npos[:, None])  # rank among valid entries, negative for padding slots
        new_valid = src_rank >= 0
        index = order.gather(1, src_rank.clamp(min=0))
        for layer in self.cache.layers:
            layer.gather_columns(index, width)
        if self.masks is not None:
            self.masks.gather(index, width)
        self.valid[:, : self.cols] = False
        self.valid[:, :width] = new_valid
        self.cols = width
        self.has_holes = not bool(new_valid.all())

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows (``rows [B']`` int64), in that order."""
        for layer in self.cache.layers:
            layer.batch_select_indices(rows)
        self.valid = self.valid.index_select(0, rows)
        self.npos = self.npos.index_select(0, rows)
        if self.masks is not None:
            self.masks.select_rows(rows)
        if self.per_row:  # the longest remaining row sets the columns in use
            self._set_cols(int(self.npos.max()) if self.npos.numel() else 0)
        elif self.has_holes:
            self.has_holes = not bool(self.valid[:, : self.cols].all())

    def append_rows(self, other: "KVCache") -> None:
        """Add ``other``'s rows (a cache of the same model and layout, e.g. a new request's
        prefill) after this cache's, keeping every row's tokens and positions: continuous
        batching admits rows into a running batch this way.  In the per-row layout each row
        keeps its own columns; with holes the shorter side's missing columns become holes."""
        if self.per_row != other.per_row or (self.masks is None) != (other.masks is None):
            raise ValueError("append_rows needs two caches of the same model and layout")
        B, cols = self.batch, max(self.cols, other.cols)
        width = max(self.valid.shape[1], other.valid.shape[1], cols)
        valid = torch.zeros(B + other.batch, width, dtype=torch.bool, device=self.device)
        valid[:B, : self.cols] = self.valid[:, : self.cols]
        valid[B:, : other.cols] = other.valid[:, : other.cols]
        if not self.per_row and self.cols != other.cols:
            self.has_holes = True
        self.has_holes = self.has_holes or other.has_holes
        while len(self.cache.layers) < len(other.cache.layers):
            self.cache.layers.append(SlabLayer(self.cache.capacity))
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.append_rows(theirs, cols)
        self.cache.capacity = max(self.cache.capacity, other.cache.capacity)
        self.valid, self.npos, self.cols = valid, torch.cat([self.npos, other.npos]), cols
        if self.masks is not None:
            self.masks.append_rows(other.masks)

    def copy_from(self, other: "KVCache", layers: int) -> None:
        """Become a copy of ``other``'s cache of its first ``layers`` layers, with its rows'
        bookkeeping (a drafter that shares the target's first blocks starts from the target's
        keys and values instead of a prefill).  Both must use the same layout."""
        if self.per_row != other.per_row:
            raise ValueError("copy_from needs two caches of the same layout (per row or with holes)")
        self.cols, self.has_holes = other.cols, other.has_holes
        self.valid = other.valid.clone()
        self.npos = other.npos.clone()
        self.cache = SlabCache(other.cache.capacity)
        for src in other.cache.layers[:layers]:
            layer = SlabLayer(src.capacity)
            if src.is_initialized:
                layer.k_slab, layer.v_slab = src.k_slab.clone(), src.v_slab.clone()
                layer.device, layer.is_initialized = src.device, True
            layer.set_length(src.length)
            self.cache.layers.append(layer)
        if self.masks is not None and other.masks is not None:
            self.masks.copy_from(other.masks)


def _as_model_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """A boolean ``[B, 1, q, cols]`` mask (True = attend) in the form ``model``'s attention
    takes a prepared 4D mask: boolean for SDPA-style implementations, additive (0 / the
    dtype's minimum) for eager attention."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl in (None, "sdpa", "lightspec_cpu", "flex_attention"):
        return allowed
    dtype = next(model.parameters()).dtype
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)
