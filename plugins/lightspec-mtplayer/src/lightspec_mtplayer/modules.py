"""The two kinds of heads as ``torch`` modules, built around a target model.

* ``MTPLayer``: one DeepSeek-V3 / MiMo / GLM-style multi-token-prediction module
  (``enorm``, ``hnorm``, ``eh_proj``, one decoder block of the target's own architecture,
  ``shared_head.norm`` and ``shared_head.head``; the embedding is the target's, and so is the
  head when the checkpoint has none).  For a token ``x [.., q]`` and a state ``h [.., q, H]``:
  ``out = block(eh_proj([enorm(embed(x)); hnorm(h)]))`` ``[.., q, H]`` and
  ``logits = head(shared_head.norm(out))`` ``[.., q, V]``.
* ``MedusaHeads``: K parallel heads over the target's last hidden state ``h [.., H]``: head i
  is ``medusa_num_layers`` residual blocks ``x + SiLU(linear(x))`` then a ``[V, H]`` head
  (its own, or the target's lm_head when the checkpoint shares it); ``logits [.., K, V]``.

State-dict names follow the public formats (``formats.py`` maps them onto files).
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from lightspec_core import InvalidTypeError, LightSpecError, decoder_layers


def rotary_of(target: nn.Module) -> nn.Module:
    """The target's rotary-embedding module (``forward(x, position_ids) -> (cos, sin)``)."""
    for module in target.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            return module
    raise ValueError(f"{type(target).__name__} has no rotary embedding module: MTP modules need a RoPE target")


def block_config(target: nn.Module):
    """A copy of the target's config whose attention runs through SDPA with explicit masks."""
    cfg = copy.deepcopy(target.config)
    cfg._attn_implementation = "sdpa"
    return cfg


# what decoder blocks call their KV cache: transformers 5.25; 5.17 and earlier 5.x; 4.x; GPT-NeoX
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")


def cache_argument(block: nn.Module) -> str:
    """The name under which ``block.forward`` takes its KV cache: ``cache`` (transformers
    5.25), ``past_key_values`` (5.17 and earlier 5.x releases), ``past_key_value`` (4.x) or
    ``layer_past`` (GPT-NeoX).  A cache passed
    under another name lands in ``**kwargs`` and is silently ignored (the block then attends
    to the new tokens only), so an unknown signature is refused here."""
    params = inspect.signature(block.forward).parameters
    for name in CACHE_ARGUMENTS:
        if name in params:
            return name
    raise InvalidTypeError(f"{type(block).__name__}.forward takes no KV cache argument ({', '.join(CACHE_ARGUMENTS)}); "
                         f"its parameters: {', '.join(params)}")


def check_mtp_target(target: nn.Module) -> None:
    """Refuse, with one ``LightSpecError`` naming what is missing, a target whose decoder blocks
    cannot make an MTP module: one needs rotary position embeddings (the block is fed no other
    positions), a norm before attention (``input_layernorm``, the family's norm class) and a
    KV-cache argument.  GPT-2 and OPT blocks have neither of the first two; Medusa heads
    (``--kind medusa``) need none of them."""
    block = decoder_layers(target)[1][0]
    missing = []
    if not any(type(m).__name__.endswith("RotaryEmbedding") for m in target.modules()):
        missing.append("no rotary position embeddings")
    if not isinstance(getattr(block, "input_layernorm", None), nn.Module):
        missing.append(f"{type(block).__name__} has no input_layernorm")
    params = inspect.signature(block.forward).parameters
    if not any(name in params for name in CACHE_ARGUMENTS):
        missing.append(f"{type(block).__name__}.forward takes no KV cache ({', '.join(CACHE_ARGUMENTS)})")
    if missing:
        raise LightSpecError(f"MTP modules need a target with rotary positions and Llama-style decoder blocks; "
                             f"{type(target).__name__} has {'; '.join(missing)}: use Medusa heads for it "
                             "(lightspec mtplayer train --kind medusa)")


class _SharedHead(nn.Module):
    """``shared_head``: a norm and, unless shared with the target, a head ``[V, H]``."""

    def __init__(self, norm: nn.Module, head: nn.Module | None):
        super().__init__()
        self.norm = norm
        if head is not None:
            self.head = head


