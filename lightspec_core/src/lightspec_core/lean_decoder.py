"""A lean forward for Llama-family decoders, used by the model drafters and the target runner.

(One module, over 400 lines, on purpose: its three forwards (the exact op-by-op one, the
fast one for drafts, the chained one) share the block preparation and the mask and rotary
helpers, and the exact and chained ones must stay bit-identical to each other and to HF's;
keeping them side by side keeps that contract in one place.)

Why: a drafter runs one forward per drafted token, and for small models much of a
Hugging Face forward is not arithmetic but module dispatch, mask construction and output
bookkeeping.  Measured here (1 thread, fp32, one token over a 300-token cache, median of
200 interleaved calls): the zoo's 2.5M-parameter draft takes 1.40 ms through
``LlamaForCausalLM.forward`` and 0.90 ms through this module.

Drafts run here whenever the architecture allows.  The *target* runs here only when
``exact_lean_target`` has checked, on a probe (a ragged batch with padding holes, then
one- and multi-token steps), that this forward reproduces the model's HF forward bit for
bit; otherwise the target keeps its HF forward.  For a draft a rounding difference could
only change which tokens are proposed; for the target it could change what is emitted,
hence the check.  (Measured the same way, the zoo's 15.5M-parameter target: 6.6 ms
through HF, 5.3 ms here, identical logits.)

On a model with LightSpec's CPU kernels installed (``PackedLinear``, ``KernelRMSNorm``,
the ``"lightspec_cpu"`` attention: ``load_model``'s default on the CPU in float32), the lean
forward calls the same kernels the model's modules call, with fewer calls: q/k/v and
gate/up as one packed call each (each output column is computed on its own, so the numbers
are the separate calls'), the residual add fused into the next norm, and q and k rotated
in one call that rounds exactly as HF's elementwise ops.  The zoo target's step then takes
3.0-3.3 ms instead of 7.0 (one token over 400 cached, 1 thread, the 2-core VM).  Once the
cache's slabs exist (after the first forward), each block runs as one ``cpu_decoder`` call
that chains those kernels in C (``_forward_chained``), and the whole step is one call
where the C SwiGLU activation rounds as PyTorch's (checked at load): the same values in
the same order, so the same logits bit for bit, without ~25 Python-level calls per block:
1.9 ms per one-token step over 400 cached tokens.  ``LIGHTSPEC_CHAINED=0`` keeps the
op-by-op forward.  ``forward(..., head=False)`` returns the final hidden states instead of
logits (``LeanOutput.hidden``): the engine's greedy verify applies the lm_head (``head_logits``)
only to the positions it reaches.

Supported: ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` without sliding-window
attention (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, optional q/k
biases, qwen3's q/k norms).  ``lean_forward(model)`` returns ``None`` for anything else
and the drafter keeps the HF forward.

The call signature is the subset of an HF causal LM's ``forward`` that
``KVCache.forward`` uses, so a ``LeanDecoder`` drops in for the model:

* ``input_ids [B, q]``, ``position_ids [B, q]``;
* ``attention_mask [B, cols]`` (bool, one flag per cache column including the q new
  ones) or ``None`` when every column is a real token of every row;
* ``cache``: a ``SlabCache``; keys and values are appended through ``cache.update``;
* ``logits_to_keep``: as in HF, 0 for logits at every position, n for the last n only;
* ``last_positions [B]`` (int64, LightSpec's own): logits at one position per row only,
  ``[B, 1, V]``; a batch's catch-up is ragged, and each row needs only its last token's;
* ``row_offsets [B]`` (int64, LightSpec's own, where ``row_offsets_ok``): rows of
  different lengths, each packed from cache column 0 with no holes; row b's q new tokens
  go to columns ``row_offsets[b] + i`` and see only its own columns before them.  With it
  ``attention_mask`` is ``[B, q]``: which of the new slots are real tokens (``None``: all).
  ``KVCache`` uses it where the model offers it (its per-row mode).

It returns an object whose ``logits`` are ``[B, q, V]``.  ``capture(layer_ids)``
records hidden states on every forward, numbered like ``model_parts.HiddenCapture``.

``exact=False`` (what drafters use) trades HF's op-for-op rounding for fewer operations:
a draft forward of a small model is dispatch-bound (the zoo draft runs about 120 tensor
ops per token for 5 MFLOP of work), so it takes RMSNorm as one ``F.rms_norm``, cos/sin
from a table indexed by position instead of recomputing them, q and k rotated together,
and, with ``fuse=True``, one matmul for q/k/v and one for gate/up (concatenated copies of
those weights: extra memory, so layer skip, whose blocks are the target's, does not fuse).
The logits differ from HF's in the last bits only; a draft may round differently because
the target verifies every token it proposes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from lightspec_kernels import cpu_attention, cpu_decoder, cpu_linear, cpu_norm_rope
from torch import nn

from .cpu_norm import KernelRMSNorm
from .hf_attention import uses_cpu_attention
from .kvcache import SlabCache, SlabLayer
from .sampling import argmax_last
from .weight_layout import PackedLinear, column_major, is_column_major

Linear = Callable[[torch.Tensor], torch.Tensor]  # x [..., in] -> [..., out]

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class LeanOutput:
    logits: torch.Tensor | None  # [B, q, V]; None when the forward was asked for no lm_head
    hidden: torch.Tensor | None = None  # [B, q, H]: the final norm's output, with head=False


def linear_fn(linear: nn.Module) -> Linear:
    """``linear(x)`` without ``nn.Module``'s call machinery: the packed CPU kernel for a
    ``PackedLinear`` (``weight_layout``), ``F.linear`` on its weight otherwise."""
    if isinstance(linear, PackedLinear):
        return cpu_linear.bind(linear.current(), linear.bias)
    w, b = linear.weight, linear.bias
    return lambda x: F.linear(x, w, b)


Norm = Callable[..., object]  # f(x) -> y, f(x, residual) -> (x + residual, y)


def norm_fn(norm: nn.Module, exact: bool = True) -> Norm:
    """An RMSNorm module as ``f(x, residual=None)``: ``y``, or ``(x + residual, y)`` with
    the residual add fused in front.  A ``KernelRMSNorm`` (cpu_norm) runs its kernel, the
    same one the module's forward runs; otherwise HF's op sequence (``exact``) or
    ``F.rms_norm`` (drafts)."""
    if isinstance(norm, KernelRMSNorm):
        return cpu_norm_rope.bind_rms_norm(norm.weight, norm.variance_epsilon)
    if exact:
        def hf_norm(x, residual=None):
            if residual is None:
                return _rms(norm, x)
            s = x + residual
            return s, _rms(norm, s)

        return hf_norm
    width, weight, eps = norm.weight.shape[0], norm.weight, _eps(norm)

    def fast_norm(x, residual=None):
        if residual is None:
            return F.rms_norm(x, (width,), weight, eps)
        s = x + residual
        return s, F.rms_norm(s, (width,), weight, eps)

    return fast_norm


def _packed_siblings(linears: list[nn.Module]) -> Linear | None:
    """One call for sibling projections (q/k/v, gate/up) whose packed weights lie side by
    side in one buffer (``use_packed_linears`` lays them out so): the kernel computes every
    output column on its own, so the results are the separate calls', bit for bit."""
    if not all(isinstance(m, PackedLinear) for m in linears):
        return None
    whole = cpu_linear.adjacent([m.current() for m in linears])
    if whole is None:
        return None
    biases = [m.bias for m in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(linears, biases)])
    return cpu_linear.bind(whole, bias)


