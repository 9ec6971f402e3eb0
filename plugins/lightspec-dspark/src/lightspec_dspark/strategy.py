"""The ``dspark`` and ``dflash`` drafting strategies: one block of up to ``block_size`` tokens per
step from one non-causal forward of the drafter.

Per step and row: the target states of the newly committed tokens (``ctx.hidden_states`` of the
tapped layers) become context keys/values of every draft layer (kept per request: a committed
token's context entry never changes, so nothing is rolled back); the block
``[last token, mask x (gamma - 1)]`` at positions ``len(seq) - 1 ...`` attends to that context
and to itself; then, slot by slot, the Markov bias of the previous drafted token is added, the
token is chosen (argmax, or drawn from the warped distribution with the row's generator) and the
confidence ``sigmoid(proj([h_k; W1[x_{k-1}]]))`` is read.  The proposal's ``confidence`` is the
*survival* (running product of the per-slot confidences): the probability the drafter gives to
the whole prefix up to that slot being accepted.  Without a confidence head the per-slot
confidence is the draft's peak probability.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from lightspec_core import (
    DraftProposal,
    InvalidValueError,
    LightSpecError,
    SparseProbs,
    exponential_noise,
    hookimpl,
    model_folder,
    warped_probs,
)

from .checkpoint import load_drafter
from .config import CheckpointError, read_config
from .packed import packed_drafter_for

ZOO_HEAD = "dspark"
# a skipped drafter keeps at most this many steps' states unprocessed, then ingests them in one call
MAX_PENDING = 64


def zoo_head_for(target) -> Path | None:
    """The zoo's DSpark head when ``target`` is the zoo target (same folder), else None."""
    try:
        import lightspec_zoo
    except ImportError:
        return None
    head = lightspec_zoo.MODELS_DIR / ZOO_HEAD
    name = str(getattr(target.config, "_name_or_path", "") or getattr(target, "name_or_path", "") or "")
    try:
        zoo_target = lightspec_zoo.model_path()
    except Exception:  # the zoo's weights are not installed
        return None
    if name and Path(name).resolve() == zoo_target.resolve() and (head / "config.json").is_file():
        return head
    return None


def _is_block_drafter(name) -> bool:
    """Whether ``name`` (a folder or a hub id; only a hub id's config.json is fetched) is a
    DSpark/DFlash drafter's (``block_size``, at the top or under SpecForge's ``dflash_config``),
    not e.g. a plain draft LM passed for other strategies."""
    import json

    try:
        folder = model_folder(name, what="DSpark/DFlash checkpoint", allow_patterns=("config.json",))
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, LightSpecError):
        return False
    return isinstance(raw, dict) and ("block_size" in raw or "block_size" in (raw.get("dflash_config") or {}))


class _RowContext:
    """One request's context keys/values per draft layer: ``[nkv, T, hd]`` with spare capacity,
    for the states of positions ``first .. first + length - 1`` (each key rotated at its own
    position, so the context may start anywhere)."""

    def __init__(self, layers: int, first: int = 0):
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers
        self.first = first
        self.length = 0

    @property
    def end(self) -> int:
        """The position of the first state this row does not hold."""
        return self.first + self.length

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[1]
        old = self.k[layer]
        if old is None or old.shape[1] < self.length + n:
            cap = max(64, 2 * (self.length + n))
            grow = lambda t, like: torch.cat([t[:, : self.length], like.new_zeros(like.shape[0], cap - self.length, like.shape[2])], 1) \
                if t is not None else like.new_zeros(like.shape[0], cap, like.shape[2])  # noqa: E731
            self.k[layer], self.v[layer] = grow(old, k), grow(self.v[layer], v)
        self.k[layer][:, self.length : self.length + n] = k
        self.v[layer][:, self.length : self.length + n] = v


