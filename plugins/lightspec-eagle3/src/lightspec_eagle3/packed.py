"""The head's drafting forward on the CPU through lightspec-kernels.

Why: at batch 1 a draft token is one row through every weight of the head, and the
target's (shared) 8192 x H ``lm_head`` alone is 12.6 MB in float32.  ``torch.nn.Linear``
re-reads float32 weights through the BLAS at that shape; ``lightspec_kernels.cpu_linear``
keeps each weight packed once (float16 where every value is a float16 value, as in a head
stored in float16: the products do not change) and streams it once per call.  q/k/v and
gate/up are packed side by side, so one call computes each group.  The norms, the rotary
embedding and the attention over the head's cache are one kernel call each as well
(``cpu_norm_rope``, ``cpu_attention``): written as PyTorch ops they cost more than the
products (an RMSNorm ~25 us, the rotary embedding of q and k ~40 us, against ~10 us for
the q/k/v product; docs/design/eagle3.md, "Drafting cost").

Where the compiled layer is available (``lightspec_kernels.cpu_two_stream``: a SiLU head
whose intermediate size is a multiple of 16, float32 embeddings) the whole layer of
``forward_cached`` is one C call that also writes the new keys and values into the cache's
slab: the op-by-op form was ~20 calls at ~10-15 us each on this CPU.

``PackedHead`` computes what ``Eagle3Head.fuse`` / ``forward_cached`` / ``draft_logits``
compute, in inference only (no autograd), for float32 CPU heads; it differs from them only
in the order of the norms' and dot products' summations and in the C SiLU's rounding
(|diff| ~ 1e-6 relative).  Drafts never change the output (the target verifies them); they
change only how many are accepted.
"""

from __future__ import annotations

import torch
from lightspec_kernels import cpu_attention, cpu_linear, cpu_norm_rope, cpu_two_stream
from lightspec_kernels.cpu_decoder import BlockWeights

from .modeling import Eagle3Head, RMSNorm


def packed_head_for(head: Eagle3Head) -> "PackedHead | None":
    """A ``PackedHead`` for ``head`` when its weights are float32 on the CPU and the compiled
    kernel is available here; ``None`` otherwise (the module's own forward is used)."""
    w = head.fc.weight
    if w.device.type != "cpu" or w.dtype != torch.float32 or not cpu_linear.available():
        return None
    return PackedHead(head)


def _packed(*weights: torch.Tensor) -> cpu_linear.PackedWeight:
    """The weights' outputs side by side (``[sum N, K]``), packed once."""
    return cpu_linear.pack(torch.cat([w.detach() for w in weights]).contiguous())