@dataclass
class _Block:
    """One decoder block's tensors, read once: attribute access through ``nn.Module``
    costs more than the arithmetic of a small model's step (measured: 8-11% of a forward)."""

    q: Linear  # each projection as a plain function (linear_fn)
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    modules: tuple  # the projections' modules: q, k, v, o, gate, up, down
    qkv: Linear | None  # q/k/v in one call (outputs side by side), where that is exact
    gate_up: Linear | None
    norm1: "Norm"  # input_layernorm and post_attention_layernorm as norm_fn closures
    norm2: "Norm"
    q_norm_fn: "Norm | None"  # qwen3's per-head q/k norms as norm_fn closures
    k_norm_fn: "Norm | None"

    @classmethod
    def of(cls, layer: nn.Module, exact: bool = True) -> "_Block":
        a, m = layer.self_attn, layer.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        return cls(*(linear_fn(x) for x in mods),
                   getattr(a, "q_norm", None), getattr(a, "k_norm", None), mods,
                   _packed_siblings(list(mods[:3])), _packed_siblings(list(mods[4:6])),
                   norm_fn(layer.input_layernorm, exact), norm_fn(layer.post_attention_layernorm, exact),
                   *(norm_fn(n, exact) if n is not None else None
                     for n in (getattr(a, "q_norm", None), getattr(a, "k_norm", None))))


