"""Drafters that implement the tree expansion protocol (docs/plugin-authoring.md, "Tree
expansion"): a causal LM (the draft model, or the target's first layers) with its own
``KVCache`` run under a tree mask, and an n-gram lookup whose children are the
continuations of the context's earlier matches.

Protocol, for the B active rows of a step:

* ``tree_start(ctx) -> logprobs [B, V]`` float32: the log-softmax of the root's children
  (root = each row's last committed token, ``ctx.sequences[b][-1]``);
* ``tree_step(tokens [B, F], parents [B, F]) -> logprobs [B, F, V]``: append F nodes per row
  (``parents`` index the nodes given so far in this step, ``-1`` = the root) and return
  their children's distributions.  Every row gets F nodes; a caller pads a row with any
  token under the root and ignores what comes back for it;
* ``tree_commit(path)`` (optional): ``path[b]`` = the nodes of this step (root first) that
  the target accepted, for the rows of the last ``tree_start``; the drafter keeps them in
  its cache.  Without the call the drafter re-syncs from ``ctx.sequences`` at its next
  ``tree_start``;
* ``supports_tree_expansion`` (optional attribute, read after ``setup``): False when the
  drafter cannot grow trees with what it loaded; the tree strategies refuse it at start-up;
* ``max_tree_depth`` (optional attribute, read after ``setup``): the most levels it can grow
  (e.g. one per Medusa head); a default tree is cut to it, a deeper one the user gave is
  refused at start-up.

``make_drafter`` turns a tree strategy's ``drafter`` option into such an object.
"""

from __future__ import annotations

import itertools
import math

import torch

from lightspec_core import (
    KVCache,
    LightSpecError,
    choose_exit_layer,
    early_exit_view,
    get_registry,
    lean_forward,
    num_layers,
    takes_logits_to_keep,
)


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


