"""The DSpark / DFlash drafter as torch modules, named so that ``state_dict()`` is the public
DeepSpec layout (``layers.{i}.*``, ``fc``, ``hidden_norm``, ``norm``, ``markov_head.*``,
``confidence_head.proj``, optional ``embed_tokens`` / ``lm_head`` / ``d2t``).

Shapes: B rows, T context tokens, q block slots, H hidden, L taps, V vocabulary (``dV`` the
draft vocabulary), r Markov rank.  Attention of a block slot: every context token before its
block's anchor (the tapped target features, ``hidden_norm(fc(taps))``, projected by the same
``k_proj`` / ``v_proj``, no input norm) plus every slot of its own block (non-causal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DSparkConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """``(cos, sin)`` ``[B, 1, n, head_dim]`` for ``positions [B, n]`` (default RoPE, rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions[..., None].float() * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        H, hd = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, nkv, n, hd]`` of ``x [B, n, H]`` (keys normed and rotated)."""
        B, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, n, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.nkv, self.hd).transpose(1, 2)
        return _rotate(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """``x [B, q, H]``; ``ctx_k/v [B, nkv, T, hd]``; ``mask [B, 1, q, T + q]`` bool (True = attend)."""
        B, q, _ = x.shape
        qh = _rotate(self.q_norm(self.q_proj(x).view(B, q, self.nh, self.hd)).transpose(1, 2), cos, sin)
        k, v = self.kv(x, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, q, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        H, inter = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """``bias_k = W2(g(W1[x_{k-1}], h_k, state))``: vanilla (g = identity), gated (a sigmoid gate
    over ``[h_k; W1[x]]``) or rnn (a GRU-like state over the block)."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        r, H = cfg.markov_rank, cfg.hidden_size
        self.kind, self.rank = cfg.markov_head_type, r
        self.markov_w1 = nn.Embedding(cfg.vocab_size, r)
        self.markov_w2 = nn.Linear(r, cfg.out_vocab, bias=False)
        if self.kind == "gated":
            self.gate_proj = nn.Linear(H + r, r)
        elif self.kind == "rnn":
            self.joint_proj = nn.Linear(2 * r + H, 3 * r)

    def step(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """``prev [...]`` target ids, ``h [..., H]`` -> ``(bias [..., dV], state [..., r] or None)``."""
        e = self.markov_w1(prev).to(h.dtype)
        if self.kind == "vanilla":
            return self.markov_w2(e), None
        if self.kind == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e), None
        if state is None:
            state = torch.zeros_like(e)
        gate, cand, out = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        return self.markov_w2(torch.tanh(out)), gate * state + (1 - gate) * torch.tanh(cand)

    def block_bias(self, prev: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Teacher-forced biases ``[..., q, dV]`` for ``prev [..., q]`` and ``h [..., q, H]``."""
        if self.kind != "rnn":
            return self.step(prev, h, None)[0]
        state, out = None, []
        for k in range(prev.shape[-1]):
            bias, state = self.step(prev[..., k], h[..., k, :], state)
            out.append(bias)
        return torch.stack(out, dim=-2)


class ConfidenceHead(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.proj = nn.Linear(size, 1)

    def forward(self, x):
        return self.proj(x.float() if self.proj.weight.dtype == torch.float32 else x).squeeze(-1)


class DSparkDraft(nn.Module):
    """The drafter.  ``embed_tokens`` / ``lm_head`` are the checkpoint's own modules, or the
    target's (shared: kept out of ``state_dict()``)."""

    def __init__(self, cfg: DSparkConfig, embed_tokens: nn.Module | None = None, lm_head: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.feature_size, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.markov_head = MarkovHead(cfg) if cfg.markov_rank > 0 else None
        self.confidence_head = None
        if cfg.enable_confidence_head:
            with_markov = cfg.confidence_head_with_markov and self.markov_head is not None
            self.confidence_head = ConfidenceHead(H + (cfg.markov_rank if with_markov else 0))
        self.shared = {"embed_tokens": embed_tokens is not None and not isinstance(embed_tokens, _Own),
                       "lm_head": lm_head is not None and not isinstance(lm_head, _Own)}
        if embed_tokens is None or isinstance(embed_tokens, _Own):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        else:
            object.__setattr__(self, "embed_tokens", embed_tokens)  # shared: not a submodule
        if lm_head is None or isinstance(lm_head, _Own):
            self.lm_head = nn.Linear(H, cfg.out_vocab, bias=False)
        else:
            object.__setattr__(self, "lm_head", lm_head)
        if cfg.out_vocab < cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.out_vocab, dtype=torch.long))
        else:
            self.d2t = None

    # -- pieces used by drafting and training ---------------------------------------------

    def features(self, taps: torch.Tensor) -> torch.Tensor:
        """``taps [B, T, L * H_t]`` (the tapped target states, concatenated) -> ``[B, T, H]``."""
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context keys and values ``[B, nkv, T, hd]`` of ``feats [B, T, H]``
        at ``positions [B, T]``."""
        cos, sin = rope(positions, self.cfg.head_dim, self.cfg.rope_theta, feats.dtype)
        return [layer.self_attn.kv(feats, cos, sin) for layer in self.layers]

    def backbone(self, ids: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states ``[B, q, H]`` of the block slots ``ids [B, q]`` at
        ``positions [B, q]`` over ``ctx_kv`` (from :meth:`context_kv`) with ``mask [B, 1, q, T + q]``."""
        x = self.embed_tokens(ids).to(self.fc.weight.dtype)
        cos, sin = rope(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., dV]`` logits of the draft vocabulary, before the Markov bias."""
        return self.lm_head(h.to(self.lm_head.weight.dtype)).to(h.dtype)

    def confidence_logit(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """``[...]`` raw confidence of a slot with hidden ``h [..., H]`` after token ``prev [...]``."""
        if self.confidence_head is None:
            return None
        x = h
        if self.confidence_head.proj.in_features > h.shape[-1]:
            x = torch.cat([h, self.markov_head.markov_w1(prev).to(h.dtype)], dim=-1)
        return self.confidence_head(x)

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.d2t is None else ids + self.d2t[ids]


class SharedRows(nn.Module):
    """The rows ``ids [n]`` of a shared output layer ``head`` (``weight [V, H]``): a reduced
    draft vocabulary that borrows the target's ``lm_head`` keeps it shared (nothing is written
    to the checkpoint) and gathers its rows once at load.  ``x [..., H] -> [..., n]``; through
    lightspec-kernels' packed CPU matmul where it runs (float32 on the CPU, no autograd)."""

    def __init__(self, head: nn.Module, ids: torch.Tensor):
        super().__init__()
        w = head.weight.detach()
        self.register_buffer("weight", w[ids.to(w.device)].contiguous(), persistent=False)
        bias = getattr(head, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach()[ids.to(w.device)].contiguous(),
                             persistent=False)
        self._fast = None
        if w.device.type == "cpu" and w.dtype == torch.float32:
            from lightspec_kernels import cpu_linear

            if cpu_linear.available():
                self._fast = cpu_linear.bind(cpu_linear.pack(self.weight), self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fast is not None and x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled():
            return self._fast(x)
        return torch.nn.functional.linear(x, self.weight, self.bias)


class _Own:
    """Marker: build the module (the checkpoint has its own weights)."""


OWN = _Own()
