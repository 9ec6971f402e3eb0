"""An MTP module hands its KV cache to the decoder block under the name the block takes.

transformers renamed the decoder layers' cache argument within 5.x (``past_key_values`` in
5.17, ``cache`` in 5.25). A cache passed under the other name lands in the block's
``**kwargs`` and is dropped without an error: the module then attends to the new tokens
only (training failed on a shape mismatch, drafting silently drafted other tokens). Here a
block with the older signature must give the same outputs as the current one.
"""

from __future__ import annotations

import pytest
import torch
from fixtures import build_target
from lightspec_mtplayer.modules import MTPLayer, cache_argument
from torch import nn
from transformers import DynamicCache

from lightspec_core import decoder_layers


def _older_signature(block_cls):
    """``block_cls`` with the transformers 5.17 signature: the cache as ``past_key_values``,
    anything else swallowed by ``**kwargs`` (as HF's layers do)."""

    class Older(block_cls):
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=use_cache, position_embeddings=position_embeddings,
                                   **{cache_argument(super()): past_key_values})

    return Older


def test_cache_argument_names():
    class New(nn.Module):
        def forward(self, x, cache=None, **kw): ...

    class Old(nn.Module):
        def forward(self, x, past_key_values=None, **kw): ...

    class Four(nn.Module):
        def forward(self, x, past_key_value=None, **kw): ...

    class NoCache(nn.Module):
        def forward(self, x, **kw): ...

    assert [cache_argument(m()) for m in (New, Old, Four)] == ["cache", "past_key_values", "past_key_value"]
    with pytest.raises(TypeError, match="takes no KV cache argument"):
        cache_argument(NoCache())


def _two_forwards(layer: MTPLayer, ids: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """A prefill of 5 tokens, then 2 more over the cache; the second forward's output."""
    cache = DynamicCache()
    B, T = ids.shape
    pos = torch.arange(T)[None].expand(B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    layer(ids[:, :5], states[:, :5], pos[:, :5], causal[None, None, :5, :5].expand(B, 1, 5, 5), cache=cache)
    return layer(ids[:, 5:], states[:, 5:], pos[:, 5:], causal[None, None, 5:, :].expand(B, 1, T - 5, T), cache=cache)


def test_a_block_with_the_older_cache_argument_sees_the_cache():
    target = build_target("llama")
    L = target.config.num_hidden_layers
    torch.manual_seed(3)
    current = MTPLayer(target, L, own_head=False).eval()
    for block in decoder_layers(target)[1]:  # MTPLayer builds its block from the target's block class
        block.__class__ = _older_signature(type(block))
    older = MTPLayer(target, L, own_head=False).eval()
    assert cache_argument(older.block) == "past_key_values"
    older.load_state_dict(current.state_dict())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (2, 7), generator=g)
    states = torch.randn(2, 7, target.config.hidden_size, generator=g)
    with torch.no_grad():
        want = _two_forwards(current, ids, states)
        got = _two_forwards(older, ids, states)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
