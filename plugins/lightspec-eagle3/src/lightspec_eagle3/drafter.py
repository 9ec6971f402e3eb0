"""The ``eagle3`` strategy: an EAGLE-3 head drafting a chain from the target's hidden states,
and the tree-expansion calls (``tree_start`` / ``tree_step`` / ``tree_commit``) that
lightspec-tree's ``eagle3_tree`` builds dynamic trees with.  One file (about 530 lines) because
the chain and the tree calls share the head's cache bookkeeping.

The head keeps its own ``KVCache``: one entry per *pair* (feature of token t, token t + 1) at
position t.  Committed pairs read the target's fused features (``ctx.hidden_states`` of the
head's taps, through ``fc``); drafted pairs read the previous pair's output.  Each propose
first rolls the cache back to the committed pairs (drafts are never kept: an accepted token
is fed again next step with the target's own feature, as EAGLE does), feeds the pairs
committed since, then drafts.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from lightspec_core import (
    DraftProposal,
    KVCache,
    LightSpecError,
    SparseProbs,
    exponential_noise,
    hookimpl,
    model_folder,
    warped_probs,
)

from .checkpoint import load_head, tensor_names
from .config import read_config
from .modeling import Eagle3Head
from .packed import packed_head_for

# a skipped head keeps at most this many steps' taps unfused, then fuses them in one call
MAX_PENDING = 64


class _CacheModel(nn.Module):
    """What ``KVCache`` runs: the head as an HF-style forward.  ``features [B, q, H]`` are set
    before each forward; ``tree_mask`` / ``tree_positions`` (keywords) replace the cache's own
    mask and positions for tree nodes.  Returns the layer outputs (``.hidden [B, q, H]``)."""

    def __init__(self, head: Eagle3Head, fast=None):
        super().__init__()
        self.head = head
        self.impl = fast or head  # the packed CPU forward where there is one (packed.py)
        self.config = type("HeadRunConfig", (), {})()  # no sliding window, boolean masks
        self.features: torch.Tensor | None = None

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                tree_mask=None, tree_positions=None):
        B, q = input_ids.shape
        cols = past_key_values.get_seq_length() + q if past_key_values.layers else q
        if tree_mask is not None:
            mask, position_ids = tree_mask, tree_positions
        elif attention_mask is not None and attention_mask.dim() == 2:
            j = torch.arange(q, device=input_ids.device)
            causal = torch.arange(cols, device=input_ids.device)[None, :] <= (cols - q + j)[:, None]
            mask = _self_visible(causal[None, None] & attention_mask[:, None, None, :cols].bool(), q, cols)
        else:
            mask = attention_mask
        h = self.impl.forward_cached(input_ids, self.features, position_ids, mask, past_key_values)
        return _Out(h)


def _self_visible(mask: torch.Tensor, q: int, cols: int) -> torch.Tensor:
    """Every new slot sees itself (a padding slot that attends to nothing gives NaN)."""
    idx = torch.arange(q, device=mask.device)
    mask = mask.clone()
    mask[:, :, idx, cols - q + idx] = True
    return mask


class _Out:
    def __init__(self, hidden):
        self.hidden = hidden


def _is_head(name) -> bool:
    """Whether ``name`` (a folder or a hub id) is an EAGLE-3 head: its config reads as a head's
    and its weights hold ``fc`` (a one-layer Llama config alone is not enough).  A hub id's
    config is fetched first and the rest only when the config is a head's, so a plain draft
    LM named by ``--draft-model`` is never downloaded here."""
    try:
        read_config(model_folder(name, what="EAGLE-3 head", allow_patterns=("config.json",)))
        folder = model_folder(name, what="EAGLE-3 head")
        return any(k.endswith("fc.weight") for k in tensor_names(folder))
    except Exception:  # noqa: BLE001 - an unreadable folder or id is simply not a head
        return False


def zoo_head_for(target) -> Path | None:
    """The zoo's EAGLE-3 head folder when ``target`` is the zoo target, else None."""
    try:
        import lightspec_zoo
    except ImportError:
        return None
    folder = lightspec_zoo.MODELS_DIR / "eagle3"
    name = str(getattr(target, "name_or_path", "") or "")
    try:
        same = bool(name) and Path(name).resolve() == lightspec_zoo.model_path().resolve()
    except (OSError, lightspec_zoo.ModelNotFoundError):
        return None
    return folder if same and (folder / "config.json").is_file() else None


