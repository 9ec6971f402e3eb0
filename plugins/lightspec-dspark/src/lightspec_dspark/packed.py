"""The drafter's inference forward on the CPU through lightspec-kernels.

Why: a block forward of the zoo's one-layer drafter written as torch modules is ~60 tensor
operations (five RMSNorms of ~6 operations each, the rotary tables rebuilt from the positions,
q/k/v as three products, SDPA with its key/value concatenation), each ~10-15 us on this CPU
at batch 1, where the block's arithmetic is a fraction of that.  ``PackedDSpark`` runs the same
forward with each weight packed once (``cpu_linear``; q/k/v, k/v and gate/up side by side),
each norm one call (``cpu_norm_rope.bind_rms_norm``), the rotary tables computed once per
position and the attention as one kernel call (``cpu_attention``, non-causal).

It computes what ``DSparkDraft.features`` / ``context_kv`` / ``backbone`` compute, in
inference only, for float32 CPU drafters, up to the order of the norms' and dot products'
summations (|diff| ~ 1e-6 relative).  Drafts never change the output (the target verifies
them); they change only how many are accepted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightspec_kernels import cpu_attention, cpu_linear, cpu_norm_rope

from .model import DSparkDraft, rope


def packed_drafter_for(d: DSparkDraft) -> "PackedDSpark | None":
    """A ``PackedDSpark`` for ``d`` when its weights are float32 on the CPU and the compiled
    kernels are available here; ``None`` otherwise (the modules' own forward is used)."""
    w = d.fc.weight
    if (w.device.type != "cpu" or w.dtype != torch.float32 or not cpu_linear.available()
            or not cpu_attention.available()):
        return None
    return PackedDSpark(d)


def _bind(weights: list[torch.Tensor], biases: list[torch.Tensor | None]):
    """One bound product for the weights' outputs side by side (``[sum N, K]``)."""
    w = torch.cat([t.detach() for t in weights]).contiguous()
    b = None if all(x is None for x in biases) else torch.cat(
        [x.detach() if x is not None else w.new_zeros(t.shape[0]) for t, x in zip(weights, biases)])
    return cpu_linear.bind(cpu_linear.pack(w), b)


def _norm(norm):
    return cpu_norm_rope.bind_rms_norm(norm.weight.detach().float(), norm.eps)


class _Layer:
    def __init__(self, layer):
        at, mlp = layer.self_attn, layer.mlp
        self.nh, self.nkv, self.hd = at.nh, at.nkv, at.hd
        lin = (at.q_proj, at.k_proj, at.v_proj)
        self.qkv = _bind([m.weight for m in lin], [m.bias for m in lin])
        self.kv = _bind([m.weight for m in lin[1:]], [m.bias for m in lin[1:]])
        self.o = _bind([at.o_proj.weight], [at.o_proj.bias])
        self.gate_up = _bind([mlp.gate_proj.weight, mlp.up_proj.weight], [None, None])
        self.down = _bind([mlp.down_proj.weight], [None])
        self.inter = mlp.gate_proj.weight.shape[0]
        self.q_norm, self.k_norm = _norm(at.q_norm), _norm(at.k_norm)
        self.in_norm, self.post_norm = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)


class PackedDSpark:
    """The drafting forward of ``d`` (module docstring).  Built once per loaded drafter."""

    def __init__(self, d: DSparkDraft):
        self.d, self.cfg = d, d.cfg
        self.layers = [_Layer(layer) for layer in d.layers]
        self.fc = _bind([d.fc.weight], [None])
        self.hidden_norm, self.norm = _norm(d.hidden_norm), _norm(d.norm)
        self.cos = self.sin = torch.zeros(0, self.cfg.head_dim)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B, n, hd]`` at ``positions [B, n]`` from a table grown as positions come
        (the same values ``model.rope`` computes)."""
        top = int(positions.max()) + 1 if positions.numel() else 0
        if top > self.cos.shape[0]:
            n = max(top, 2 * self.cos.shape[0], 1024)
            cos, sin = rope(torch.arange(n)[None], self.cfg.head_dim, self.cfg.rope_theta, torch.float32)
            self.cos, self.sin = cos[0, 0].contiguous(), sin[0, 0].contiguous()
        return self.cos[positions], self.sin[positions]

    def features(self, taps: torch.Tensor) -> torch.Tensor:
        """As ``DSparkDraft.features``: taps ``[B, T, L * H_t]`` → ``[B, T, H]``."""
        return self.hidden_norm(self.fc(taps.float()))

    def _keys_values(self, layer: _Layer, kv: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv [B, n, 2 nkv hd]`` → keys (normed, rotated) and values ``[B, nkv, n, hd]``."""
        B, n = kv.shape[:2]
        k, v = kv.split(layer.nkv * layer.hd, -1)
        k = layer.k_norm(k.reshape(B, n, layer.nkv, layer.hd)).transpose(1, 2)
        return cpu_norm_rope.rotary(k, cos, sin), v.reshape(B, n, layer.nkv, layer.hd).transpose(1, 2)

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """As ``DSparkDraft.context_kv``: per layer ``(k, v)`` ``[B, nkv, T, hd]``."""
        cos, sin = self._rope(positions)
        return [self._keys_values(layer, layer.kv(feats), cos, sin) for layer in self.layers]

    def backbone(self, ids: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor | None) -> torch.Tensor:
        """As ``DSparkDraft.backbone`` (``mask [B, 1, q, T + q]`` bool, or None: every column visible)."""
        x = F.embedding(ids, self.d.embed_tokens.weight).float()
        B, q, _ = x.shape
        cos, sin = self._rope(positions)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            qkv = layer.qkv(layer.in_norm(x))
            nq = layer.nh * layer.hd
            qh = layer.q_norm(qkv[..., :nq].reshape(B, q, layer.nh, layer.hd)).transpose(1, 2)
            qh = cpu_norm_rope.rotary(qh, cos, sin)
            k, v = self._keys_values(layer, qkv[..., nq:], cos, sin)
            k, v = torch.cat([ck, k], 2), torch.cat([cv, v], 2)
            a = cpu_attention.attention(qh, k, v, mask, causal=False)  # [B, q, nh, hd]
            x, h = layer.post_norm(layer.o(a.reshape(B, q, nq)), x)  # x + o(a), and its norm
            gate, up = layer.gate_up(h).split(layer.inter, -1)
            x = x + layer.down(F.silu(gate) * up)
        return self.norm(x)