class DSparkStrategy:
    """Block drafting with a DSpark (or DFlash) checkpoint; see the module docstring."""

    name = "dspark"
    confidence_is_survival = True  # read by the ``adaptive`` wrapper

    def __init__(self, checkpoint: str | None = None, max_draft: int | None = None, require: str | None = None):
        if max_draft is not None and (isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1):
            raise InvalidValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1 (default: the block size)")
        self.checkpoint = checkpoint
        self.max_draft = max_draft
        self.require = require  # "dflash": refuse checkpoints with a Markov head
        self.drafter = None
        self.rows: dict[int, _RowContext] = {}
        # states handed over with a zero budget, not ingested yet: (taps [B, n, L*H_t], first
        # positions, lengths, request ids) per call, oldest first; at most MAX_PENDING
        self.pending: list[tuple[torch.Tensor, list[int], list[int], list[int]]] = []
        self.cost_hint = 0.1

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self, env) -> None:
        """Load the checkpoint: ``checkpoint=PATH``, else ``--draft-model PATH`` when it is a DSpark
        folder, else the zoo's head when the target is the zoo target."""
        path = self.checkpoint
        dm = env.draft_model
        progress = getattr(env, "progress", False)
        if path is not None:
            path = model_folder(path, what="DSpark/DFlash checkpoint", progress=progress)
        given = isinstance(dm, (str, Path)) and bool(str(dm))
        if path is None and given and _is_block_drafter(dm):
            path = model_folder(dm, what="DSpark/DFlash checkpoint", progress=progress)
        if path is None:
            path = zoo_head_for(env.target)
        if path is None:
            told = f" (--draft-model {str(dm)!r} is no DSpark/DFlash folder: its config has no block_size)" if given else ""
            raise InvalidValueError(f"strategy {self.name!r} needs a DSpark/DFlash checkpoint: pass checkpoint=PATH "
                                    f"(--strategy {self.name}:checkpoint=PATH, or --draft-model PATH; a folder or a hub id); "
                                    f"only the zoo target has a default head{told}")
        cfg, _ = read_config(path)
        if self.require == "dflash" and cfg.kind != "dflash":
            raise CheckpointError(f"{path}: markov_rank={cfg.markov_rank} is a DSpark checkpoint; use strategy 'dspark' "
                                  "(strategy 'dflash' takes checkpoints without a Markov head)")
        dtype = next(env.target.parameters()).dtype
        self.drafter = load_drafter(path, env.target, dtype=dtype, device=env.device)
        self.fast = packed_drafter_for(self.drafter)  # the CPU kernels' forward, where it runs
        self.impl = self.fast or self.drafter
        self.path = str(path)
        cfg = self.drafter.cfg
        self.block = min(cfg.block_size, self.max_draft or cfg.block_size)
        self.hidden_layers = [i + 1 for i in cfg.target_layer_ids]
        # one block forward drafts up to `block` tokens: per token, the share of the target's
        # parameters that forward reads, divided by the block
        own = sum(p.numel() for p in self.drafter.parameters()) + self.drafter.lm_head.weight.numel()
        self.cost_hint = own / max(1, sum(p.numel() for p in env.target.parameters())) / self.block

    def reset(self) -> None:
        self.rows = {}
        self.pending = []

    def draft_cost_hints(self) -> dict[str, float]:
        """Per draft token: the share of the target's parameters a block forward reads, over the block (timing-free)."""
        return {self.name: self.cost_hint}

    # -- drafting -------------------------------------------------------------------------

    def _tapped(self, ctx) -> tuple[torch.Tensor, list[int], list[int], list[int]] | None:
        """The step's new states: (taps ``[B, n, L*H_t]``, first positions, lengths, request ids);
        None when the step hands over none."""
        if ctx.hidden_states is None or max((int(n) for n in ctx.hidden_lengths), default=0) == 0:
            return None
        taps = torch.cat([ctx.hidden_states[i] for i in self.hidden_layers], dim=-1)
        return taps, [int(p) for p in ctx.hidden_positions], [int(n) for n in ctx.hidden_lengths], list(ctx.row_ids)

    def _ingest(self, ctx) -> None:
        """Append the newly committed tokens' context keys/values to each row's store: the states
        kept from zero-budget calls, then this step's."""
        tapped = self._tapped(ctx)
        self._ingest_entries(self.pending + ([tapped] if tapped is not None else []))
        self.pending = []  # only once ingested: a failure keeps them for the next call

    def _keep(self, ctx) -> None:
        """A zero budget's hand-over: keep the step's states for the next draft (ingested in
        bulk once ``MAX_PENDING`` steps wait)."""
        tapped = self._tapped(ctx)
        if tapped is not None:
            self.pending.append(tapped)
        if len(self.pending) >= MAX_PENDING:
            self._ingest_entries(self.pending)
            self.pending = []

    def _ingest_entries(self, entries: list[tuple[torch.Tensor, list[int], list[int], list[int]]]) -> None:
        """The entries' states, in order, through one ``fc`` and one key/value projection per
        layer for all of them (the weights stream once, not once per step).

        States a row already holds are skipped: after a ``propose`` that raised, the engine
        hands the states since the last successful call again (a committed token's state never
        changes).  A row whose states start after the ones it holds (a gap: the engine keeps a
        bounded number of states while calls fail) starts its context again there."""
        ahead: dict[int, int] = {}  # per request: its end once the entries before are appended
        pieces: list[tuple[_RowContext, torch.Tensor, int]] = []  # (row, taps [n, L*H_t], first position)
        for taps, firsts, lengths, rids in entries:
            for b, rid in enumerate(rids):
                first, n = firsts[b], lengths[b]
                row = self.rows.get(rid)
                have = ahead.get(rid, row.end if row is not None else 0)
                if row is None or first > have:
                    row = self.rows[rid] = _RowContext(len(self.drafter.layers), first)
                    have = first
                skip = have - first
                ahead[rid] = max(have, first + n)
                if n > skip:
                    pieces.append((row, taps[b, skip:n], first + skip))
        if not pieces:
            return
        x = torch.cat([t for _, t, _ in pieces])[None]  # [1, N, L*H_t]
        positions = torch.cat([first + torch.arange(t.shape[0]) for _, t, first in pieces]).to(x.device)[None]
        kv = self.impl.context_kv(self.impl.features(x), positions)
        at = 0
        for row, t, _ in pieces:
            n = t.shape[0]
            for layer, (k, v) in enumerate(kv):
                row.append(layer, k[0, :, at: at + n], v[0, :, at: at + n])
            row.length += n
            at += n

    def _context(self, ctx, dtype, device):
        """Per layer ``(k, v)`` ``[B, nkv, T, hd]`` padded to the longest row, and ``valid [B, T]``
        (a single row: views of its store, and None: every column valid)."""
        rows = [self.rows[rid] for rid in ctx.row_ids]
        if len(rows) == 1 and rows[0].length:
            r = rows[0]
            return [(r.k[i][None, :, : r.length], r.v[i][None, :, : r.length]) for i in range(len(r.k))], None
        T = max(r.length for r in rows)
        a = self.drafter.layers[0].self_attn
        B = len(rows)
        out = []
        for layer in range(len(self.drafter.layers)):
            k = torch.zeros(B, a.nkv, T, a.hd, dtype=dtype, device=device)
            v = torch.zeros_like(k)
            for b, r in enumerate(rows):
                if r.length:
                    k[b, :, : r.length] = r.k[layer][:, : r.length]
                    v[b, :, : r.length] = r.v[layer][:, : r.length]
            out.append((k, v))
        valid = torch.arange(T, device=device)[None, :] < torch.tensor([r.length for r in rows], device=device)[:, None]
        return out, valid

    @torch.inference_mode()
    @hookimpl
    def lightspec_propose(self, ctx):
        limits = [min(self.block, m) for m in ctx.max_draft_list]
        if max(limits) == 0:
            # a composition's zero budget only hands over the new states: keep them for the
            # next draft, which ingests them all at once
            self._keep(ctx)
            return None
        self._ingest(ctx)
        t0 = time.perf_counter()
        d, cfg = self.drafter, self.drafter.cfg
        B, dev, gamma = ctx.batch, ctx.device, max(limits)
        dtype = d.fc.weight.dtype
        ctx_kv, valid = self._context(ctx, dtype, dev)
        last = torch.tensor([s[-1] for s in ctx.sequences], device=dev)
        ids = torch.full((B, gamma), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = last
        start = torch.tensor([len(s) - 1 for s in ctx.sequences], device=dev)
        positions = start[:, None] + torch.arange(gamma, device=dev)
        # a single row sees every column: no mask.  The block's slots attend to each other (one
        # non-causal forward), so a slot's draft depends on how many slots it sees: sampled,
        # each row sees only its own limit's slots, as it would alone, so its draft, hence its
        # seeded sample, does not depend on the batch; greedy rows see the whole block
        if valid is None:
            mask = None
        else:
            block = valid.new_ones(B, gamma, gamma)
            if not ctx.sampling.greedy:
                own = torch.tensor(limits, device=dev)
                block = (torch.arange(gamma, device=dev)[None, None, :] < own[:, None, None]).expand(B, gamma, gamma)
            mask = torch.cat([valid[:, None, :].expand(B, gamma, -1), block], dim=-1)[:, None]
        h = self.impl.backbone(ids, positions, ctx_kv, mask)  # [B, gamma, H]
        base = d.base_logits(h)
        tokens = torch.zeros(B, gamma, dtype=torch.long, device=dev)
        conf = torch.ones(B, gamma, device=dev)
        ent = torch.zeros(B, gamma, device=dev)
        greedy = ctx.sampling.greedy
        probs = None if greedy else torch.zeros(B, gamma, base.shape[-1], device=dev)
        prev, state = last, None
        prevs = []  # the target id before each slot (the confidence head reads it)
        for k in range(gamma):
            logits = base[:, k].float()
            if d.markov_head is not None:
                bias, state = d.markov_head.step(prev, h[:, k], state)
                logits = logits + bias.float()
            prevs.append(prev)
            # the full softmax (entropy, peak) only where something reads it: sampling, or no confidence head
            p = logits.softmax(-1) if (d.confidence_head is None or not greedy) else None
            if p is not None:
                ent[:, k] = torch.special.entr(p).sum(-1)
            if greedy:
                tok = logits.argmax(-1)
            else:
                q = warped_probs(logits, ctx.sampling)
                tok = (q / exponential_noise(ctx.generators, q.shape[-1], dev)).argmax(-1)
                probs[:, k] = q
            if d.confidence_head is None:
                conf[:, k] = p.gather(1, tok[:, None])[:, 0]
            prev = d.to_target_ids(tok)
            tokens[:, k] = prev
        if d.confidence_head is not None:  # every slot's at once: sigmoid(proj([h_k; W1[x_{k-1}]]))
            conf = torch.sigmoid(d.confidence_logit(h, torch.stack(prevs, 1)).float())
        survival = conf.cumprod(-1)
        lengths = torch.tensor(limits, device=dev)
        # like every confidence-aware drafter: a row stops after a slot whose own confidence is below the budget's floor
        low = (conf < ctx.min_confidence.to(dev)[:, None]).float()
        stop = torch.where(low.any(-1), low.argmax(-1) + 1, torch.full_like(lengths, gamma))
        lengths = torch.minimum(lengths, stop)
        k = int(lengths.max())
        ctx.timer.record(self.name, time.perf_counter() - t0, k)
        if k == 0:
            return None
        if probs is not None and d.d2t is not None:
            ids_t = d.to_target_ids(torch.arange(base.shape[-1], device=dev)).expand(B, k, -1)
            probs = SparseProbs(ids=ids_t, probs=probs[:, :k])
        elif probs is not None:
            probs = probs[:, :k]
        entropy = ent[:, :k] if (not greedy or d.confidence_head is None) else None
        return DraftProposal(tokens=tokens[:, :k], lengths=lengths, probs=probs, confidence=survival[:, :k],
                             entropy=entropy, source=self.name)


class DFlashStrategy(DSparkStrategy):
    """Block drafting with a DFlash checkpoint (no Markov or confidence head)."""

    name = "dflash"

    def __init__(self, checkpoint: str | None = None, max_draft: int | None = None):
        super().__init__(checkpoint=checkpoint, max_draft=max_draft, require="dflash")
