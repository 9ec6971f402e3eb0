"""The EAGLE-3 head as a torch module, with the parameter names of the public checkpoints.

One drafting position reads a token ``x`` and a feature ``g`` (both ``[.., H]`` after the
embedding):

    g0       = fc(concat of the tapped target hidden states)      (committed tokens only;
                                                                    input_norm first if norm_before_fc)
    residual = g                or hidden_norm(g) if norm_before_residual
    a        = [input_layernorm(embed(x)); hidden_norm(g)]          [2H]: q/k/v read 2H
    h        = residual + o_proj(attention(a))
    h        = h + mlp(post_attention_layernorm(h))                 the layer's output (pre-norm)
    logits   = lm_head(norm(h))                                     [draft_vocab]
    next g   = h                (norm(h) if norm_output, the speculators option)

Pair ``t`` of a sequence reads the feature of token t and the embedding of token t + 1 and
sits at position t; its logits predict token t + 2.  A drafted token's pair reads the
previous pair's output as its feature.  ``ttt_logits`` unrolls exactly these positions and
masks for training (EAGLE-3's training-time test).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from .config import HeadConfig


class RMSNorm(nn.Module):
    """Llama's RMSNorm (fp32 statistics, weight applied in the input dtype)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        H, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * H, self.heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(2 * H, self.kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(2 * H, self.kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.heads * hd, H, bias=cfg.attention_bias)


class MLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        H, inter = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(H, inter, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(H, inter, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(inter, H, bias=cfg.mlp_bias)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The head's one decoder layer, split where training and the cached forward differ:
    ``project`` (q, k, v and the residual) and ``finish`` (o_proj, residual, MLP)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm_before_residual = cfg.norm_before_residual

    def project(self, emb: torch.Tensor, feat: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """emb, feat ``[B, q, H]`` → q ``[B, heads, q, d]``, k, v ``[B, kv_heads, q, d]`` (q, k
        rotated) and the residual ``[B, q, H]``."""
        B, T, _ = feat.shape
        normed = self.hidden_norm(feat)
        residual = normed if self.norm_before_residual else feat
        a = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        at = self.self_attn
        q = at.q_proj(a).view(B, T, at.heads, at.head_dim).transpose(1, 2)
        k = at.k_proj(a).view(B, T, at.kv_heads, at.head_dim).transpose(1, 2)
        v = at.v_proj(a).view(B, T, at.kv_heads, at.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, residual

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """residual ``[B, q, H]``, attention output ``[B, heads, q, d]`` → the layer's output ``[B, q, H]``."""
        B, _, T, _ = attn.shape
        h = residual + self.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA with grouped KV heads: q ``[B, h, q, d]``, k/v ``[B, kv, c, d]``, mask bool
    ``[B or 1, 1, q, c]`` (True = attend) → ``[B, h, q, d]``."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head (module docstring).  Parameter names are those of the public
    checkpoints with ``layers.0.`` for the decoder layer.

    ``embed`` / ``lm_head``: the target's input-embedding and output-embedding weights, used
    when the head has no ``embed_tokens`` / ``lm_head`` of its own (they are not parameters
    of this module and are never saved with it)."""

    def __init__(self, cfg: HeadConfig, own_embed: bool = False, own_lm_head: bool = True,
                 embed: torch.Tensor | None = None, lm_head: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        H, Ht = cfg.hidden_size, cfg.target_hidden_size
        self.fc = nn.Linear(cfg.n_taps * Ht, H, bias=False)
        self.input_norm = RMSNorm(cfg.n_taps * Ht, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H) if own_embed else None
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False) if own_lm_head else None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool) if cfg.draft_vocab_size == cfg.vocab_size
                             else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        # a tuple: tensors held by a plain attribute would be registered (and saved) as parameters
        self._shared = (embed, lm_head)
        rope_cfg = LlamaConfig(hidden_size=H, num_attention_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
                               max_position_embeddings=cfg.max_position_embeddings, rope_parameters=dict(cfg.rope))
        self.rotary = LlamaRotaryEmbedding(rope_cfg)

    # -- pieces -----------------------------------------------------------------------------

    @property
    def layer(self) -> DecoderLayer:
        return self.layers[0]

    def embedding_table(self) -> torch.Tensor:
        """``[vocab, H]``: the head's own token embeddings, or the target's it shares."""
        return self.embed_tokens.weight if self.embed_tokens is not None else self._shared[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding_table())

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """taps ``[.., n_taps * H_target]`` (tapped target states, concatenated in tap order) → ``[.., H]``."""
        if self.input_norm is not None:
            taps = self.input_norm(taps)
        return self.fc(taps)

    def feedback(self, h: torch.Tensor) -> torch.Tensor:
        """The feature a drafted token's pair reads from the previous pair's output ``h``."""
        return self.norm(h) if self.cfg.norm_output else h

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h ``[.., H]`` → logits over the draft vocabulary ``[.., draft_vocab]``."""
        x = self.norm(h)
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.shared_lm_head())

    def shared_lm_head(self) -> torch.Tensor:
        """``[draft_vocab, H]``: the target's output-embedding rows of the draft vocabulary, for a
        head without an ``lm_head`` of its own (all rows when the draft vocabulary is the
        target's; the rows ``target_ids()`` otherwise, gathered once after ``d2t`` changes)."""
        w = self._shared[1]
        if self.cfg.draft_vocab_size == w.shape[0]:
            return w
        # keyed on the tensors and their in-place versions: no comparison of values (which
        # would sync a GPU on every draft token)
        key = (id(self.d2t), self.d2t._version, id(w), w._version, w.dtype, w.device)
        cached = getattr(self, "_rows", None)
        if cached is None or cached[0] != key:
            self._rows = cached = (key, w[self.target_ids().to(w.device)].contiguous())
        return cached[1]

    def target_ids(self) -> torch.Tensor:
        """``[draft_vocab]`` int64: the target token id of each draft id (``i + d2t[i]``)."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin ``[B, q, d]`` for positions ``[B, q]``."""
        return self.rotary(like, positions)

    # -- the cached forward (drafting) --------------------------------------------------------

    def forward_cached(self, ids: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                       mask: torch.Tensor | None, cache) -> torch.Tensor:
        """Append ``q`` pairs to ``cache`` (a transformers ``Cache``, layer 0) and return the
        layer's outputs ``[B, q, H]``.  ids ``[B, q]``, feat ``[B, q, H]``, positions ``[B, q]``;
        mask bool ``[B, 1, q, cols]`` over every cached column after the append (None: all
        columns, causal among the new ones)."""
        emb = self.embed(ids).to(feat.dtype)
        cos, sin = self.rope(positions, feat)
        q, k, v, residual = self.layer.project(emb, feat, cos, sin)
        keys, values = cache.update(k, v, 0)
        n = q.shape[2]
        if mask is None and n > 1:
            cols = keys.shape[2]
            j = torch.arange(n, device=q.device)
            mask = (torch.arange(cols, device=q.device)[None, :] <= (cols - n + j)[:, None])[None, None]
        return self.layer.finish(residual, attend(q, keys, values, mask))


def ttt_logits(head: Eagle3Head, g: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """EAGLE-3's training-time test: the head unrolled ``steps`` drafting steps over whole
    sequences at once, with the positions and masks a draft chain has at inference.

    g ``[B, T, H]`` (fused target features of tokens 0..T-1), ids ``[B, T]`` → one logits tensor
    per step s = 1..steps, ``[B, T - s, draft_vocab]``: at index t the prediction of token
    t + s + 1 (to compare with the target's distribution at position t + s).  Step s at index t
    reads token t + s and the step-(s-1) output at t, sits at position t + s - 1, and attends to
    the step-1 keys of indices <= t and to its own earlier steps' keys at index t."""
    B, T = ids.shape
    dev = ids.device
    idx = torch.arange(T, device=dev)
    keys, values, out = [], [], []
    feat = g
    for s in range(1, steps + 1):
        n = T - s
        if n < 1:
            break
        emb = head.embed(ids[:, s: s + n]).to(g.dtype)
        pos = (idx[:n] + s - 1)[None].expand(B, n)
        cos, sin = head.rope(pos, g)
        q, k, v, residual = head.layer.project(emb, feat[:, :n], cos, sin)
        keys.append(k)
        values.append(v)
        K = torch.cat([kk[:, :, :n] for kk in keys], 2)
        V = torch.cat([vv[:, :, :n] for vv in values], 2)
        causal = idx[:n, None] >= idx[None, :n]
        diag = torch.eye(n, dtype=torch.bool, device=dev)
        mask = torch.cat([causal] + [diag] * (len(keys) - 1), 1)[None, None]
        h = head.layer.finish(residual, attend(q, K, V, mask))
        out.append(head.draft_logits(h))
        feat = head.feedback(h)
    return out