def lean_forward(model: nn.Module, num_layers: int | None = None, exact: bool = True,
                 fuse: bool = False) -> LeanDecoder | None:
    """A ``LeanDecoder`` over ``model``'s weights (shared, not copied unless ``fuse``), or
    ``None`` when the architecture is not one this module implements exactly.

    ``num_layers``: use only the first n blocks (self-speculation with early exit).
    ``exact=False``: the faster forward for drafts (module docstring); ``fuse`` (only with
    ``exact=False``) also concatenates the q/k/v and gate/up weights."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return None
    if getattr(cfg, "sliding_window", None) is not None:
        return None
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return None
    inner = getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if inner is None or head is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return None
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return None
        if not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj")):
            return None
    n = len(inner.layers) if num_layers is None else num_layers
    if not 1 <= n <= len(inner.layers):
        raise ValueError(f"num_layers={num_layers} is invalid: use 1..{len(inner.layers)} for this model")
    if fuse and exact:
        raise ValueError("fuse=True changes the rounding: it needs exact=False")
    return LeanDecoder(model, n, exact=exact, fuse=fuse)


class LeanDecoder:
    """The first ``num_layers`` blocks of a Llama-family model, final norm and lm_head."""

    def __init__(self, model: nn.Module, num_layers: int, exact: bool = True, fuse: bool = False):
        inner = model.model
        cfg = model.config
        self.config = cfg
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)[:num_layers]
        self.blocks = [_Block.of(layer, exact) for layer in self.layers]
        self.norm = inner.norm
        self.final_norm = norm_fn(inner.norm, exact)
        self.rotary = inner.rotary_emb
        self.head = model.get_output_embeddings()
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.scale = self.head_dim**-0.5
        self.record: frozenset[int] = frozenset()
        self.states: dict[int, torch.Tensor] = {}
        self.vocab = self.head.weight.shape[0]
        self.out_ids: torch.Tensor | None = None  # [n]: restrict_vocab's token ids
        self.out_weight: torch.Tensor | None = None  # [n, H]: their lm_head rows
        self.out_fn: Linear | None = None  # h -> logits of those rows
        self.head_fn = linear_fn(self.head)
        self.exact = exact
        # the CPU attention kernel: for the exact target only when the model's own forward
        # runs it too (hf_attention), for drafts wherever it runs
        self.cpu_attention = (uses_cpu_attention(model) if exact else cpu_attention.available()) and not _torch_forced()
        # the rotary kernel rounds exactly as HF's ops: usable by the exact forward too
        self.cpu_rope = cpu_norm_rope.available()
        self.hidden = cfg.hidden_size
        self.fused = [_Fused.of(blk) for blk in self.blocks] if fuse else None
        # exact=False: cos/sin per position, computed by the model's own rotary module once
        # (None when the rotary embedding depends on the sequence length: "dynamic" scaling)
        rope_type = str(getattr(self.rotary, "rope_type", "default"))
        self.rope_table = not exact and "dynamic" not in rope_type and "longrope" not in rope_type
        # the exact forward's chained path may read the table too where it holds exactly the
        # rotary module's values (checked on a probe; see _exact_rope_table)
        self.exact_rope_table = exact and _exact_rope_table(self, rope_type)
        self.cos_table: torch.Tensor | None = None  # [N, D]
        self.sin_table: torch.Tensor | None = None
        # steps over a filled cache: each block as one compiled call (cpu_decoder), when
        # every piece of the block already runs LightSpec's CPU kernels
        self.chained = _chained_decoder(self) if os.environ.get("LIGHTSPEC_CHAINED", "1") != "0" else None

    @property
    def row_offsets_ok(self) -> bool:
        """Whether ``forward`` takes ``row_offsets`` (rows at their own cache offsets): the
        chained path writes each row's keys where its own tokens end, so a ragged batch
        leaves no holes in the cache (``KVCache``'s per-row layout)."""
        return self.chained is not None

    def init_cache(self, cache: SlabCache, batch: int) -> None:
        """Create ``cache``'s slabs for ``batch`` rows (float32, the cache's capacity), so that
        a first forward, a prefill, runs the chained path too: packed (a right-padded
        batch's padding costs no product) and per row (``row_offsets``)."""
        while len(cache.layers) < len(self.layers):
            cache.layers.append(SlabLayer(cache.capacity))
        dev = self.embed.weight.device
        for layer in cache.layers[: len(self.layers)]:
            if not layer.is_initialized:
                empty = torch.empty(batch, self.n_kv, 0, self.head_dim, dtype=torch.float32, device=dev)
                layer.lazy_initialization(empty, empty)

    def restrict_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Compute logits only for ``token_ids [n]`` (int64); every other logit is -inf.

        A drafter's lm_head can be most of its weights (64% of the zoo draft's): drafting
        among the frequent tokens plus the request's own tokens reads a fraction of it, as
        FR-Spec and EAGLE-3's reduced draft vocabularies do.  ``None``: the whole vocabulary."""
        if token_ids is None:
            self.out_ids = self.out_weight = self.out_bias = self.out_fn = None
            return
        ids = token_ids.to(self.head.weight.device)
        self.out_ids = ids
        rows = self.head.weight.detach().index_select(0, ids)
        # keep the head's storage order (weight_layout: column-major is faster on the CPU)
        self.out_weight = column_major(rows) if is_column_major(self.head.weight) else rows
        bias = getattr(self.head, "bias", None)
        self.out_bias = None if bias is None else bias.detach().index_select(0, ids)
        if isinstance(self.head, PackedLinear):  # the packed kernel on the selected rows
            self.out_fn = cpu_linear.bind(cpu_linear.pack(rows), self.out_bias)
        else:
            weight, out_bias = self.out_weight, self.out_bias
            self.out_fn = lambda x: F.linear(x, weight, out_bias)

    def capture(self, layer_ids: list[int]) -> "LeanDecoder":
        """Record, on every forward, the hidden states ``[B, q, H]`` of ``layer_ids`` in
        ``self.states``: id i < N is the input of block i (0: the embedding output), N the
        final norm's output — HF's ``output_hidden_states`` numbering."""
        n = len(self.layers)
        for i in layer_ids:
            if not 0 <= i <= n:
                raise ValueError(f"hidden layer id {i} is invalid: use 0..{n} for this model")
        self.record = frozenset(layer_ids)
        return self

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache=None, use_cache: bool = True, logits_to_keep: int = 0, last_positions: torch.Tensor | None = None,
                head: bool = True, row_offsets: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                **_ignored) -> LeanOutput:
        # head=False: the final norm's output only (``LeanOutput.hidden``); the caller applies
        # the lm_head itself (``head_logits``), e.g. to the positions a greedy verify reaches
        keep = logits_to_keep if head else None
        if self.chained is not None and _cache_ready(cache, len(self.layers), input_ids.shape[0]):
            return self._forward_chained(input_ids, position_ids, attention_mask, cache, keep, last_positions,
                                         row_offsets, tree_mask)
        if row_offsets is not None:
            raise ValueError("row_offsets needs the chained forward (row_offsets_ok) and a filled cache")
        if not self.exact:
            return self._forward_fast(input_ids, position_ids, attention_mask, cache, keep, last_positions, tree_mask)
        B, q = input_ids.shape
        D, H, Hkv = self.head_dim, self.n_heads, self.n_kv
        h = F.embedding(input_ids, self.embed.weight)
        cos3, sin3 = self.rotary(h, position_ids)  # [B, q, D]
        cos, sin = cos3[:, None], sin3[:, None]  # [B, 1, q, D]: broadcast over heads
        fused_rope = self.cpu_rope and cos3.dtype == torch.float32 and h.device.type == "cpu"
        mask = None
        pending = None  # the last sub-layer's output, added to h by the next norm (fused)
        for i, blk in enumerate(self.blocks):
            if pending is None:
                x = blk.norm1(h)
            else:
                h, x = blk.norm1(h, pending)
            if i in self.record:
                self.states[i] = h
            if blk.qkv is not None:  # one packed call, the same numbers as three
                qkv = blk.qkv(x).view(B, q, H + 2 * Hkv, D)
                qs, ks, vs = qkv.split([H, Hkv, Hkv], dim=2)
                vs = vs.transpose(1, 2)
            else:
                qkv = None
                qs = blk.q(x).view(B, q, -1, D)
                ks = blk.k(x).view(B, q, -1, D)
                vs = blk.v(x).view(B, q, -1, D).transpose(1, 2)
            if blk.q_norm is not None:  # qwen3: RMSNorm over each head's vector
                qs, ks = blk.q_norm_fn(qs), blk.k_norm_fn(ks)
                qkv = None
            if fused_rope and qkv is not None:  # q and k heads rotated in one call, rounded as HF's ops
                qk = cpu_norm_rope.rotary(qkv[:, :, : H + Hkv].transpose(1, 2), cos3, sin3)  # [B, H+Hkv, q, D]
                qs, ks = qk[:, :H], qk[:, H:]
            elif fused_rope:
                qs = cpu_norm_rope.rotary(qs.transpose(1, 2), cos3, sin3)
                ks = cpu_norm_rope.rotary(ks.transpose(1, 2), cos3, sin3)
            else:
                qs = _rotate(qs.transpose(1, 2), cos, sin)
                ks = _rotate(ks.transpose(1, 2), cos, sin)
            keys, values = cache.update(ks, vs, i)  # [B, H_kv, cols, D], the new columns last
            if mask is None and (attention_mask is not None or q > 1 or tree_mask is not None):
                mask = _mask(attention_mask, B, q, keys.shape[2], h.device, tree_mask)
            o = self._attend(qs, keys, values, mask)  # [B, q, H, D]
            h, x = blk.norm2(h, blk.o(o.reshape(B, q, -1)))
            if blk.gate_up is not None:
                gate, up = blk.gate_up(x).chunk(2, dim=-1)
            else:
                gate, up = blk.gate(x), blk.up(x)
            pending = blk.down(F.silu(gate) * up)
        h, normed = self.final_norm(h, pending)
        if len(self.layers) in self.record:
            self.states[len(self.layers)] = normed
        return self._logits(normed, keep, last_positions)

    __call__ = forward

    def _forward_chained(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                         attention_mask: torch.Tensor | None, cache, logits_to_keep: int,
                         last_positions: torch.Tensor | None, row_offsets: torch.Tensor | None = None,
                         tree_mask: torch.Tensor | None = None) -> LeanOutput:
        """The forward with each block as one ``cpu_decoder`` call: the same kernels on the
        same values as the op-by-op forward (so the same logits, bit for bit), without its
        ~25 Python-level calls per block.  The cache's slabs must exist (after a prefill).

        ``row_offsets [B]``: each row's own first new column (module docstring); the cache's
        length is then the longest row's, and ``attention_mask [B, q]`` marks real slots.
        ``tree_mask [B, q, w]``, w >= q: which of the last w columns (a token tree's slots,
        the q new ones last) each new slot sees, instead of the ones before it."""
        B, q = input_ids.shape
        layers = cache.layers[: len(self.layers)]
        cols = layers[0].length
        C = cols + q
        if C > layers[0].capacity:
            for layer in layers:
                layer._grow(C)
        h = F.embedding(input_ids, self.embed.weight)  # [B, q, Hd], a new tensor: updated in place
        if self.exact and not self.exact_rope_table:
            cos, sin = self.rotary(h, position_ids)  # [B, q, D], as the op-by-op forward
        else:
            cos, sin = self._cos_sin(h, position_ids, C)
            cos, sin = cos[:, 0], sin[:, 0]
        cos, sin = cos.contiguous(), sin.contiguous()
        mask = rows = None
        if row_offsets is not None:  # each row sees its own columns up to its new token's: [B, q, C]
            if tree_mask is None:
                mask = torch.arange(C)[None, None, :] <= row_offsets[:, None, None] + torch.arange(q)[None, :, None]
            else:  # its cached columns before the tree, then its ancestors among the tree's slots
                w = tree_mask.shape[2]  # the tree's last w slots end with the q new ones
                rel = torch.arange(C)[None, None, :] - (row_offsets + q - w)[:, None, None]  # [B, 1, C]
                among = tree_mask.gather(2, rel.clamp(0, w - 1).expand(B, q, C))
                mask = (rel < 0) | ((rel < w) & among)
            if attention_mask is not None and not bool(attention_mask.all()):
                rows = attention_mask.reshape(-1).nonzero().squeeze(1)  # only the real tokens go through the products
                h = h.reshape(B * q, -1).index_select(0, rows)
                mask &= attention_mask[:, :, None]
            mask = mask.contiguous()
        elif attention_mask is not None:  # [B, q, C]: holes in the cache, causal among the new tokens
            mask = _mask(attention_mask, B, q, C, h.device, tree_mask)[:, 0]
            new_valid = attention_mask[:, cols:C]
            if not bool(new_valid.all()):
                # a ragged verify (rows padded to the longest draft): only the real tokens go
                # through the products; padding slots attend to nothing
                rows = new_valid.reshape(-1).nonzero().squeeze(1)
                h = h.reshape(B * q, -1).index_select(0, rows)  # [M, Hd]
                mask = mask & new_valid[:, :, None]
            mask = mask.contiguous()
        elif tree_mask is not None:  # no holes, but a tree among the last columns
            mask = _mask(None, B, q, C, h.device, tree_mask)[:, 0].contiguous()
        recorded = {i: torch.empty_like(h) for i in self.record if i < len(layers)}
        normed = self.chained.run(h, [layer.k_slab for layer in layers], [layer.v_slab for layer in layers], cols,
                                  cos, sin, mask, recorded, rows, row_offsets)
        for layer in layers:
            layer.set_length(C)
        if len(self.layers) in self.record:
            recorded[len(self.layers)] = normed
        for i, state in recorded.items():
            self.states[i] = state if rows is None else _unpack(state, rows, B, q)
        if rows is None:
            return self._logits(normed, logits_to_keep, last_positions)
        if logits_to_keep is None or logits_to_keep or last_positions is not None:
            return self._logits(_unpack(normed, rows, B, q), logits_to_keep, last_positions)
        return LeanOutput(logits=_unpack(self.head_logits(normed), rows, B, q))  # the lm_head on real tokens only

    def _logits(self, h: torch.Tensor, logits_to_keep: int | None, last_positions: torch.Tensor | None = None) -> LeanOutput:
        """Final hidden states ``[B, q, H]`` → logits ``[B, q or logits_to_keep or 1, V]``
        (``logits_to_keep=None``: no lm_head, the hidden states as ``LeanOutput.hidden``)."""
        if logits_to_keep is None:
            return LeanOutput(logits=None, hidden=h)
        if last_positions is not None:  # one position per row: [B, 1, H]
            h = h[torch.arange(h.shape[0], device=h.device), last_positions][:, None]
        elif logits_to_keep:  # as HF: logits of the last n positions only
            h = h[:, -logits_to_keep:]
        return LeanOutput(logits=self.head_logits(h))

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The lm_head: ``[..., H]`` → ``[..., V]`` (-inf outside ``restrict_vocab``'s ids)."""
        if self.out_ids is None:
            return self.head_fn(h)
        part = self.out_fn(h)  # [..., n]
        logits = part.new_full((*part.shape[:-1], self.vocab), float("-inf"))
        logits[..., self.out_ids] = part
        return logits

    def head_argmax(self, h: torch.Tensor) -> torch.Tensor:
        """``argmax_last(self.head_logits(h))``: ``[..., H]`` → int64 ``[...]``, the first maximum.
        Fused into the lm_head where it runs LightSpec's CPU kernel (``cpu_linear``'s
        ``argmax``: each strip of logits is scanned while still in cache; read back after
        the head, 3 x 8192 logits took 30-35 us on the zoo target, cached 4 us)."""
        fused = getattr(self.head_fn, "argmax", None)
        if fused is not None and self.out_ids is None:
            return fused(h)
        return argmax_last(self.head_logits(h))

    def _forward_fast(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      cache, logits_to_keep: int, last_positions: torch.Tensor | None = None,
                      tree_mask: torch.Tensor | None = None) -> LeanOutput:
        """The ``exact=False`` forward: same arguments and results up to rounding, fewer ops."""
        B, q = input_ids.shape
        D, H, Hkv = self.head_dim, self.n_heads, self.n_kv
        h = F.embedding(input_ids, self.embed.weight)
        # positions never exceed the cached columns plus the new ones (a Python int: no device sync)
        bound = cache.get_seq_length() + q if cache is not None else None
        cos, sin = self._cos_sin(h, position_ids, bound)  # [B, 1, q, D]
        fused_rope = self.cpu_rope and cos.dtype == torch.float32 and h.device.type == "cpu"
        mask = None
        pending = None  # the last sub-layer's output, added to h by the next norm (fused)
        for i, blk in enumerate(self.blocks):
            if pending is None:
                x = blk.norm1(h)
            else:
                h, x = blk.norm1(h, pending)
            if i in self.record:
                self.states[i] = h
            qkv_fn = blk.qkv or (self.fused[i].qkv if self.fused is not None else None)
            if qkv_fn is not None:
                qkv = qkv_fn(x).view(B, q, H + 2 * Hkv, D).transpose(1, 2)  # [B, H+2Hkv, q, D]
                qk, vs = qkv[:, : H + Hkv], qkv[:, H + Hkv :]
            else:
                qk = torch.cat([blk.q(x).view(B, q, H, D), blk.k(x).view(B, q, Hkv, D)], dim=2)
                qk = qk.transpose(1, 2)
                vs = blk.v(x).view(B, q, Hkv, D).transpose(1, 2)
            if blk.q_norm is not None:  # qwen3: per-head norms, different for q and k
                qk = torch.cat([blk.q_norm_fn(qk[:, :H]), blk.k_norm_fn(qk[:, H:])], dim=1)
            if fused_rope:  # q and k heads in one go
                qk = cpu_norm_rope.rotary(qk, cos[:, 0], sin[:, 0])
            else:
                qk = _rotate(qk, cos, sin)
            qs, ks = qk[:, :H], qk[:, H:]
            keys, values = cache.update(ks, vs, i)
            if mask is None and (attention_mask is not None or q > 1 or tree_mask is not None):
                mask = _mask(attention_mask, B, q, keys.shape[2], h.device, tree_mask)
            o = self._attend(qs, keys, values, mask)  # [B, q, H, D]
            h, x = blk.norm2(h, blk.o(o.reshape(B, q, -1)))
            gate_up_fn = blk.gate_up or (self.fused[i].gate_up if self.fused is not None else None)
            if gate_up_fn is not None:
                gate, up = gate_up_fn(x).chunk(2, dim=-1)
            else:
                gate, up = blk.gate(x), blk.up(x)
            pending = blk.down(F.silu(gate) * up)
        h, normed = self.final_norm(h, pending)
        if len(self.layers) in self.record:
            self.states[len(self.layers)] = normed
        return self._logits(normed, logits_to_keep, last_positions)

    def _cos_sin(self, h: torch.Tensor, position_ids: torch.Tensor, bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[B, 1, q, D]`` for ``position_ids [B, q]``, from the table (grown by
        doubling to hold ``bound`` positions, or the largest id when no bound is given) or,
        for sequence-length-dependent rotary scaling, from the rotary module."""
        if not (self.rope_table or self.exact_rope_table):
            cos, sin = self.rotary(h, position_ids)
            return cos[:, None], sin[:, None]
        need = bound if bound is not None else int(position_ids.max()) + 1
        if self.cos_table is None or self.cos_table.shape[0] < need or self.cos_table.device != h.device:
            n = max(need, 2 * (0 if self.cos_table is None else self.cos_table.shape[0]), 256)
            cos, sin = self.rotary(h, torch.arange(n, device=h.device)[None])
            self.cos_table, self.sin_table = cos[0], sin[0]
        return self.cos_table[position_ids][:, None], self.sin_table[position_ids][:, None]

    __call__ = forward

    def _attend(self, qs: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``qs [B, H, q, D]`` over ``keys, values [B, H_kv, cols, D]`` → ``[B, q, H, D]``.

        With ``cpu_attention``: LightSpec's kernel (hf_attention), whose results do not
        depend on how the mask is given.  Otherwise SDPA, with grouped-query attention laid
        out the way the installed transformers' SDPA integration lays it out
        (``_installed_sdpa_layout``: GQA inside SDPA where its ``use_gqa_in_sdpa`` says so;
        one query token packed as ``[B, H_kv, n_rep, D]`` where it packs; keys repeated
        otherwise), because a different layout rounds differently and the target's forward
        must match HF's bit for bit."""
        if self.cpu_attention and qs.dtype == torch.float32 and qs.device.type == "cpu":
            return cpu_attention.attention_cpu(qs, keys, values, mask, self.scale)
        rep = self.n_heads // self.n_kv
        if rep == 1:
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=self.scale)
            return o.transpose(1, 2)
        if _hf_gqa_in_sdpa(mask, keys, values):
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True)
            return o.transpose(1, 2)
        B, H, q, D = qs.shape
        if q == 1 and _HF_PACKS_ONE_QUERY:
            packed = qs.reshape(B, self.n_kv, rep, D)
            o = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=self.scale)
            return o.reshape(B, H, 1, D).transpose(1, 2)
        keys = keys[:, :, None].expand(B, self.n_kv, rep, *keys.shape[2:]).reshape(B, H, *keys.shape[2:])
        values = values[:, :, None].expand(B, self.n_kv, rep, *values.shape[2:]).reshape(B, H, *values.shape[2:])
        o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2)