class Eagle3Drafter:
    """EAGLE-3 chain drafting (module docstring).  Per row it stops at ``max_draft`` or when the
    draft's peak probability falls below the budget's ``min_confidence``."""

    name = "eagle3"

    def __init__(self, head: str | Path | Eagle3Head = "auto", max_draft: int = 8, top_k_probs: int = 0):
        if not (isinstance(max_draft, int) and not isinstance(max_draft, bool) and max_draft >= 1):
            raise LightSpecError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(top_k_probs, int) and not isinstance(top_k_probs, bool) and top_k_probs >= 0):
            raise LightSpecError(f"top_k_probs={top_k_probs!r} is invalid: use an integer >= 0 (0: the whole draft vocabulary)")
        if not isinstance(head, (str, Path, Eagle3Head)):
            raise LightSpecError(f"head={head!r} is invalid: use 'auto' or the path of an EAGLE-3 head folder")
        self.head_spec = head
        self.max_draft = max_draft
        self.top_k_probs = top_k_probs
        self.head: Eagle3Head | None = head if isinstance(head, Eagle3Head) else None
        self.hidden_layers: list[int] = []
        self.cost_hint = 0.1
        self.reset()

    # -- lifecycle ----------------------------------------------------------------------------

    def setup(self, env) -> None:
        """Load the head (``head``, a folder or a hub id; 'auto': ``--draft-model`` when it is an
        EAGLE-3 head, else the zoo's head for the zoo target) and ask for its taps."""
        if self.head is None:
            path = self.head_spec
            if path == "auto":
                dm = env.draft_model
                if isinstance(dm, (str, Path)) and _is_head(dm):
                    path = dm
                else:
                    path = zoo_head_for(env.target)
                if path is None:
                    raise LightSpecError("strategy 'eagle3' needs an EAGLE-3 head: pass head=PATH (--strategy eagle3:head=PATH, "
                                         "YAML or strategy options) or --draft-model PATH to a head folder; "
                                         "train one with `lightspec eagle3 train`")
            self.head = load_head(model_folder(path, what="EAGLE-3 head", progress=getattr(env, "progress", False)), env.target)
        self._bind(env.target)

    def _bind(self, target) -> None:
        head = self.head
        self.hidden_layers = head.cfg.taps(target.config.num_hidden_layers)
        self.draft_ids = head.target_ids()
        self.vocab = head.cfg.vocab_size
        self.full_vocab = head.cfg.draft_vocab_size == self.vocab and bool((head.d2t == 0).all())
        mine = sum(p.numel() for p in head.parameters())
        if head.lm_head is None:
            mine += head.cfg.vocab_size * head.cfg.hidden_size
        self.cost_hint = mine / max(1, sum(p.numel() for p in target.parameters()))
        try:
            self.fast = packed_head_for(head)
        except ValueError:
            self.fast = None
        self.impl = self.fast or head
        self.runner = _CacheModel(head, self.fast).eval()

    def reset(self) -> None:
        self.kv: KVCache | None = None
        self.rows: list[int] = []
        self.fed: list[int] = []  # per row: pairs in the head's cache (pair t: feature t, token t + 1)
        self.store: dict[int, torch.Tensor] = {}  # request -> fused features [cap, H], from position base
        self.base: dict[int, int] = {}  # request -> first position stored (pairs before it are never fed)
        self.have: dict[int, int] = {}  # request -> positions stored end here
        self.restart: set[int] = set()  # requests whose states had a gap: their cache starts again
        self.last_h: torch.Tensor | None = None  # [B, H] output of each row's last committed pair
        self.caught_up = 0  # the most pairs a row fed at the last catch-up
        self.tree = None
        # taps handed over with a zero budget, not fused yet: (taps [B, n, L*H_t], first positions,
        # lengths, request ids) per call, oldest first
        self.pending: list[tuple[torch.Tensor, list[int], list[int], list[int]]] = []

    def draft_cost_hints(self) -> dict[str, float]:
        """Share of the target's parameters one draft token reads (the head, and the target's
        lm_head when the head borrows it)."""
        return {self.name: self.cost_hint}

    # -- committed pairs --------------------------------------------------------------------------

    def _tapped(self, ctx) -> tuple[torch.Tensor, list[int], list[int], list[int]] | None:
        """The step's new hidden states as (taps ``[B, n, L*H_t]``, first positions, lengths,
        request ids), or None when there are none."""
        if not self.hidden_layers or ctx.hidden_states is None:
            return None
        taps = torch.cat([ctx.hidden_states[i] for i in self.hidden_layers], -1)
        return taps, ctx.hidden_positions.tolist(), ctx.hidden_lengths.tolist(), list(ctx.row_ids)

    def _keep_features(self, ctx) -> None:
        """Keep the step's taps unfused until the next draft (a zero budget's hand-over): the
        ``fc`` streams its weights once for all of them then, not once per step.  At most
        ``MAX_PENDING`` steps wait: a head that keeps not drafting fuses them in bulk."""
        tapped = self._tapped(ctx)
        if tapped is not None:
            self.pending.append(tapped)
        if len(self.pending) >= MAX_PENDING:
            self._fuse(self.pending)
            self.pending = []

    def _take_features(self, ctx) -> None:
        """Fuse the kept and the step's taps into each request's feature store."""
        entries, self.pending = self.pending, []
        tapped = self._tapped(ctx)
        if tapped is not None:
            entries.append(tapped)
        if entries:
            self._fuse(entries)

    @torch.inference_mode()
    def _fuse(self, entries: list[tuple[torch.Tensor, list[int], list[int], list[int]]]) -> None:
        """One ``fc`` call over every entry's taps, then each entry's features into the store, in order."""
        width = entries[0][0].shape[-1]
        flat = torch.cat([t.reshape(-1, width) for t, *_ in entries]) if len(entries) > 1 else entries[0][0].reshape(-1, width)
        fused = self.impl.fuse(flat.to(self.head.fc.weight.dtype))  # [sum of B * n, H]
        at = 0
        for taps, firsts, lengths, rows in entries:
            B, n = taps.shape[0], taps.shape[1]
            self._store_features(fused[at: at + B * n].view(B, n, -1), firsts, lengths, rows)
            at += B * n

    def _store_features(self, g: torch.Tensor, firsts: list[int], lengths: list[int], rows: list[int]) -> None:
        """Append fused features ``g [B, n, H]`` (row b's positions ``firsts[b]`` ..) to the store."""
        for b, rid in enumerate(rows):
            first, n = firsts[b], lengths[b]
            have = self.have.get(rid, 0)
            if n == 0 or first + n <= have:
                continue
            if first > have:  # a gap (the engine keeps at most ~1k states per row): start again from here
                self.store.pop(rid, None)
                self.base[rid] = have = first
                self.restart.add(rid)
            base = self.base.setdefault(rid, 0)
            buf = self.store.get(rid)
            end = first + n
            if buf is None or buf.shape[0] < end - base:
                grown = g.new_zeros(max(end - base, 2 * (0 if buf is None else buf.shape[0]), 64), g.shape[-1])
                if buf is not None:
                    grown[: have - base] = buf[: have - base]
                buf = self.store[rid] = grown
            buf[have - base: end - base] = g[b, have - first: n]
            self.have[rid] = end

    def _sync_rows(self, ctx) -> None:
        rows = list(ctx.row_ids)
        if self.kv is not None and rows == self.rows:
            return
        if self.kv is not None and set(rows) <= set(self.rows):
            pos = {r: i for i, r in enumerate(self.rows)}
            keep = [pos[r] for r in rows]
            self.kv.select_rows(torch.tensor(keep, device=ctx.device))
            self.fed = [self.fed[i] for i in keep]
            self.last_h = self.last_h[keep] if self.last_h is not None else None
        else:
            cap = max(len(s) for s in ctx.sequences) + 2 * self.max_draft + 16
            self.kv = KVCache(self.runner, ctx.batch, ctx.device, capacity=cap)
            self.fed = [0] * ctx.batch
            self.last_h = None
        self.rows = rows

    @torch.inference_mode()
    def catch_up(self, ctx) -> torch.Tensor:
        """Roll the head's cache back to its committed pairs, feed the pairs committed since,
        and return each row's last committed pair's output ``[B, H]`` (the root of a draft)."""
        self._take_features(ctx)
        self._sync_rows(ctx)
        for b, rid in enumerate(ctx.row_ids):
            if rid in self.restart:
                self.fed[b] = 0
                self.restart.discard(rid)
        self.kv.truncate(list(self.fed))
        seqs = ctx.sequences
        # absolute positions t of the pairs to feed: [base + fed, len - 1)
        new = [(self.base.get(r, 0) + self.fed[b], len(seqs[b]) - 1) for b, r in enumerate(ctx.row_ids)]
        self.caught_up = max((e - s for s, e in new), default=0)
        if ctx.batch == 1:
            self._feed_one(ctx, *new[0])
            return self.last_h
        width = max(e - s for s, e in new)
        H = self.head.cfg.hidden_size
        if width > 0:
            ids = torch.zeros(ctx.batch, width, dtype=torch.long, device=ctx.device)
            feats = torch.zeros(ctx.batch, width, H, dtype=self.head.fc.weight.dtype, device=ctx.device)
            valid = torch.zeros(ctx.batch, width, dtype=torch.bool, device=ctx.device)
            for b, (s, e) in enumerate(new):
                if e <= s:
                    continue
                rid = ctx.row_ids[b]
                if self.have.get(rid, 0) < e:
                    raise LightSpecError(f"eagle3: no hidden states for request {rid} up to position {e - 1}")
                ids[b, : e - s] = torch.tensor(seqs[b][s + 1: e + 1], device=ctx.device)
                base = self.base.get(rid, 0)
                feats[b, : e - s] = self.store[rid][s - base: e - base]
                valid[b, : e - s] = True
            self.runner.features = feats
            out = self.kv.forward(ids, None if bool(valid.all()) else valid)
            last = torch.tensor([max(0, e - s - 1) for s, e in new], device=ctx.device)
            h = out.hidden[torch.arange(ctx.batch, device=ctx.device), last]
            if self.last_h is not None:
                moved = torch.tensor([e > s for s, e in new], device=ctx.device)
                h = torch.where(moved[:, None], h, self.last_h)
            self.last_h = h
            self.fed = [f + max(0, e - s) for f, (s, e) in zip(self.fed, new)]
        return self.last_h

    def _feed_one(self, ctx, s: int, e: int) -> None:
        """``catch_up`` for a single row: feed its pairs ``[s, e)`` (no padding, no masks)."""
        if e <= s:
            return
        rid = ctx.row_ids[0]
        if self.have.get(rid, 0) < e:
            raise LightSpecError(f"eagle3: no hidden states for request {rid} up to position {e - 1}")
        base = self.base.get(rid, 0)
        self.runner.features = self.store[rid][None, s - base: e - base]
        ids = torch.tensor([ctx.sequences[0][s + 1: e + 1]], device=ctx.device)
        self.last_h = self.kv.forward(ids, None).hidden[:, -1]
        self.fed[0] += e - s

    # -- distributions ------------------------------------------------------------------------------

    def target_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h ``[.., H]`` → logits over the target's vocabulary ``[.., V]`` (-inf outside the draft vocabulary)."""
        d = self.impl.draft_logits(h).float()
        if self.full_vocab:
            return d
        out = d.new_full((*d.shape[:-1], self.vocab), float("-inf"))
        out[..., self.draft_ids] = d
        return out

    def _target_logprobs(self, h: torch.Tensor) -> torch.Tensor:
        """``log_softmax(target_logits(h))``, normalised over the draft vocabulary before it is
        spread over the target's (the same values, half the work at 4,096 of 8,192 ids)."""
        d = torch.log_softmax(self.impl.draft_logits(h).float(), -1)
        if self.full_vocab:
            return d
        out = d.new_full((*d.shape[:-1], self.vocab), float("-inf"))
        out[..., self.draft_ids] = d
        return out

    # -- chain drafting -------------------------------------------------------------------------------

    def _advance(self, tok: torch.Tensor, h: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """Feed one drafted token per row ``tok [B]`` after outputs ``h [B, H]``; return the new outputs."""
        self.runner.features = self.head.feedback(h)[:, None]
        return self.kv.forward(tok[:, None], None if valid is None else valid[:, None]).hidden[:, 0]

    @hookimpl
    def lightspec_propose(self, ctx) -> DraftProposal | None:
        if max(ctx.max_draft_list, default=0) <= 0:
            # a composition's zero budget only hands over the new hidden states: keep them, and
            # feed the head at its next draft, in one forward over every pair since
            # (docs/design/eagle3.md, "Combinations and hidden states")
            self._keep_features(ctx)
            return None
        t0 = time.perf_counter()
        with torch.inference_mode():
            h = self.catch_up(ctx)
            # a catch-up longer than a step's accepted tokens (the prompt, tokens decoded while
            # the head did not draft) is the drafter's setup, not what a draft token costs
            setup = time.perf_counter() - t0 if self.caught_up > self.max_draft + 1 else 0.0
            limits = [min(m, self.max_draft) for m in ctx.max_draft_list]
            if max(limits) == 0:
                return None
            if ctx.prefix is not None:  # a cascade: continue after what earlier drafters proposed
                pl, pre = ctx.prefix_lengths.tolist(), ctx.prefix
                for j in range(max(pl)):
                    on = torch.tensor([j < n for n in pl], device=ctx.device)
                    h = torch.where(on[:, None], self._advance(pre[:, j].to(ctx.device), h, on), h)
            proposal = self._draft_chain(ctx, h, limits)
            self.kv.truncate(list(self.fed))
        ctx.timer.record(self.name, time.perf_counter() - t0, int(proposal.lengths.max()), setup_s=setup)
        return proposal

    def _draft_chain(self, ctx, h: torch.Tensor, limits: list[int]) -> DraftProposal:
        """Draft up to ``limits[b]`` tokens per row from the root outputs ``h [B, H]``.  A row
        stops at its limit or after a draft whose peak probability is below its
        ``min_confidence``; the loop ends when every row has stopped.  The per-token work is
        the head's forward, its logits, a softmax and a max: the rest (entropies, the
        proposal's tensors) is computed once after the loop (at batch 1 a tensor operation
        costs ~10 us here, a draft token's arithmetic ~200 us)."""
        B, dev, sampling = ctx.batch, ctx.device, ctx.sampling
        k_max = max(limits)
        # drafting works over the draft vocabulary (N ids); tokens map to the target's at the end
        N = self.draft_ids.numel()
        toks, peaks, dists, warped = [], [], [], []
        # batch 1: the stopping rule on Python numbers (no tensor operation per token)
        floor = float(ctx.min_confidence[0]) if B == 1 else None
        limit_t = None if B == 1 else torch.tensor(limits, device=dev)
        min_conf = None if B == 1 else ctx.min_confidence
        active = None if B == 1 else limit_t > 0
        lengths = None if B == 1 else torch.zeros(B, dtype=torch.long, device=dev)
        for j in range(k_max):
            logits = self.impl.draft_logits(h).float()  # [B, N]
            p = torch.softmax(logits, -1)
            if p.device.type == "cpu":  # NumPy's max and argmax: ~3 us each, PyTorch's max ~23 us
                pn = p.numpy()
                peak, arg = torch.from_numpy(pn.max(-1)), torch.from_numpy(pn.argmax(-1))
            else:
                peak, arg = p.max(-1)
            if sampling.greedy:
                tok = arg
            else:
                q = warped_probs(logits, sampling)
                tok = (q / exponential_noise(ctx.generators, N, dev)).argmax(-1)
                warped.append(q)
            if not self.full_vocab:
                tok = self.draft_ids[tok]
            toks.append(tok)
            peaks.append(peak)
            dists.append(p)
            if B == 1:
                if j + 1 >= limits[0] or float(peak) < floor:
                    break
            else:
                lengths += active.long()
                active = active & (lengths < limit_t) & (peak >= min_conf)
                if not bool(active.any()):
                    break
            h = self._advance(tok, h, None)
        k = len(toks)
        if B == 1:
            lengths = torch.full((1,), k, dtype=torch.long, device=dev)
        ent = torch.special.entr(torch.stack(dists, 1)).sum(-1)  # [B, k]
        probs = None if sampling.greedy else torch.stack(warped, 1)
        return DraftProposal(tokens=torch.stack(toks, 1), lengths=lengths, probs=self._report(probs, k),
                             confidence=torch.stack(peaks, 1), entropy=ent, source=self.name)

    def _report(self, probs: torch.Tensor | None, k: int):
        """``probs [B, k_max, N]`` over the draft vocabulary → dense ``[B, k, V]`` for a
        whole-vocabulary head; ``SparseProbs`` over the draft vocabulary (or its ``top_k_probs``
        largest) otherwise."""
        if probs is None:
            return None
        probs = probs[:, :k]
        if self.top_k_probs:
            top = probs.topk(min(self.top_k_probs, probs.shape[-1]), -1)
            ids = top.indices if self.full_vocab else self.draft_ids[top.indices]
            return SparseProbs(ids=ids, probs=top.values)
        if self.full_vocab:
            return probs
        return SparseProbs(ids=self.draft_ids.expand(probs.shape[0], k, -1).contiguous(), probs=probs)

    # -- tree expansion (called by lightspec-tree's eagle3_tree) ------------------------------------------

    def tree_start(self, ctx) -> torch.Tensor:
        """Begin a tree for every row: catch up with the committed tokens and return the
        children distribution of each row's root (its last committed token) as log-probs
        ``[B, V]`` float32 over the target's vocabulary (-inf outside the draft vocabulary;
        temperature 1, unwarped)."""
        with torch.inference_mode():
            h = self.catch_up(ctx)
            B = ctx.batch
            self.tree = {
                "h": [h[:, None]],  # per tree_step call: outputs [B, F, H]; the root first
                "depth": [torch.zeros(B, 1, dtype=torch.long, device=ctx.device)],
                "base": self.kv.cols,
                "committed": self.kv.valid[:, : self.kv.cols].clone(),
                "anc": torch.zeros(B, 0, 0, dtype=torch.bool, device=ctx.device),
                "root_pos": torch.tensor(self.fed, device=ctx.device) - 1,
                "chain": 0,  # nodes added as a chain (each the child of the one before) and no others
            }
            return self._target_logprobs(h)

    def tree_step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Add F nodes per row: ``tokens [B, F]`` int64 and ``parents [B, F]`` int64 (indices of
        nodes added by earlier ``tree_step`` calls since ``tree_start``, in order of addition;
        -1 = the root).  Each node reads its parent's output, attends to the committed pairs
        and its ancestors, at position root + depth.  Returns each new node's children
        distribution as log-probs ``[B, F, V]`` float32."""
        if self.tree is None:
            raise LightSpecError("eagle3: tree_step before tree_start")
        t = self.tree
        B, F = tokens.shape
        dev = tokens.device
        if parents.shape != tokens.shape:
            raise LightSpecError(f"eagle3 tree_step: parents {tuple(parents.shape)} and tokens {tuple(tokens.shape)} differ")
        n_old = t["chain"] or t["anc"].shape[1]
        if bool((parents >= n_old).any()) or bool((parents < -1).any()):
            raise LightSpecError(f"eagle3 tree_step: parents must be -1 or index one of the {n_old} earlier nodes")
        with torch.inference_mode():
            if F == 1 and t["chain"] == n_old and bool((parents == n_old - 1).all()):
                # the tree is a chain so far: append the node as the chain drafter does (the cache's
                # causal mask and positions are the tree's here), with no tree mask to build
                self.runner.features = self.head.feedback(t["h"][-1][:, -1])[:, None]
                hidden = self.kv.forward(tokens, None).hidden
                t["h"].append(hidden)
                t["depth"].append(t["depth"][-1][:, -1:] + 1)
                t["chain"] += 1
                return self._target_logprobs(hidden)
            if t["chain"]:  # leaving the chain: its ancestor rows, each node over itself and those before
                n = t["chain"]
                t["anc"] = torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(B, n, n).contiguous()
                t["chain"] = 0
            h_all = torch.cat(t["h"], 1)  # [B, 1 + n_old, H]: root, then the nodes
            depth_all = torch.cat(t["depth"], 1)
            src = parents + 1  # 0 = the root
            feat = h_all.gather(1, src[:, :, None].expand(-1, -1, h_all.shape[-1]))
            depth = depth_all.gather(1, src) + 1
            # ancestors-or-self among all nodes: a new node's row is its parent's, plus itself
            anc_old = t["anc"]
            pad = torch.zeros(B, 1, n_old, dtype=torch.bool, device=dev)
            par_rows = torch.cat([pad, anc_old], 1).gather(1, src[:, :, None].expand(-1, -1, n_old))  # [B, F, n_old]
            anc_new = torch.cat([par_rows, torch.eye(F, dtype=torch.bool, device=dev).expand(B, F, F)], 2)
            anc = torch.cat([torch.cat([anc_old, torch.zeros(B, n_old, F, dtype=torch.bool, device=dev)], 2), anc_new], 1)
            mask = torch.cat([t["committed"][:, None, :].expand(B, F, -1), anc_new], 2)[:, None]
            self.runner.features = self.head.feedback(feat)
            out = self.kv.forward(tokens, tree_mask=mask, tree_positions=t["root_pos"][:, None] + depth)
            t["h"].append(out.hidden)
            t["depth"].append(depth)
            t["anc"] = anc
            return self._target_logprobs(out.hidden)

    def tree_commit(self, path=None) -> None:
        """End the tree: its nodes leave the head's cache (the accepted ones are fed again, with
        the target's features, by the next ``catch_up``).  ``path`` is accepted and unused."""
        self.tree = None
        if self.kv is not None:
            with torch.inference_mode():  # the cache's tensors were made in inference mode
                self.kv.truncate(list(self.fed))