class PackedHead:
    """The drafting forward of ``head`` (module docstring).  Built once per loaded head."""

    def __init__(self, head: Eagle3Head):
        cfg, layer = head.cfg, head.layer
        at, mlp = layer.self_attn, layer.mlp
        for lin in (head.fc, at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if lin.bias is not None:  # the public heads have none; keep the module's forward for others
                raise ValueError("packed drafting needs bias-free linears")
        self.head = head
        self.q_n, self.kv_n = at.heads * at.head_dim, at.kv_heads * at.head_dim
        self.heads, self.kv_heads, self.head_dim = at.heads, at.kv_heads, at.head_dim
        self.inter = cfg.intermediate_size
        packed = {"qkv": _packed(at.q_proj.weight, at.k_proj.weight, at.v_proj.weight), "o": _packed(at.o_proj.weight),
                  "gate_up": _packed(mlp.gate_proj.weight, mlp.up_proj.weight), "down": _packed(mlp.down_proj.weight)}
        self.fc = cpu_linear.bind(_packed(head.fc.weight))
        self.qkv, self.o, self.gate_up, self.down = (cpu_linear.bind(packed[n]) for n in ("qkv", "o", "gate_up", "down"))
        lm = head.lm_head.weight if head.lm_head is not None else head.shared_lm_head()
        self.lm_head = cpu_linear.bind(_packed(lm.float()))
        self.act = mlp.act
        # one fused op per norm, and the rotary table computed once (positions index it)
        self.input_norm = _norm(head.input_norm) if head.input_norm is not None else None
        self.norm = _norm(head.norm)
        self.hidden_norm, self.in_norm = _norm(layer.hidden_norm), _norm(layer.input_layernorm)
        self.post_norm = _norm(layer.post_attention_layernorm)
        self.norm_before_residual = layer.norm_before_residual
        n = cfg.max_position_embeddings
        like = torch.zeros(1, dtype=head.fc.weight.dtype)
        cos, sin = head.rope(torch.arange(n)[None], like)
        self.cos, self.sin, self.max_pos = cos[0], sin[0], n
        self.layer = self._two_stream(packed, head, layer)

    def _two_stream(self, packed: dict, head: Eagle3Head, layer) -> "cpu_two_stream.TwoStreamLayer | None":
        """The whole layer as one C call (module docstring), or None where it cannot run here."""
        emb = head.embedding_table()
        act = getattr(self.act, "__name__", type(self.act).__name__).lower()
        if (not cpu_two_stream.available() or emb.dtype != torch.float32 or "silu" not in act
                or self.inter % 16 or self.cos.dtype != torch.float32):
            return None
        at = layer.self_attn
        block = BlockWeights(packed["qkv"], packed["o"], packed["gate_up"], packed["down"],
                             layer.hidden_norm.weight.detach().float(), layer.post_attention_layernorm.weight.detach().float(),
                             layer.hidden_norm.eps, layer.post_attention_layernorm.eps)
        return cpu_two_stream.TwoStreamLayer(
            block, at.heads, at.kv_heads, at.head_dim, at.head_dim ** -0.5, layer.input_layernorm.weight.detach().float(),
            layer.input_layernorm.eps, head.norm.weight.detach().float(), head.norm.eps, layer.norm_before_residual,
            emb.detach(), self.cos.contiguous(), self.sin.contiguous())

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """As ``Eagle3Head.fuse``: taps ``[.., n_taps * H_target]`` → ``[.., H]``."""
        if self.input_norm is not None:
            taps = self.input_norm(taps)
        return self.fc(taps)

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """As ``Eagle3Head.draft_logits``: h ``[.., H]`` → ``[.., draft_vocab]``."""
        return self.lm_head(self.norm(h))

    def forward_cached(self, ids: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                       mask: torch.Tensor | None, cache) -> torch.Tensor:
        """As ``Eagle3Head.forward_cached`` (same arguments, same cache entries)."""
        head = self.head
        B, T, _ = feat.shape
        if self.layer is not None and feat.dtype == torch.float32 and (mask is None or mask.dtype == torch.bool):
            G, D = self.kv_heads, self.head_dim
            cols = cache.get_seq_length(0) if cache.layers else 0
            # reserve the new columns through the cache's own update (the C layer overwrites them)
            keys, values = cache.update(*self._blank(B, T), 0)
            if keys.stride(-2) == D and keys.stride(0) == G * keys.stride(1):
                try:
                    return self.layer.run(ids, positions, feat, keys, values, cols, mask)[0]
                except IndexError:  # a position past the rotary table: the op-by-op forward computes it
                    pass
            cache.crop(-T)  # nothing was written: release the columns, then the op-by-op forward
        emb = head.embed(ids).to(feat.dtype)
        if int(positions.max()) < self.max_pos:
            cos, sin = self.cos[positions], self.sin[positions]  # [B, T, D]
        else:  # beyond the table (a config whose max_position_embeddings is too small)
            cos, sin = head.rope(positions, feat)
        normed = self.hidden_norm(feat)
        residual = normed if self.norm_before_residual else feat
        qkv = self.qkv(torch.cat([self.in_norm(emb), normed], dim=-1))
        q, k, v = qkv.split([self.q_n, self.kv_n, self.kv_n], -1)
        q = cpu_norm_rope.rotary(q.view(B, T, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = cpu_norm_rope.rotary(k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        keys, values = cache.update(k, v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2), 0)
        # no mask: the new tokens are the cache's last T columns, causal among themselves
        a = cpu_attention.attention(q, keys, values, mask)  # [B, T, heads, D]
        h = residual + self.o(a.view(B, T, -1))
        gu = self.gate_up(self.post_norm(h))
        gate, up = gu.split([self.inter, self.inter], -1)
        return h + self.down(self.act(gate) * up)


    def _blank(self, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero keys and values ``[B, G, T, D]`` (the columns a C forward reserves, then writes)."""
        cached = getattr(self, "_blanks", None)
        if cached is None or cached.shape[0] != B or cached.shape[2] < T:
            cached = self._blanks = torch.zeros(B, self.kv_heads, max(T, 8), self.head_dim)
        blank = cached[:, :, :T]
        return blank, blank


def _norm(norm: RMSNorm):
    """``norm`` as one call of lightspec-kernels' RMSNorm (its PyTorch reference where the
    kernel is not built)."""
    return cpu_norm_rope.bind_rms_norm(norm.weight.detach().float(), norm.eps)