class ModelExpander:
    """Tree expansion with a causal LM that shares the target's tokenizer.

    Each ``tree_step`` appends its F nodes to the drafter's cache in one forward over those
    F only (``KVCache.forward(..., tree=parents of the whole tree so far, tree_base=the
    lengths at tree_start)``: each node sees the committed tokens and its ancestors among
    the earlier levels' slots), returning their logits; while the tree is a chain it is
    appended as a chain.  ``tree_commit`` then keeps the accepted path with
    ``KVCache.commit`` (compaction).
    ``max_context``: the drafter's cache starts from each prompt's last N tokens (0: all)."""

    name = "draft_model"

    def __init__(self, model=None, lean: bool = True, max_context: int = 128):
        if not isinstance(lean, bool):
            raise ValueError(f"lean={lean!r} is invalid: use true or false")
        if not (isinstance(max_context, int) and not isinstance(max_context, bool) and max_context >= 0):
            raise ValueError(f"max_context={max_context!r} is invalid: use an integer >= 0 (0: the whole prompt)")
        self.model, self.lean, self.max_context = model, lean, max_context
        self.runner = None
        self.cost_hint = 0.1
        self.vocab = 0
        self.reset()

    def setup(self, env) -> None:
        if self.model is None:
            if env.draft_model is None:
                raise LightSpecError(f"tree drafter {self.name!r} needs a draft model: pass --draft-model PATH "
                                     "(or draft_model=...)")
            self.model = env.load_draft_model()
        self._use(self.model, env.target)

    def _use(self, model, target, layers: int | None = None) -> None:
        fast = lean_forward(model if layers is None else target, layers, exact=False, fuse=layers is None) if self.lean else None
        self.runner = fast or model
        self.keeps_logits = takes_logits_to_keep(self.runner)
        self.vocab = target.get_output_embeddings().weight.shape[0]
        self.cost_hint = _params(model) / max(1, _params(target))

    def reset(self) -> None:
        self.kv: KVCache | None = None
        self.rows: list[int] = []
        self.fed: list[list[int]] = []  # per row: the context whose keys are cached (after `offset`)
        self.offset: list[int] = []  # per row: leading context tokens never fed (max_context)
        self.base: list[int] = []  # per row: cached tokens before this step's tree
        self.base_t: torch.Tensor | None = None  # the same, [B] int64 (tree_base)
        self.nodes: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's tree so far
        self.in_cache = 0  # nodes of this step's tree held in the cache, in the order given
        self.chain = True  # the nodes given so far form a chain (each the child of the one before)

    def draft_cost_hints(self) -> dict[str, float]:
        return {self.name: self.cost_hint}

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[..., V_draft]`` as log-probabilities over the target's ``V``."""
        v = logits.shape[-1]
        if v > self.vocab:
            logits = logits[..., : self.vocab]
        elif v < self.vocab:
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], self.vocab - v), float("-inf"))], -1)
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.inference_mode()
    def tree_start(self, ctx) -> torch.Tensor:
        B, dev = ctx.batch, ctx.device
        seqs = ctx.sequences
        if self.kv is None:
            self.kv = KVCache(self.runner, B, dev, capacity=max(len(s) for s in seqs) + 64)
            self.fed = [[] for _ in range(B)]
            span = self.max_context
            self.offset = [max(0, len(s) - 1 - span) if span else 0 for s in seqs]
            self.rows = list(ctx.row_ids)
        elif self.rows != list(ctx.row_ids):
            pos = {r: i for i, r in enumerate(self.rows)}
            keep = [pos[r] for r in ctx.row_ids]
            self.kv.select_rows(torch.tensor(keep, device=dev))
            self.fed = [self.fed[i] for i in keep]
            self.offset = [self.offset[i] for i in keep]
            self.rows = list(ctx.row_ids)
        keep_n, new = [], []
        for b, seq in enumerate(seqs):
            fed = self.fed[b]
            n = min(len(fed), len(seq) - 1)  # the root is always run: its logits are the answer
            c = 0
            while c < n and fed[c] == seq[c]:
                c += 1
            c = max(c, self.offset[b])
            keep_n.append(c - self.offset[b])
            new.append(list(seq[c:]))
            self.fed[b] = list(seq)
        self.kv.truncate(keep_n)
        width = max(len(t) for t in new)
        ids = torch.zeros(B, width, dtype=torch.long)
        valid = torch.zeros(B, width, dtype=torch.bool)
        for b, t in enumerate(new):
            ids[b, : len(t)] = torch.tensor(t)
            valid[b, : len(t)] = True
        ids, valid = ids.to(dev), None if bool(valid.all()) else valid.to(dev)
        last = torch.tensor([len(t) - 1 for t in new], device=dev)
        # the lm_head (most of a small draft's weights) only where the answer is
        if hasattr(self.runner, "row_offsets_ok"):  # LightSpec's lean forward: one position per row
            out = self.kv.forward(ids, valid, last_positions=last)
            logits = out.logits[:, 0]
        else:
            keep = width - min(len(t) for t in new) + 1 if self.keeps_logits else width
            out = self.kv.forward(ids, valid, **({"logits_to_keep": keep} if self.keeps_logits else {}))
            logits = out.logits[torch.arange(B, device=dev), last - (width - keep)]
        self.base = self.kv.lengths
        self.base_t = torch.tensor(self.base, dtype=torch.long, device=dev)
        self.nodes, self.in_cache, self.chain = None, 0, True
        return self._fit(logits)

    @torch.inference_mode()
    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        F = tokens.shape[1]
        given = 0 if self.nodes is None else self.nodes[0].shape[1]
        # a chain so far, continued by one node per row: appended as a chain (no mask to build)
        chain = self.chain and F == 1 and bool((parents == given - 1).all())
        if self.nodes is None:
            self.nodes = (tokens, parents)
        else:
            self.nodes = (torch.cat([self.nodes[0], tokens], 1), torch.cat([self.nodes[1], parents], 1))
        extra = {"logits_to_keep": F} if self.keeps_logits else {}
        if chain:
            out = self.kv.forward(tokens, None, **extra)
        else:  # only the new level runs; it sees the earlier levels' slots through the tree mask
            self.chain = False
            out = self.kv.forward(tokens, None, tree=self.nodes[1], tree_base=self.base_t, **extra)
        self.in_cache = self.nodes[0].shape[1]
        return self._fit(out.logits[:, -F:])

    def tree_commit(self, path: list[list[int]]) -> None:
        if self.kv is None or not self.in_cache:
            return
        # the path's nodes that were run (the last level of a tree is drafted, never run)
        kept = [list(itertools.takewhile(lambda j: j < self.in_cache, p)) for p in path]
        toks = self.nodes[0].tolist()
        self.kv.commit(self.base, kept)
        for b, p in enumerate(kept):
            self.fed[b] = self.fed[b] + [toks[b][j] for j in p]
        self.in_cache = 0


class LayerSkipExpander(ModelExpander):
    """Tree expansion with the target's first ``layers`` blocks, its final norm and lm_head.
    ``layers="auto"``: the exit layer that maximises expected tokens per unit of work on
    the first prompt (the early exit's greedy agreement with the full model)."""

    name = "layerskip"

    def __init__(self, layers: int | str = "auto", lean: bool = True, max_context: int = 128):
        if not (layers == "auto" or (isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1)):
            raise ValueError(f"layers={layers!r} is invalid: use 'auto' or an integer >= 1")
        super().__init__(lean=lean, max_context=max_context)
        self.layers = layers
        self.target = None

    def setup(self, env) -> None:
        self.target = env.target
        n = num_layers(env.target)
        if self.layers != "auto":
            if self.layers >= n:
                raise ValueError(f"layers={self.layers} is invalid: this model has {n} layers, use 1..{n - 1}")
            self._exit(self.layers)

    def _exit(self, n: int) -> None:
        self.layers = n
        self.model = early_exit_view(self.target, n)
        self._use(self.model, self.target, layers=n)

    def tree_start(self, ctx) -> torch.Tensor:
        if self.model is None:
            self._exit(choose_exit_layer(self.target, list(ctx.sequences[0])))
        return super().tree_start(ctx)


