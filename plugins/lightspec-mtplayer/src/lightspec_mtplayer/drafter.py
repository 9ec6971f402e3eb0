"""The ``mtp`` strategy: drafting with the target's MTP modules or with Medusa heads.

Both read the target's final-norm hidden states (``hidden_layers = [L]``, HF numbering) that
the engine hands to ``propose`` (``ctx.hidden_states``).  With ``t`` the last position the
target has run (``len(sequence) - 2``; the row's last token is committed but not yet run):

* MTP modules (``MTPChain``): module 0 reads ``(x_{t+1}, h_t)`` at position ``t`` and drafts
  ``d_1``; step j reads ``(d_j, o_j)`` (``o_j``: the previous step's output) at position ``t+j``
  and drafts ``d_{j+1}`` with module ``j mod n`` (vLLM's reuse for k above the number of
  modules).  Each module keeps its own ``KVCache`` over the committed pairs
  ``(x_{p+1}, h_p)`` and, while drafting, over the chain's pairs (every module sees every pair,
  so each attends to the whole chain); the chain is rolled back after every draft.
* Medusa heads (``MedusaDraft``): head i reads ``h_t`` and drafts ``d_{i+1}``, all in one pass.
  They also expand token trees for lightspec-tree (``tree_start`` / ``tree_step``).

Greedy drafts are argmaxes; sampled ones are drawn from the warped distribution with each
row's generator and reported as ``probs``.  A row stops drafting where the budget's
``min_confidence`` is above the draft's peak probability.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from lightspec_core import (
    DraftProposal,
    KVCache,
    LightSpecError,
    exponential_noise,
    warp_logits,
)

from .modules import MedusaHeads, MTPLayer


class _Cfg:
    """The config ``KVCache`` reads from a model (no sliding window: plain causal masks)."""

    num_hidden_layers = 1


class _ModuleModel(nn.Module):
    """One MTP module as an HF-style forward for ``KVCache``: ``states [B, q, H]`` is set
    before each forward; returns the module's output ``[B, q, H]`` (no logits)."""

    def __init__(self, layer: MTPLayer):
        super().__init__()
        self.layer, self.config = layer, _Cfg()
        self.states: torch.Tensor | None = None

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True, **_):
        B, q = input_ids.shape
        cols = cache.get_seq_length() + q if cache.layers else q
        return self.layer(input_ids, self.states, position_ids, _mask_4d(attention_mask, B, q, cols, input_ids.device),
                          cache=cache)


def _mask_4d(mask, B, q, cols, device):
    """Causal over the cache's columns, and ``mask [B, cols]`` (valid columns) or a 4D mask as given."""
    if mask is not None and mask.dim() == 4:
        return mask
    col = torch.arange(cols, device=device)
    causal = col[None, :] <= (cols - q + torch.arange(q, device=device))[:, None]
    out = causal[None, None].expand(B, 1, q, cols)
    return out if mask is None else out & mask[:, None, None, :cols].bool()


