"""Drafting with a causal LM: a separate small model (``draft_model``) or the target's
own first layers (``layerskip``).  Both keep their own KV cache in step with the
target: before drafting, each row's cache is cut back to the longest prefix that the
target accepted and the tokens it lacks are fed in one batched forward.

Draft forwards go through ``lean_decoder`` when the architecture is one it implements
(about half the time of the HF forward for small drafts); otherwise through the model's
own forward.  ``lean=False`` forces the HF forward.

A token map (``token_map.json`` in the draft's folder, or ``token_map=PATH``) limits the
draft model's output layer to frequent tokens plus the request's own tokens (FR-Spec's
idea; SGLang's ``--speculative-token-map``): the lm_head is most of a small draft's
weights, and the target's verification keeps the output exact whatever is proposed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..errors import LightSpecError
from ..hookspecs import hookimpl
from ..interfaces import DraftProposal, StepContext
from ..kvcache import KVCache, takes_logits_to_keep
from ..lean_decoder import LeanDecoder, lean_forward
from ..model_parts import choose_exit_layer, decoder_layers, early_exit_view, num_layers
from ..sampling import exponential_noise, warp_logits

TOKEN_MAP_FILE = "token_map.json"


def read_token_map(path: Path, vocab: int) -> torch.Tensor:
    """A token map file: JSON, ``{"token_ids": [...]}`` (or a bare list) of the token ids
    a draft may propose besides the request's own tokens, most frequent first."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"token map {path}: cannot read it as JSON ({exc})") from None
    ids = data.get("token_ids") if isinstance(data, dict) else data
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) and 0 <= i < vocab for i in ids)):
        raise ValueError(f"token map {path}: expected a non-empty list 'token_ids' of integers in 0..{vocab - 1}")
    return torch.tensor(ids, dtype=torch.long)


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