def _installed_sdpa_layout():
    """How the installed transformers' SDPA integration lays out grouped-query attention:
    its ``use_gqa_in_sdpa(mask, key, value)`` (GQA inside SDPA) and whether it packs a
    one-token query onto the key/value heads (``pack_gqa``, transformers 5.25; 5.17 repeats
    the keys instead).  The lean forward follows it, since another layout rounds otherwise."""
    try:
        from transformers.integrations import sdpa_attention as hf
    except ImportError:  # pragma: no cover - every supported transformers has it
        return (lambda mask, key, value: mask is None), True
    use = getattr(hf, "use_gqa_in_sdpa", None) or (lambda mask, key, value: mask is None)
    return use, hasattr(hf, "pack_gqa")


_hf_gqa_in_sdpa, _HF_PACKS_ONE_QUERY = _installed_sdpa_layout()


def exact_lean_target(model: nn.Module) -> LeanDecoder | None:
    """A ``LeanDecoder`` over all of ``model``'s blocks if it reproduces the model's own
    forward exactly (``torch.equal`` on every logit) on a probe; ``None`` otherwise.

    The probe runs through ``KVCache`` exactly as the engine does: a right-padded batch
    of two rows (so the mask has holes), a one-token step and a four-token step."""
    from .kvcache import KVCache

    lean = lean_forward(model)
    if lean is None:
        return None
    param = next(model.parameters())
    dev = param.device
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randint(0, vocab, (2, q), generator=gen).to(dev) for q in (12, 1, 4)]
    prefill_valid = torch.arange(12, device=dev)[None, :] < torch.tensor([[12], [9]], device=dev)
    # both with holes: the same cache layout, so any difference is the forward's own
    kv_hf, kv_lean = KVCache(model, 2, dev, capacity=32), KVCache(lean, 2, dev, capacity=32, per_row=False)
    with torch.inference_mode():
        for j, ids in enumerate(steps):
            valid = prefill_valid if j == 0 else None
            a = kv_hf.forward(ids, valid).logits
            b = kv_lean.forward(ids, valid).logits
            if not torch.equal(a, b):
                return None
    return lean


