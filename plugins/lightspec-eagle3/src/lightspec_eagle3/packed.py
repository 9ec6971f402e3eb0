"""The head's drafting forward on the CPU through lightspec-kernels' packed linears.

Why: at batch 1 a draft token is one row through every weight of the head, and the
target's (shared) 8192 x H ``lm_head`` alone is 12.6 MB in float32.  ``torch.nn.Linear``
re-reads float32 weights through the BLAS at that shape; ``lightspec_kernels.cpu_linear``
keeps each weight packed once (float16 where every value is a float16 value, as in a head
stored in float16: the products do not change) and streams it once per call.  q/k/v and
gate/up are packed side by side, so one call computes each group.

``PackedHead`` computes what ``Eagle3Head.fuse`` / ``forward_cached`` / ``draft_logits``
compute, in inference only (no autograd), for float32 CPU heads; it differs from them only
in the order of each dot product's summation (|diff| ~ 1e-6 relative).  Drafts never change
the output (the target verifies them); they change only how many are accepted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightspec_kernels import cpu_linear
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .modeling import Eagle3Head, RMSNorm


def packed_head_for(head: Eagle3Head) -> "PackedHead | None":
    """A ``PackedHead`` for ``head`` when its weights are float32 on the CPU and the compiled
    kernel is available here; ``None`` otherwise (the module's own forward is used)."""
    w = head.fc.weight
    if w.device.type != "cpu" or w.dtype != torch.float32 or not cpu_linear.available():
        return None
    return PackedHead(head)


def _pack(*weights: torch.Tensor):
    """One bound kernel for the weights' outputs side by side (``[sum N, K]``)."""
    return cpu_linear.bind(cpu_linear.pack(torch.cat([w.detach() for w in weights]).contiguous()))


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
        self.fc = _pack(head.fc.weight)
        self.qkv = _pack(at.q_proj.weight, at.k_proj.weight, at.v_proj.weight)
        self.o = _pack(at.o_proj.weight)
        self.gate_up = _pack(mlp.gate_proj.weight, mlp.up_proj.weight)
        self.down = _pack(mlp.down_proj.weight)
        lm = head.lm_head.weight if head.lm_head is not None else head.shared_lm_head()
        self.lm_head = _pack(lm.float())
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
        emb = head.embed(ids).to(feat.dtype)
        if int(positions.max()) < self.max_pos:
            cos, sin = self.cos[positions], self.sin[positions]
        else:  # beyond the table (a config whose max_position_embeddings is too small)
            cos, sin = head.rope(positions, feat)
        normed = self.hidden_norm(feat)
        residual = normed if self.norm_before_residual else feat
        qkv = self.qkv(torch.cat([self.in_norm(emb), normed], dim=-1))
        q, k, v = qkv.split([self.q_n, self.kv_n, self.kv_n], -1)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = cache.update(k, v, 0)
        if mask is None and T > 1:
            cols = keys.shape[2]
            j = torch.arange(T, device=q.device)
            mask = (torch.arange(cols, device=q.device)[None, :] <= (cols - T + j)[:, None])[None, None]
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        h = residual + self.o(a.transpose(1, 2).reshape(B, T, -1))
        gu = self.gate_up(self.post_norm(h))
        gate, up = gu.split([self.inter, self.inter], -1)
        return h + self.down(self.act(gate) * up)


def _norm(norm: RMSNorm):
    """``norm`` as one fused op (``F.rms_norm``: the same formula, fp32 statistics for the
    float32 drafting forward this module serves)."""
    weight, eps, shape = norm.weight.detach(), norm.eps, (norm.weight.shape[0],)
    return lambda x: F.rms_norm(x, shape, weight, eps)