def pick(logits: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``logits [B, V]`` -> (token [B], warped q [B, V] or None when greedy, peak [B], entropy [B])."""
    p = torch.softmax(logits.float(), dim=-1)
    peak, arg = p.max(dim=-1)
    ent = torch.special.entr(p).sum(-1)
    if ctx.sampling.greedy:
        return arg, None, peak, ent
    q = warp_logits(logits.float(), ctx.sampling).softmax(dim=-1)
    tok = (q / exponential_noise(ctx.generators, q.shape[-1], ctx.device)).argmax(dim=-1)
    return tok, q, peak, ent


class _Draft:
    """Collects one step's drafts row by row, stopping rows at their limit or low confidence.

    ``offset [B]``: chain steps a row spends on a cascade's prefix (``ctx.prefix``) before its
    own drafts begin; step j of such a row records nothing while ``j < offset``."""

    def __init__(self, ctx, limits: list[int], sampling: bool, vocab: int, offset: torch.Tensor | None = None):
        B, k = ctx.batch, max(limits)
        dev = ctx.device
        self.tokens = torch.zeros(B, k, dtype=torch.long, device=dev)
        self.conf = torch.zeros(B, k, device=dev)
        self.ent = torch.zeros(B, k, device=dev)
        self.probs = torch.zeros(B, k, vocab, device=dev) if sampling else None
        self.lengths = torch.zeros(B, dtype=torch.long, device=dev)
        self.limit = torch.tensor(limits, device=dev)
        self.offset = torch.zeros(B, dtype=torch.long, device=dev) if offset is None else offset
        self.active = self.limit > 0
        self.min_conf = ctx.min_confidence

    def add(self, j: int, tok, q, peak, ent) -> bool:
        """Record chain step j of every row that is past its prefix and still drafting;
        False when no row goes on."""
        col = j - self.offset
        rec = self.active & (col >= 0)
        rows = rec.nonzero().flatten()
        if rows.numel():
            c = col[rows]
            self.tokens[rows, c], self.conf[rows, c], self.ent[rows, c] = tok[rows], peak[rows], ent[rows]
            if q is not None:
                self.probs[rows, c] = q[rows]
        self.lengths += rec.long()
        self.active = self.active & ~(rec & ((self.lengths >= self.limit) | (peak < self.min_conf)))
        return bool(self.active.any())

    def proposal(self, source: str) -> DraftProposal:
        k = int(self.lengths.max())
        return DraftProposal(tokens=self.tokens[:, :k], lengths=self.lengths,
                             probs=None if self.probs is None else self.probs[:, :k],
                             confidence=self.conf[:, :k], entropy=self.ent[:, :k], source=source)


def _prefix(ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix tokens [B, P], lengths [B]) of a cascade's earlier drafters (P = 0 when none)."""
    if ctx.prefix is None:
        return torch.zeros(ctx.batch, 0, dtype=torch.long, device=ctx.device), torch.zeros(
            ctx.batch, dtype=torch.long, device=ctx.device)
    return ctx.prefix.to(ctx.device), ctx.prefix_lengths.to(ctx.device)


class _States:
    """The target's final hidden states of each request, by position (from ``ctx``)."""

    def __init__(self):
        self.rows: dict[int, list[torch.Tensor]] = {}  # request -> states of positions base.. (one [H] each)
        self.base: dict[int, int] = {}

    def take(self, ctx, layer: int) -> bool:
        """Append this step's states; True when a request's states restarted (a gap: the
        engine kept fewer than were missed), so caches built on them must be rebuilt."""
        h = ctx.hidden_states[layer]
        restarted = False
        for b, rid in enumerate(ctx.row_ids):
            first, n = int(ctx.hidden_positions[b]), int(ctx.hidden_lengths[b])
            mine = self.rows.setdefault(rid, [])
            base = self.base.setdefault(rid, first)
            if first > base + len(mine) or first < base:
                mine = self.rows[rid] = []
                base = self.base[rid] = first
                restarted = True
            del mine[first - base :]
            mine.extend(h[b, :n].clone().unbind(0))  # copies: the engine may reuse its buffers
        return restarted

    def last(self, rid: int) -> torch.Tensor:
        return self.rows[rid][-1]


class MTPChain:
    """Chain drafting with MTP modules (module docstring)."""

    def __init__(self, layers: list[MTPLayer], name: str, max_draft: int):
        self.layers, self.name, self.max_draft = layers, name, max_draft
        self.models = [_ModuleModel(layer) for layer in layers]
        self.reset()

    def reset(self) -> None:
        self.kvs: list[KVCache] | None = None
        self.rows: list[int] = []
        self.fed: list[int] = []  # per row: pairs (x_{p+1}, h_p) in the caches, counted from the row's base
        self.last_out: torch.Tensor | None = None  # [B, H]: module 0's output at each row's last fed pair
        self.states = _States()

    def _sync_rows(self, ctx, restarted: bool) -> None:
        rows = list(ctx.row_ids)
        if self.kvs is not None and not restarted and rows == self.rows:
            return
        if self.kvs is not None and not restarted and set(rows) <= set(self.rows):
            keep = torch.tensor([self.rows.index(r) for r in rows], device=ctx.device)
            for kv in self.kvs:
                kv.select_rows(keep)
            self.fed = [self.fed[i] for i in keep.tolist()]
            self.last_out = self.last_out[keep]
        else:
            self.kvs = [KVCache(m, ctx.batch, ctx.device, capacity=128) for m in self.models]
            self.fed = [0] * ctx.batch
            self.last_out = None
        self.rows = rows

    @torch.inference_mode()
    def propose(self, ctx, layer: int) -> DraftProposal | None:
        restarted = self.states.take(ctx, layer)
        limits = [min(m, self.max_draft) for m in ctx.max_draft_list]
        self._sync_rows(ctx, restarted)
        t0 = time.perf_counter()
        self._catch_up(ctx)
        if max(limits) == 0:
            return None
        pre, pre_len = _prefix(ctx)
        draft = _Draft(ctx, limits, not ctx.sampling.greedy, ctx.vocab_size, offset=pre_len)
        steps = int((pre_len + torch.tensor(limits, device=ctx.device)).max())
        out = self.last_out
        logits = self.layers[0].head(out)
        committed = [kv.lengths for kv in self.kvs]
        for j in range(steps):
            tok, q, peak, ent = pick(logits[:, : ctx.vocab_size], ctx)
            if j < pre.shape[1]:  # a cascade's prefix: the chain goes through its tokens first
                tok = torch.where(j < pre_len, pre[:, j], tok)
            if not draft.add(j, tok, q, peak, ent) or j + 1 == steps:
                break
            outs = []
            for model, kv in zip(self.models, self.kvs):  # every module keeps the whole chain
                model.states = out[:, None]
                outs.append(kv.forward(tok[:, None])[:, 0])
            use = (j + 1) % len(self.layers)
            out = outs[use]
            logits = self.layers[use].head(out)
        for kv, keep in zip(self.kvs, committed):
            kv.truncate(keep)
        proposal = draft.proposal(self.name)
        ctx.timer.record(self.name, time.perf_counter() - t0, int(proposal.lengths.max()))
        return proposal

    def _catch_up(self, ctx) -> None:
        """Feed every module the committed pairs it lacks: pair p is ``(x_{p+1}, h_p)``."""
        B = ctx.batch
        seqs = ctx.sequences
        new = []
        for b, rid in enumerate(ctx.row_ids):
            base = self.states.base[rid]
            end = len(seqs[b]) - 1 - base  # pairs up to p = len - 2
            new.append(range(self.fed[b], end))
        width = max(len(r) for r in new)
        if width == 0:
            return
        H = self.layers[0].eh_proj.out_features
        dtype = self.layers[0].eh_proj.weight.dtype
        ids = torch.zeros(B, width, dtype=torch.long, device=ctx.device)
        states = torch.zeros(B, width, H, dtype=dtype, device=ctx.device)
        valid = torch.zeros(B, width, dtype=torch.bool, device=ctx.device)
        for b, rid in enumerate(ctx.row_ids):
            base, mine = self.states.base[rid], self.states.rows[rid]
            r = new[b]
            if len(r):
                ids[b, : len(r)] = torch.tensor(seqs[b][base + r.start + 1 : base + r.stop + 1], device=ctx.device)
                states[b, : len(r)] = torch.stack(mine[r.start : r.stop]).to(dtype)
                valid[b, : len(r)] = True
        mask = None if bool(valid.all()) else valid
        out0 = None
        for i, (model, kv) in enumerate(zip(self.models, self.kvs)):
            model.states = states
            out = kv.forward(ids, mask)
            if i == 0:
                out0 = out
        last = torch.tensor([max(len(r) - 1, 0) for r in new], device=ctx.device)
        fresh = out0[torch.arange(B, device=ctx.device), last]
        had = torch.tensor([len(r) > 0 for r in new], device=ctx.device)
        self.last_out = fresh if self.last_out is None else torch.where(had[:, None], fresh, self.last_out)
        self.fed = [self.fed[b] + len(new[b]) for b in range(B)]


class MedusaDraft:
    """Parallel drafting with Medusa heads, and their per-depth distributions for trees."""

    def __init__(self, heads: MedusaHeads, name: str, max_draft: int):
        self.heads, self.name, self.max_draft = heads, name, max_draft
        self.reset()

    def reset(self) -> None:
        self.states = _States()
        self.cached: torch.Tensor | None = None  # [B, K, V] log-probs of the current tree
        self.depth = 0

    @torch.inference_mode()
    def head_logits(self, ctx, layer: int, heads: int | None = None) -> torch.Tensor:
        """``[B, K', V]`` logits of the first ``heads`` heads at each row's last state."""
        self.states.take(ctx, layer)
        h = torch.stack([self.states.last(rid) for rid in ctx.row_ids])
        return self.heads(h, heads)[..., : ctx.vocab_size]

    @torch.inference_mode()
    def propose(self, ctx, layer: int) -> DraftProposal | None:
        """Head ``m + j`` drafts token j of a row whose cascade prefix has m tokens."""
        K = self.heads.num_heads
        _, pre_len = _prefix(ctx)
        limits = [max(0, min(m, self.max_draft, K - int(p))) for m, p in zip(ctx.max_draft_list, pre_len.tolist())]
        t0 = time.perf_counter()
        logits = self.head_logits(ctx, layer)  # [B, K, V]
        if max(limits) == 0:
            return None
        draft = _Draft(ctx, limits, not ctx.sampling.greedy, ctx.vocab_size)
        rows = torch.arange(ctx.batch, device=ctx.device)
        for j in range(max(limits)):
            head = (pre_len + j).clamp(max=K - 1)
            if not draft.add(j, *pick(logits[rows, head], ctx)):
                break
        proposal = draft.proposal(self.name)
        ctx.timer.record(self.name, time.perf_counter() - t0, int(proposal.lengths.max()))
        return proposal

    def tree_start(self, ctx, layer: int) -> torch.Tensor:
        """Log-probs ``[B, V]`` of the root's children (head 0); starts a tree."""
        self.cached = torch.log_softmax(self.head_logits(ctx, layer).float(), dim=-1)
        self.depth = 1
        return self.cached[:, 0]

    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[B, F, V]`` of the children of the frontier nodes ``tokens [B, F]``:
        the frontier of the d-th call is at depth d, and its children's distribution is head
        d's (0-based), the same for every node of a depth (Medusa heads do not read tokens)."""
        if self.cached is None:
            raise LightSpecError("tree_step before tree_start: start each tree with tree_start(ctx)")
        if self.depth >= self.heads.num_heads:
            raise LightSpecError(f"tree depth {self.depth + 1} needs Medusa head {self.depth}, but there are only "
                                 f"{self.heads.num_heads} heads: keep trees to depth <= {self.heads.num_heads}")
        out = self.cached[:, self.depth, None, :].expand(tokens.shape[0], tokens.shape[1], -1)
        self.depth += 1
        return out