@dataclass
class _Fused:
    """``fuse=True``: a block's q/k/v and gate/up projections as one matmul each (``None``
    where the block already has an exact one-call form, ``_Block.qkv``/``gate_up``)."""

    qkv: Linear | None  # x -> [..., (H + 2 H_kv) D]
    gate_up: Linear | None  # x -> [..., 2 I]
    weights: tuple  # the concatenated weights [out, hidden] made here (for inspection)

    @classmethod
    def of(cls, blk: _Block) -> "_Fused":
        made = []

        def cat(mods):
            weight = torch.cat([m.weight for m in mods]).detach()
            if all(is_column_major(m.weight) for m in mods):  # keep weight_layout's storage order
                weight = column_major(weight)
            biases = [m.bias for m in mods]
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat([b if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(mods, biases)]).detach()
            made.append(weight)
            if all(isinstance(m, PackedLinear) for m in mods):
                return cpu_linear.bind(cpu_linear.pack(weight), bias)
            return lambda x: F.linear(x, weight, bias)

        m = blk.modules
        qkv = None if blk.qkv is not None else cat(m[:3])
        gate_up = None if blk.gate_up is not None else cat(m[4:6])
        return cls(qkv, gate_up, tuple(made))


def _chained_decoder(lean: LeanDecoder) -> cpu_decoder.Decoder | None:
    """``lean``'s blocks bound for ``cpu_decoder``, or ``None`` unless every piece of every
    block already runs LightSpec's kernels (packed q/k/v and gate/up side by side, packed
    o and down, kernel norms, the CPU attention and rotary kernels, no per-head q/k norms):
    then the chained call computes exactly what the op-by-op forward computes."""
    if _torch_forced() or not (lean.cpu_attention and lean.cpu_rope and cpu_decoder.available()):
        return None
    if not isinstance(lean.norm, KernelRMSNorm):
        return None
    weights = []
    for layer, blk in zip(lean.layers, lean.blocks):
        q, k, v, o, gate, up, down = blk.modules
        if blk.q_norm is not None or blk.k_norm is not None or not all(isinstance(m, PackedLinear) for m in blk.modules):
            return None
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(isinstance(n, KernelRMSNorm) for n in norms):
            return None
        qkv, gate_up = cpu_linear.adjacent([q.current(), k.current(), v.current()]), cpu_linear.adjacent([gate.current(), up.current()])
        if qkv is None or gate_up is None:
            return None

        def bias(mods):
            if all(m.bias is None for m in mods):
                return None
            return torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods])

        weights.append(cpu_decoder.BlockWeights(
            qkv=qkv, o=o.current(), gate_up=gate_up, down=down.current(),
            norm1=norms[0].weight.detach(), norm2=norms[1].weight.detach(),
            eps1=norms[0].variance_epsilon, eps2=norms[1].variance_epsilon,
            qkv_bias=bias((q, k, v)), o_bias=None if o.bias is None else o.bias.detach(),
            gate_up_bias=bias((gate, up)), down_bias=None if down.bias is None else down.bias.detach()))
    try:
        return cpu_decoder.Decoder(weights, lean.n_heads, lean.n_kv, lean.head_dim, lean.scale,
                                   lean.norm.weight.detach(), lean.norm.variance_epsilon)
    except (RuntimeError, ValueError):
        return None


