"""The packed CPU drafting forward (``packed.PackedDSpark``) computes what the drafter's modules
compute: the context features, the context keys and values, and a block's final hidden states
over a padded context (a mask) or a single row's (no mask), up to the order of each dot
product's summation."""

from __future__ import annotations

import pytest
import torch
from dspark_fixtures import tiny_target, write_checkpoint
from lightspec_dspark.checkpoint import load_drafter
from lightspec_dspark.packed import PackedDSpark, packed_drafter_for
from lightspec_kernels import cpu_attention, cpu_linear

pytestmark = pytest.mark.skipif(not (cpu_linear.available() and cpu_attention.available()),
                                reason="no compiled CPU kernels here")


@pytest.mark.parametrize("layers,draft_vocab", [(1, None), (2, 40)])
def test_packed_forward_equals_the_modules(tmp_path, layers, draft_vocab):
    target = tiny_target()
    d = load_drafter(write_checkpoint(tmp_path / "d", target, layers=layers, draft_vocab=draft_vocab), target,
                     dtype=torch.float32, device=torch.device("cpu"))
    fast = packed_drafter_for(d)
    assert isinstance(fast, PackedDSpark)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 96, (2, 11), generator=g)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1] for i in d.cfg.target_layer_ids], -1)[:, :8]
        torch.testing.assert_close(fast.features(taps), d.features(taps), atol=1e-5, rtol=1e-5)
        positions = torch.arange(8)[None].expand(2, 8)
        kv_mod = d.context_kv(d.features(taps), positions)
        kv_fast = fast.context_kv(fast.features(taps), positions)
        for (k1, v1), (k2, v2) in zip(kv_mod, kv_fast):
            torch.testing.assert_close(k2, k1, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v2, v1, atol=1e-5, rtol=1e-5)
        gamma = d.cfg.block_size
        block = torch.full((2, gamma), d.cfg.mask_token_id)
        block[:, 0] = ids[:, 8]
        bpos = 8 + torch.arange(gamma)[None].expand(2, gamma)
        valid = torch.ones(2, 8, dtype=torch.bool)
        valid[1, 6:] = False  # a shorter second row
        mask = torch.cat([valid[:, None].expand(2, gamma, 8), torch.ones(2, gamma, gamma, dtype=torch.bool)], -1)[:, None]
        torch.testing.assert_close(fast.backbone(block, bpos, kv_fast, mask), d.backbone(block, bpos, kv_mod, mask),
                                   atol=1e-5, rtol=1e-5)
        one = [(k[:1], v[:1]) for k, v in kv_mod]
        torch.testing.assert_close(fast.backbone(block[:1], bpos[:1], one, None),
                                   d.backbone(block[:1], bpos[:1], one, torch.ones(1, 1, gamma, 8 + gamma, dtype=torch.bool)),
                                   atol=1e-5, rtol=1e-5)


def test_no_packing_for_drafters_it_cannot_run(tmp_path):
    target = tiny_target()
    d = load_drafter(write_checkpoint(tmp_path / "d", target), target, dtype=torch.float32,
                     device=torch.device("cpu")).double()
    assert packed_drafter_for(d) is None