class NgramExpander:
    """Tree expansion from the context itself: the children of a node are the tokens that
    followed its path at the earlier matches of the row's suffix (the last ``min_ngram`` ..
    ``max_ngram`` tokens, newest ``max_matches`` matches), weighted by the length of the
    match; ``logprobs`` are those weights normalised (-inf for every other token)."""

    name = "ngram"

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4, max_matches: int = 16, max_depth: int = 16):
        for key, v in (("min_ngram", min_ngram), ("max_ngram", max_ngram), ("max_matches", max_matches),
                       ("max_depth", max_depth)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{key}={v!r} is invalid: use an integer >= 1")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram={max_ngram} is invalid: use an integer >= min_ngram ({min_ngram})")
        self.min_ngram, self.max_ngram, self.max_matches, self.max_depth = min_ngram, max_ngram, max_matches, max_depth
        self.reset()

    def reset(self) -> None:
        self.tries: list[dict] = []  # per row: the root's trie, {token: [weight, children]}
        self.where: list[list[dict | None]] = []  # per row: each node's trie children (None: off the trie)

    def draft_cost_hints(self) -> dict[str, float]:
        return {self.name: 0.0}

    def _trie(self, seq) -> dict:
        root: dict = {}
        last, found = seq[-1], 0
        for i in range(len(seq) - 2, -1, -1):  # newest match first
            if seq[i] != last:
                continue
            m = 1
            while m < self.max_ngram and i - m >= 0 and seq[i - m] == seq[-1 - m]:
                m += 1
            if m < self.min_ngram:
                continue
            node = root
            for t in seq[i + 1 : i + 1 + self.max_depth]:
                entry = node.setdefault(t, [0.0, {}])
                entry[0] += m
                node = entry[1]
            found += 1
            if found >= self.max_matches:
                break
        return root

    def _logprobs(self, children: dict | None, out: torch.Tensor) -> None:
        if not children:
            return
        total = sum(w for w, _ in children.values())
        for t, (w, _) in children.items():
            if t < out.shape[-1]:
                out[t] = math.log(w / total)

    def tree_start(self, ctx) -> torch.Tensor:
        self.vocab = ctx.vocab_size
        self.tries = [self._trie(seq) for seq in ctx.sequences]
        self.where = [[] for _ in ctx.sequences]
        out = torch.full((ctx.batch, self.vocab), float("-inf"))
        for b, trie in enumerate(self.tries):
            self._logprobs(trie, out[b])
        return out.to(ctx.device)

    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        B, F = tokens.shape
        out = torch.full((B, F, self.vocab), float("-inf"))
        for b, (toks, pars) in enumerate(zip(tokens.tolist(), parents.tolist())):
            for f, (t, p) in enumerate(zip(toks, pars)):
                up = self.tries[b] if p < 0 else self.where[b][p]
                entry = up.get(t) if up else None
                here = entry[1] if entry else None
                self.where[b].append(here)
                self._logprobs(here, out[b, f])
        return out.to(tokens.device)


# the protocol's own implementations, under the names of the chain drafters they mirror
EXPANDERS = {"draft_model": ModelExpander, "layerskip": LayerSkipExpander, "ngram": NgramExpander}


def make_drafter(drafter, options=None):
    """The tree drafter named ``drafter``: one of ``EXPANDERS``, a registered strategy that
    implements ``tree_start`` / ``tree_step`` (built by name through the public registry,
    with ``options``), or an object that does."""
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ValueError(f"drafter_options={options!r} is invalid: use a mapping of the drafter's options")
    if isinstance(drafter, str):
        if drafter in EXPANDERS:
            try:
                obj = EXPANDERS[drafter](**options)
            except TypeError as exc:
                raise ValueError(f"drafter_options for {drafter!r}: {exc}") from None
        else:
            registry = get_registry()
            names = registry.names("strategy")
            if drafter not in names:
                raise ValueError(f"drafter={drafter!r} is invalid: use {', '.join(EXPANDERS)} or a registered strategy "
                                 f"that implements tree_start/tree_step (registered: {', '.join(names)})")
            obj = registry.create("strategy", drafter, **options)
    else:
        obj = drafter
    if not (callable(getattr(obj, "tree_start", None)) and callable(getattr(obj, "tree_step", None))):
        raise ValueError(f"drafter {getattr(obj, 'name', obj)!r} does not implement the tree expansion protocol "
                         "(tree_start(ctx), tree_step(tokens, parents)); see docs/plugin-authoring.md")
    return obj