def _exact_rope_table(lean: LeanDecoder, rope_type: str) -> bool:
    """Whether a cos/sin table made by the model's rotary module at positions 0..n-1 holds,
    bit for bit, what the module returns for any batch of positions.  HF's default rotary
    embedding computes each entry on its own (one product ``inv_freq * position``, then
    cos/sin elementwise), so it does wherever PyTorch's vectorised cos/sin cover whole
    rows (head size a multiple of 32: no scalar tail); checked on 512 positions."""
    if rope_type != "default" or lean.head_dim % 32 or lean.config.hidden_size % 32:
        return False
    w = lean.embed.weight
    h = torch.zeros(1, 1, lean.hidden, dtype=w.dtype, device=w.device)
    with torch.inference_mode():
        cos, sin = lean.rotary(h, torch.arange(512, device=w.device)[None])
        gen = torch.Generator().manual_seed(0)
        for shape in ((1, 1), (2, 5), (3, 17)):
            pos = torch.randint(0, 512, shape, generator=gen).to(w.device)
            c, s = lean.rotary(h.expand(shape[0], -1, -1), pos)
            if not (torch.equal(c, cos[0][pos]) and torch.equal(s, sin[0][pos])):
                return False
    return True


def _unpack(packed: torch.Tensor, rows: torch.Tensor, B: int, q: int) -> torch.Tensor:
    """``packed [M, F]`` (the real tokens' rows, slots ``rows``) → ``[B, q, F]``, zeros in
    the padding slots."""
    full = packed.new_zeros(B * q, packed.shape[-1])
    full.index_copy_(0, rows, packed)
    return full.view(B, q, -1)