class ModelDrafter:
    """Autoregressive drafting with a causal LM that shares the target's tokenizer.

    Per row it stops when ``max_draft`` is reached or when the draft's peak probability
    falls below the budget's ``min_confidence`` (the dynamic draft-length rule).
    """

    name = "draft_model"

    def __init__(self, max_draft: int = 8, model=None, lean: bool = True, token_map: str | None = "auto",
                 max_context: int = 128, batch_context: int = 256):
        if not (isinstance(max_draft, int) and max_draft >= 1):
            raise ValueError(f"max_draft={max_draft!r} is invalid: use an integer >= 1")
        if not (isinstance(max_context, int) and not isinstance(max_context, bool) and max_context >= 0):
            raise ValueError(f"max_context={max_context!r} is invalid: use an integer >= 0 (0: the whole prompt)")
        if not (isinstance(batch_context, int) and not isinstance(batch_context, bool) and batch_context >= 0):
            raise ValueError(f"batch_context={batch_context!r} is invalid: use an integer >= 0 (0: no batch-wide limit)")
        if not isinstance(lean, bool):
            raise ValueError(f"lean={lean!r} is invalid: use true or false")
        if token_map is not None and not isinstance(token_map, str):
            raise ValueError(f"token_map={token_map!r} is invalid: use 'auto', 'none' or the path of a token map JSON file")
        self.max_draft = max_draft
        # the draft model sees at most the last max_context tokens of the prompt: its cache is
        # filled before the first draft of every request (at batch 8 that prefill was 10-15%
        # of a generation), and a small draft gains little from a long context (measured on
        # the zoo draft: agreement with the target 67.3% with the whole prompt, 67.3% with
        # the last 128 tokens, 66.8% with 64)
        self.max_context = max_context
        # ... and that prefill grows with the batch while a draft token's value does not: the
        # prompts' tails together hold at most batch_context tokens (at least 16 per row).
        # Measured (zoo draft, 60 suite prompts): agreement 63.8% with 128 tokens, 62.7% with
        # 32; at batch 8 the draft's prefill of 8 x 128 tokens took 88 ms, ~5 plain steps.
        self.batch_context = batch_context
        self.model = model
        self.lean = lean
        self.token_map = token_map
        self.hot: torch.Tensor | None = None  # [n] the token map's ids, when one applies
        self.cost_hint = 0.1  # set in setup from parameter counts
        self.runner = None  # what draft forwards call: a LeanDecoder or the model itself
        self.kv: KVCache | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self, env) -> None:
        """Load the draft model named by the pipeline (``--draft-model``)."""
        if self.model is None:
            if env.draft_model is None:
                raise LightSpecError("strategy 'draft_model' needs a draft model: pass --draft-model PATH (or draft_model=...)")
            self.model = env.load_draft_model()
        # a draft need not round like HF (the target verifies it): the faster inexact forward
        self.runner = (lean_forward(self.model, exact=False, fuse=True) if self.lean else None) or self.model
        self.keeps_logits = takes_logits_to_keep(self.runner)
        self._check_vocab(env)
        self._load_token_map(self.model)
        self.cost_hint = _params(self.model) / max(1, _params(env.target))

    def _load_token_map(self, model) -> None:
        """``token_map``: 'auto' uses ``token_map.json`` from the drafting model's folder
        when it has one; a path must exist; 'none' (or None) drafts over the whole vocabulary."""
        spec = self.token_map
        self.hot = None
        if spec is None or spec == "none":
            return
        path = Path(getattr(model, "name_or_path", "") or "") / TOKEN_MAP_FILE if spec == "auto" else Path(spec)
        if spec == "auto" and not (str(getattr(model, "name_or_path", "")) and path.is_file()):
            return
        if not path.is_file():
            raise LightSpecError(f"token_map={spec!r}: no such file (use 'auto', 'none' or a token map JSON file)")
        if not isinstance(self.runner, LeanDecoder):
            if spec == "auto":
                return
            raise LightSpecError(f"token_map={spec!r} needs the lean draft forward (lean=true and a "
                                 f"Llama-family draft); this drafter uses the HF forward")
        try:
            self.hot = read_token_map(path, self.vocab)
        except ValueError as exc:
            raise LightSpecError(str(exc)) from None

    def _check_vocab(self, env) -> None:
        drafter = self.model if self.model is not None else env.target
        dv = drafter.get_output_embeddings().weight.shape[0]
        tv = env.target.get_output_embeddings().weight.shape[0]
        if dv < len(env.tokenizer) or tv < len(env.tokenizer):
            raise LightSpecError(
                f"draft model vocabulary ({dv}) does not cover the target tokenizer ({len(env.tokenizer)} tokens): "
                "the draft model must share the target's tokenizer"
            )
        self.vocab = tv

    def context_span(self, batch: int) -> int:
        """How many of each prompt's last tokens the draft's cache starts from, for a batch
        of ``batch`` rows (0: the whole prompt)."""
        spans = [n for n in (self.max_context, self.batch_context // batch if self.batch_context else 0) if n]
        return max(16, min(spans)) if spans else 0

    def reset(self) -> None:
        self.kv = None

    def _context_starts(self, ctx: StepContext, contexts) -> list[int]:
        """Per row: the leading context tokens never fed to the draft, for a new cache.

        Sampled rows start ``max_context`` before their own prompt's end
        (``ctx.prompt_lengths``), whenever the cache is built (a row joined, or a cascade's
        first draft): their drafts, hence their seeded samples, are what they get alone.
        Greedy rows take the cheaper start from their current length and ``batch_context``
        (a cut by the batch's size): the verifier keeps their output the target's."""
        if ctx.sampling.greedy:
            span = self.context_span(ctx.batch)
            return [max(0, len(s) - 1 - span) if span else 0 for s in contexts]
        span = self.max_context
        ends = ctx.prompt_lengths or [len(s) for s in contexts]
        return [max(0, n - 1 - span) if span else 0 for n in ends]

    def draft_cost_hints(self) -> dict[str, float]:
        """A structural estimate of what one draft token costs relative to a target step:
        the share of the target's parameters a draft forward reads.  Timing-free, so the
        budget can use it where decisions must be reproducible (seeded sampling)."""
        return {self.name: self.cost_hint}

    # -- drafting -------------------------------------------------------------------------

    @hookimpl
    def lightspec_propose(self, ctx: StepContext) -> DraftProposal | None:
        limits = [min(m, self.max_draft) for m in ctx.max_draft_list]
        if max(limits) == 0:
            return None
        t0 = time.perf_counter()
        logits = self._fit(self._sync(ctx))  # [B, V] next-token logits of the draft after the context
        # a catch-up (first prefill) is not what a draft token costs
        setup = time.perf_counter() - t0 if self.caught_up > self.max_draft + 1 else 0.0
        B = ctx.batch
        dev = ctx.device
        sampling = ctx.sampling
        k_max = max(limits)
        # per token only the forward, a softmax and its peak; entropies and the proposal's
        # tensors once after the loop (at batch 1 each tensor operation costs ~10 us here)
        toks, peaks, dists, warped = [], [], [], []
        single = B == 1
        floor = float(ctx.min_confidence[0]) if single else None
        limit_t = None if single else torch.tensor(limits, device=dev)
        active = None if single else limit_t > 0
        lengths = None if single else torch.zeros(B, dtype=torch.long, device=dev)
        min_conf = ctx.min_confidence
        for j in range(k_max):
            p = torch.softmax(logits.float(), dim=-1)  # [B, V]
            if p.device.type == "cpu":  # NumPy's max and argmax: ~3 us each, PyTorch's max ~23 us
                pn = p.numpy()
                peak, arg = torch.from_numpy(pn.max(-1)), torch.from_numpy(pn.argmax(-1))
            else:
                peak, arg = p.max(dim=-1)
            if sampling.greedy:
                tok = arg
            else:
                q = warp_logits(logits, sampling).softmax(dim=-1)
                noise = exponential_noise(ctx.generators, q.shape[-1], dev)
                tok = (q / noise).argmax(dim=-1)
                warped.append(q)
            toks.append(tok)
            peaks.append(peak)
            dists.append(p)
            if single:  # the stopping rule on Python numbers
                if j + 1 >= limits[0] or float(peak) < floor:
                    break
                out = self.kv.forward(tok[:, None].to(dev))
                logits = self._fit(out.logits[:, -1])
                self.fed[0].append(int(tok))
                continue
            # a row keeps this token if it is still drafting; it goes on while confident
            lengths += active.long()
            active = active & (lengths < limit_t) & (peak.to(dev) >= min_conf)
            if not bool(active.any()):
                break
            out = self.kv.forward(tok[:, None].to(dev), active[:, None])
            logits = self._fit(out.logits[:, -1])
            for b, (t, on) in enumerate(zip(tok.tolist(), active.tolist())):  # one sync, not 2B
                if on:
                    self.fed[b].append(t)
        k = len(toks)
        if single:
            lengths = torch.full((1,), k, dtype=torch.long, device=dev)
        ctx.timer.record(self.name, time.perf_counter() - t0, k, setup_s=setup)
        return DraftProposal(
            tokens=torch.stack(toks, 1).to(dev),
            lengths=lengths,
            probs=None if sampling.greedy else torch.stack(warped, 1),
            confidence=torch.stack(peaks, 1).to(dev),
            entropy=torch.special.entr(torch.stack(dists, 1)).sum(-1),  # -sum p log p, 0 log 0 = 0
            source=self.name,
        )

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, V_draft]`` → ``[B, V_target]``: vocabularies padded to other
        sizes (e.g. 151936 vs 152064) are cut, or padded with -inf."""
        v = logits.shape[-1]
        if v == self.vocab:
            return logits
        if v > self.vocab:
            return logits[:, : self.vocab]
        pad = logits.new_full((logits.shape[0], self.vocab - v), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _sync(self, ctx: StepContext) -> torch.Tensor:
        """Bring the draft cache to each row's context; return the logits after it [B, V]."""
        B = ctx.batch
        contexts = ctx.sequences
        if ctx.prefix is not None:
            pl = ctx.prefix_lengths.tolist()
            pre = ctx.prefix.tolist()
            contexts = [tuple(seq) + tuple(pre[b][: pl[b]]) for b, seq in enumerate(contexts)]
        if self.kv is not None and not set(ctx.row_ids) <= set(self.row_ids):
            self.kv = None  # a row joined the batch (continuous batching): the draft cache starts again
        if self.kv is None:
            self.kv = KVCache(self.runner, B, ctx.device, capacity=max(len(s) for s in contexts) + 64)
            if self.hot is not None:  # the frequent tokens plus every token of these requests
                mine = torch.tensor([t for seq in contexts for t in seq], dtype=torch.long)
                self.runner.restrict_vocab(torch.unique(torch.cat([self.hot, mine])))
            self.fed = [[] for _ in range(B)]
            self.base = [0] * B  # per row: this many tokens of `fed` are known to match the context
            self.offset = self._context_starts(ctx, contexts)
            self.row_ids = list(ctx.row_ids)
        elif self.row_ids != ctx.row_ids:
            pos = {r: i for i, r in enumerate(self.row_ids)}
            keep = [pos[r] for r in ctx.row_ids]
            self.kv.select_rows(torch.tensor(keep, device=ctx.device))
            self.fed = [self.fed[i] for i in keep]
            self.base = [self.base[i] for i in keep]
            self.offset = [self.offset[i] for i in keep]
            self.row_ids = list(ctx.row_ids)
        keep_n = []
        new = []
        for b in range(B):
            fed, seq = self.fed[b], contexts[b]
            n = min(len(fed), len(seq) - 1)  # always feed at least the newest token
            # sequences only grow: everything before `base` matched last time, compare the rest
            c = min(self.base[b], n)
            while c < n and fed[c] == seq[c]:
                c += 1
            c = max(c, self.offset[b])  # the skipped head is not in the cache, by design
            keep_n.append(c - self.offset[b])
            new.append(seq[c:])
            # until the forward below has run, the cache holds only the matched prefix: if it
            # raises, the next call must not take the new tokens for fed
            self.fed[b] = fed[:c]
            self.base[b] = min(self.base[b], c)
        width = max(len(t) for t in new)
        self.caught_up = width
        if B == 1:  # no padding, no masks: the logits at the last new token
            self.kv.truncate(keep_n)
            ids = torch.tensor([new[0]], dtype=torch.long, device=ctx.device)
            out = self.kv.forward(ids, None, **({"logits_to_keep": 1} if self.keeps_logits else {}))
            self._fed_all(contexts, ctx)
            return out.logits[:, -1]
        self.kv.truncate(torch.tensor(keep_n, device=ctx.device))
        ids = torch.zeros(B, width, dtype=torch.long)
        valid = torch.zeros(B, width, dtype=torch.bool)
        for b, t in enumerate(new):
            ids[b, : len(t)] = torch.tensor(t)
            valid[b, : len(t)] = True
        ids, valid = ids.to(ctx.device), valid.to(ctx.device)
        all_valid = bool(valid.all())
        if isinstance(self.runner, LeanDecoder):
            # the lm_head on each row's last new token only: a ragged catch-up otherwise
            # ran it over every row's last (longest - shortest + 1) positions (zoo draft,
            # batch 8, interleaved: 2.53 -> 2.01 ms at width 2, 3.45 -> 2.41 ms at width 4)
            last = torch.tensor([len(t) - 1 for t in new], device=ctx.device)
            out = self.kv.forward(ids, None if all_valid else valid, last_positions=last)
            self._fed_all(contexts, ctx)
            return out.logits[:, 0]
        # logits only from the shortest row's last position on (the catch-up can be a whole prompt)
        keep = width - min(len(t) for t in new) + 1 if self.keeps_logits else width
        extra = {"logits_to_keep": keep} if self.keeps_logits else {}
        out = self.kv.forward(ids, None if all_valid else valid, **extra)
        self._fed_all(contexts, ctx)
        last = torch.tensor([len(t) - 1 - (width - keep) for t in new], device=ctx.device)
        return out.logits[torch.arange(B, device=ctx.device), last]

    def _fed_all(self, contexts, ctx: StepContext) -> None:
        """The catch-up forward ran: the cache holds every row's whole context."""
        self.fed = [list(seq) for seq in contexts]
        self.base = [len(seq) for seq in ctx.sequences]


class LayerSkipDrafter(ModelDrafter):
    """Self-speculation: draft with the target's first L blocks plus its final norm and
    lm_head (training-free).  ``layers="auto"`` picks L on the first prompt by measuring
    how often the early exit agrees with the full model."""

    name = "layerskip"

    def __init__(self, max_draft: int = 6, layers: int | str = "auto", lean: bool = True):
        # drafts with the target's own head; its cache is copied from the target's, so it
        # sees the whole context at no prefill cost
        super().__init__(max_draft=max_draft, lean=lean, token_map="none", max_context=0, batch_context=0)
        if not (layers == "auto" or (isinstance(layers, int) and layers >= 1)):
            raise ValueError(f"layers={layers!r} is invalid: use 'auto' or an integer >= 1")
        self.layers = layers
        self.target = None

    def setup(self, env) -> None:
        self.target = env.target
        n = num_layers(env.target)
        if self.layers != "auto":
            if self.layers >= n:
                raise ValueError(f"layers={self.layers} is invalid: this model has {n} layers, use 1..{n - 1}")
            self._use_layers(self.layers)
        self._check_vocab(env)

    @hookimpl
    def lightspec_propose(self, ctx: StepContext) -> DraftProposal | None:
        if self.model is None:
            self._use_layers(choose_exit_layer(self.target, ctx.sequences[0]))
        return super().lightspec_propose(ctx)

    def _use_layers(self, n: int) -> None:
        self.layers = n
        self.model = early_exit_view(self.target, n)
        # the target's own blocks: not fused (that would copy the target's weights)
        self.runner = (lean_forward(self.target, n, exact=False) if self.lean else None) or self.model
        self.keeps_logits = takes_logits_to_keep(self.runner)
        blocks = decoder_layers(self.target)[1]
        block_params = [_params(b) for b in blocks]
        head = _params(self.target.get_output_embeddings())
        self.cost_hint = (sum(block_params[:n]) + head) / max(1, sum(block_params) + head)

    def _sync(self, ctx: StepContext) -> torch.Tensor:
        # The draft's blocks are the target's first L blocks, so their keys and values for the
        # committed tokens are already in the target's cache: when far behind (the first draft
        # of a request), copy them instead of recomputing a prefill.
        target_kv = ctx.runner.kv if ctx.runner is not None else None
        behind = max(len(s) - (self.base[b] if self.kv is not None and b < len(self.base) else 0)
                     for b, s in enumerate(ctx.sequences))
        # (only between caches of the same layout: the target's and this runner's, see kvcache)
        same_layout = target_kv is not None and target_kv.per_row == bool(getattr(self.runner, "row_offsets_ok", False))
        if same_layout and ctx.prefix is None and (self.kv is None or self.row_ids != ctx.row_ids or behind > self.max_draft + 1):
            self._seed_from(target_kv, ctx)
        return super()._sync(ctx)

    def _seed_from(self, target_kv: KVCache, ctx: StepContext) -> None:
        """Copy the target's cache of blocks [0, L) — all committed tokens but the newest."""
        kv = KVCache(self.runner, ctx.batch, ctx.device, capacity=target_kv.cache.capacity, per_row=target_kv.per_row)
        kv.copy_from(target_kv, self.layers)
        self.kv = kv
        self.fed = [list(seq[:-1]) for seq in ctx.sequences]
        self.base = [len(seq) - 1 for seq in ctx.sequences]
        self.offset = [0] * ctx.batch
        self.row_ids = list(ctx.row_ids)
