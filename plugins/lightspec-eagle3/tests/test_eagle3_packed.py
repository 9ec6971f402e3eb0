"""The packed CPU drafting forward (``packed.PackedHead``) computes what the head module
computes: fused features, cached layer outputs over several appends (prefix, then one
drafted pair at a time, with a padding mask) and draft logits, for every public layout,
up to the order of each dot product's summation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from e3_fixtures import LAYOUTS, head_config, random_head, tiny_target, write_layout
from lightspec_eagle3.checkpoint import load_head
from lightspec_eagle3.drafter import _CacheModel
from lightspec_eagle3.modeling import Eagle3Head
from lightspec_eagle3.packed import PackedHead, packed_head_for
from lightspec_kernels import cpu_linear

from lightspec_core import KVCache

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="no compiled CPU linear kernel here")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_forward_equals_the_module(tmp_path, layout):
    target = tiny_target()
    head = load_head(write_layout(tmp_path / "h", random_head(target, layout), layout), target)
    fast = packed_head_for(head)
    assert isinstance(fast, PackedHead)
    assert fast.layer is not None  # the layer runs as one C call (cpu_two_stream): that is what is compared
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 96, (2, 9), generator=g)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i] for i in head.cfg.taps(6)], -1)
        torch.testing.assert_close(fast.fuse(taps), head.fuse(taps), atol=1e-5, rtol=1e-5)
        outs = []
        for impl in (head, fast):
            runner = _CacheModel(head, None if impl is head else fast)
            kv = KVCache(runner, 2, torch.device("cpu"), capacity=32)
            runner.features = impl.fuse(taps[:, :6])
            valid = torch.ones(2, 6, dtype=torch.bool)
            valid[1, 4:] = False  # a shorter second row
            h = kv.forward(ids[:, 1:7], valid).hidden[:, 3]
            seq = [impl.draft_logits(h)]
            for s in range(3):  # drafted pairs: the previous output as the feature
                runner.features = head.feedback(h)[:, None]
                h = kv.forward(ids[:, 7 + s - 1: 7 + s]).hidden[:, 0]
                seq.append(impl.draft_logits(h))
            outs.append(torch.stack(seq))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


def test_no_packing_for_heads_it_cannot_run(tmp_path):
    """A head in float64 (or on another device) keeps the module's own forward."""
    target = tiny_target()
    head = load_head(write_layout(tmp_path / "h", random_head(target), "eagle"), target).double()
    assert packed_head_for(head) is None


def test_packed_forward_equals_the_module_on_tree_nodes(tmp_path):
    """Tree nodes (a custom mask: each node sees the committed pairs and its ancestors, at
    depth positions) give the same outputs through the packed forward (its attention kernel
    reads the boolean mask) as through the module (SDPA)."""
    target = tiny_target()
    head = load_head(write_layout(tmp_path / "h", random_head(target, "eagle"), "eagle"), target)
    fast = packed_head_for(head)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 96, (1, 8), generator=g)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i] for i in head.cfg.taps(6)], -1)
        outs = []
        for impl in (head, fast):
            runner = _CacheModel(head, None if impl is head else fast)
            kv = KVCache(runner, 1, torch.device("cpu"), capacity=32)
            runner.features = impl.fuse(taps[:, :6])
            root = kv.forward(ids[:, 1:7]).hidden[:, -1]
            # three nodes: two children of the root, then a child of the second
            tokens = torch.tensor([[11, 12, 13]])
            feats = head.feedback(torch.stack([root[0], root[0], root[0] * 0.5]))[None]
            anc = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
            mask = torch.cat([torch.ones(3, 6, dtype=torch.bool), anc], 1)[None, None]
            runner.features = feats
            out = kv.forward(tokens, tree_mask=mask, tree_positions=torch.tensor([[6, 6, 7]])).hidden
            outs.append(impl.draft_logits(out))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


def test_positions_past_the_rotary_table_fall_back_to_the_op_by_op_forward():
    """A head whose config gives fewer positions than a sequence reaches: the C layer (rotary
    table by position) refuses them before writing anything, and the op-by-op forward
    computes those pairs, as the module does."""
    target = tiny_target()
    cfg = dataclasses.replace(head_config(), max_position_embeddings=8)
    head = random_head(target)
    short = Eagle3Head(cfg, own_embed=False, own_lm_head=True, embed=target.get_input_embeddings().weight)
    short.load_state_dict(head.state_dict())
    fast = packed_head_for(short)
    assert fast.layer is not None
    ids = torch.randint(3, 96, (1, 13), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i] for i in cfg.taps(6)], -1)
        outs = []
        for impl in (short, fast):
            runner = _CacheModel(short, None if impl is short else fast)
            kv = KVCache(runner, 1, torch.device("cpu"), capacity=4)  # and the slab grows on the way
            steps = []
            for t in range(12):  # one pair per forward: positions 0 .. 11, past the table from 8 on
                runner.features = impl.fuse(taps[:, t : t + 1])
                steps.append(kv.forward(ids[:, t + 1 : t + 2]).hidden[:, 0])
            outs.append(torch.stack(steps))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