def _cache_ready(cache, layers: int, batch: int) -> bool:
    """Whether ``cache`` is a SlabCache whose first ``layers`` slabs exist for ``batch`` rows
    (the chained forward writes into them; the first forward, a prefill, creates them)."""
    if not isinstance(cache, SlabCache) or len(cache.layers) < layers:
        return False
    slabs = cache.layers
    first = slabs[0]
    return first.k_slab is not None and first.k_slab.shape[0] == batch and first.k_slab.dtype == torch.float32


def _torch_forced() -> bool:
    """``LIGHTSPEC_KERNELS=torch``: PyTorch everywhere (the model's attention then runs SDPA too)."""
    return os.environ.get("LIGHTSPEC_KERNELS") == "torch"


def _eps(norm: nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)


def _rms(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm as the Llama family's HF modules compute it, op for op (in float32, the
    weight applied after the cast back), so that the rounding is theirs in every dtype."""
    eps = _eps(norm)
    dtype = x.dtype
    h = x if dtype == torch.float32 else x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * (h if dtype == torch.float32 else h.to(dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF's half-split convention: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _mask(valid: torch.Tensor | None, B: int, q: int, cols: int, device, tree: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 1, q, cols]`` bool: query i (cache column cols - q + i) sees the columns
    up to its own that hold real tokens of its row; with ``tree [B, q, w]`` (w >= q), among
    the last w columns (a token tree's slots, the q new ones last) only the ones ``tree``
    allows (its ancestors and itself)."""
    col = torch.arange(cols, device=device)
    qpos = cols - q + torch.arange(q, device=device)
    causal = col[None, :] <= qpos[:, None]  # [q, cols]
    if tree is None:
        mask = causal[None, None].expand(B, 1, q, cols)
    else:
        mask = causal[None].expand(B, q, cols).clone()
        mask[:, :, cols - tree.shape[-1] :] = tree
        mask = mask[:, None]
    return mask if valid is None else mask & valid[:, None, None, :cols]