class MTPLayer(nn.Module):
    """One MTP module (module docstring).  ``index`` is its layer number in the checkpoint
    (``num_hidden_layers + i``); the block writes to layer 0 of whatever cache it is given,
    so each module keeps its own single-layer cache."""

    def __init__(self, target: nn.Module, index: int, own_head: bool):
        super().__init__()
        check_mtp_target(target)
        cfg = block_config(target)
        H = cfg.hidden_size
        block_cls = type(decoder_layers(target)[1][0])
        # built as the target's last block (configs with per-layer types list only the target's layers)
        block = block_cls(cfg, layer_idx=min(index, cfg.num_hidden_layers - 1))
        for module in block.modules():  # self_attn (Llama family), attention (GPT-NeoX)
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = 0
        # the family's own norm class, from the fresh block (the target's may carry LightSpec's CPU kernels)
        norm_cls = type(block.input_layernorm)
        eps = getattr(cfg, "rms_norm_eps", 1e-6)
        self.enorm = norm_cls(H, eps=eps)
        self.hnorm = norm_cls(H, eps=eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.block = block
        head = nn.Linear(H, cfg.vocab_size, bias=False) if own_head else None
        self.shared_head = _SharedHead(norm_cls(H, eps=eps), head)
        self.index = index
        self._cache_arg = cache_argument(block)
        # the target's modules, shared (not parameters of this module: never saved or trained)
        object.__setattr__(self, "_embed", target.get_input_embeddings())
        object.__setattr__(self, "_target_head", target.get_output_embeddings())
        object.__setattr__(self, "_rotary", rotary_of(target))

    @property
    def own_head(self) -> bool:
        return hasattr(self.shared_head, "head")

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """``out [.., H]`` (the block's output) -> logits ``[.., V]``."""
        x = self.shared_head.norm(out)
        return self.shared_head.head(x) if self.own_head else self._target_head(x)

    def forward(self, input_ids: torch.Tensor, states: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache=None) -> torch.Tensor:
        """``input_ids [B, q]``, ``states [B, q, H]`` (the state each token follows),
        ``position_ids [B, q]``, ``attention_mask [B, 1, q, cols]`` bool (True: attend) ->
        the block's output ``[B, q, H]``; keys and values go to ``cache`` layer 0 when given."""
        e = self.enorm(self._embed(input_ids).to(states.dtype))
        x = self.eh_proj(torch.cat([e, self.hnorm(states)], dim=-1))
        cos_sin = self._rotary(x, position_ids)
        out = self.block(x, attention_mask=attention_mask, position_ids=position_ids, use_cache=cache is not None,
                         position_embeddings=cos_sin, **{self._cache_arg: cache})
        return out[0] if isinstance(out, tuple) else out


class _ResBlock(nn.Module):
    """``x + SiLU(linear(x))`` (Medusa's residual block; the bias is optional in vLLM's format)."""

    def __init__(self, H: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(H, H, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads (module docstring).  ``heads[i]`` holds the residual blocks of head i
    (``heads[i][j]``, ``j < num_layers``); ``lm_heads[i]`` its own head, absent when shared."""

    def __init__(self, target: nn.Module, num_heads: int, num_layers: int, own_heads: bool, bias: bool = True):
        super().__init__()
        H, V = target.config.hidden_size, target.config.vocab_size
        self.heads = nn.ModuleList(nn.Sequential(*[_ResBlock(H, bias) for _ in range(num_layers)])
                                   for _ in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(H, V, bias=False) for _ in range(num_heads)) if own_heads else None
        self.num_heads, self.num_layers, self.bias = num_heads, num_layers, bias
        object.__setattr__(self, "_target_head", target.get_output_embeddings())

    @property
    def own_heads(self) -> bool:
        return self.lm_heads is not None

    def zero_init(self) -> None:
        """Medusa's initialisation: blocks start as the identity (zero linear), own heads as
        copies of the target's lm_head, so an untrained head predicts what the target does."""
        for seq in self.heads:
            for block in seq:
                nn.init.zeros_(block.linear.weight)
                if block.linear.bias is not None:
                    nn.init.zeros_(block.linear.bias)
        if self.lm_heads is not None:
            for lin in self.lm_heads:
                lin.weight.data.copy_(self._target_head.weight.data)

    def forward(self, h: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """``h [.., H]`` -> logits ``[.., K, V]`` of the first ``heads`` (default all) heads."""
        n = self.num_heads if heads is None else heads
        outs = []
        for i in range(n):
            x = self.heads[i](h)
            outs.append(self.lm_heads[i](x) if self.lm_heads is not None else self._target_head(x))
        return torch.stack(outs, dim=-2)
