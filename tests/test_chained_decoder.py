"""The lean forward's chained path (``cpu_decoder``: one compiled call per block) on models
whose pieces all run LightSpec's CPU kernels: the same logits as the op-by-op lean
forward and as HF's forward, bit for bit, through ragged batches, holes, rollbacks,
slab growth and captured hidden states; models it cannot run keep the op-by-op forward."""

from __future__ import annotations

import pytest
import torch
from helpers import ragged_append, ragged_steps
from lightspec_core.cpu_norm import use_cpu_norms
from lightspec_core.hf_attention import use_cpu_attention
from lightspec_core.kvcache import KVCache
from lightspec_core.lean_decoder import exact_lean_target, lean_forward
from lightspec_core.weight_layout import use_cpu_layout
from lightspec_kernels import cpu_decoder
from models import build_model

pytestmark = pytest.mark.skipif(not cpu_decoder.available(), reason=f"CPU kernel unavailable: {cpu_decoder.reason()}")
CPU = torch.device("cpu")


def _kernel_model(arch: str, **overrides):
    model = build_model(arch, **overrides)
    use_cpu_layout(model)
    use_cpu_norms(model)
    use_cpu_attention(model)
    return model


def _steps(kv: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``helpers.ragged_steps``, then one-token steps past the slab's capacity (growth) and
    a verify-wide step; (logits, real positions) per forward."""
    return ragged_steps(kv, seed=1, one_token_steps=6, wide=5)


def _run(runner, capacity: int = 12, per_row: bool | None = False):
    """``_steps`` through a 3-row cache; ``per_row=False``: the layout with holes, which every
    model can run (``None``: per row where the runner offers it)."""
    with torch.inference_mode():
        return _steps(KVCache(runner, 3, CPU, capacity=capacity, per_row=per_row))


def _alone(runner, row: int) -> list[torch.Tensor]:
    """``_steps``' tokens for one row, run alone (batch 1, its real tokens only): the logits
    of each forward."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 500, (3, 9), generator=g)[row : row + 1]
    prefill, keep, append = (9, 6, 4)[row], (5, 3, 4)[row], (2, 3, 1)[row]  # as helpers.ragged_steps
    kv = KVCache(runner, 1, CPU, capacity=12)
    with torch.inference_mode():
        out = [kv.forward(ids[:, :prefill]).logits]
        kv.truncate([keep])
        out.append(kv.forward(ids[:, :append]).logits)
        out += [kv.forward(ids[:, j : j + 1]).logits for j in range(6)]
        out.append(kv.forward(ids[:, :5]).logits)
    return [o[0] for o in out]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("fused_activation", [True, False])
def test_chained_forward_is_the_op_by_op_forward_and_hf_bit_for_bit(arch, fused_activation):
    model = _kernel_model(arch)
    chained = exact_lean_target(model)  # its probe already compares with HF bit for bit
    assert chained is not None and chained.chained is not None
    assert chained.chained.fused_activation  # the C SwiGLU rounds as PyTorch's on this machine
    chained.chained.fused_activation = fused_activation  # False: the activation between blocks in PyTorch
    plain = lean_forward(model)
    plain.chained = None
    for (a, valid), (b, _), (c, _) in zip(_run(chained), _run(plain), _run(model)):
        assert torch.equal(a[valid], b[valid])
        assert torch.equal(a[valid], c[valid])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_per_row_layout_gives_each_row_what_it_gets_alone(arch):
    """The per-row cache layout (``row_offsets``: no holes) through the same ragged steps:
    every row's logits are, bit for bit, what that row gets decoded alone at batch 1 (the
    layout with holes rounds the attention's sums differently, by ~3e-6)."""
    model = _kernel_model(arch)
    chained = exact_lean_target(model)
    assert chained is not None and chained.row_offsets_ok
    kv = KVCache(chained, 3, CPU, capacity=12)
    assert kv.per_row
    with torch.inference_mode():
        steps = _steps(kv)
    for row in range(3):
        for (logits, valid), want in zip(steps, _alone(chained, row)):
            assert torch.equal(logits[row][valid[row]], want)
    assert not kv.has_holes and kv.cols == int(kv.npos.max())


def test_chained_capture_records_what_the_op_by_op_forward_records():
    model = _kernel_model("llama")
    chained, plain = lean_forward(model).capture([0, 1, 2]), lean_forward(model).capture([0, 1, 2])
    plain.chained = None
    assert chained.chained is not None
    kv_a, kv_b = KVCache(chained, 2, CPU), KVCache(plain, 2, CPU)
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(2))
    ragged = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # a padded verify: packed rows
    with torch.inference_mode():
        for q, valid in ((6, None), (1, None), (3, None), (3, ragged)):
            kv_a.forward(ids[:, :q], valid)
            kv_b.forward(ids[:, :q], valid)
            real = torch.ones(2, q, dtype=torch.bool) if valid is None else valid
            assert set(chained.states) == {0, 1, 2}
            for i in (0, 1, 2):
                assert torch.equal(chained.states[i][real], plain.states[i][real])


def test_chained_draft_forward_matches_hf_up_to_rounding():
    model = _kernel_model("llama")
    fast = lean_forward(model, exact=False)
    assert fast.chained is not None
    for (a, valid), (c, _) in zip(_run(fast), _run(model)):
        torch.testing.assert_close(a[valid], c[valid], rtol=1e-4, atol=1e-4)


def test_models_without_every_kernel_keep_the_op_by_op_forward(monkeypatch):
    assert lean_forward(_kernel_model("qwen3")).chained is None  # per-head q/k norms
    assert lean_forward(build_model("llama")).chained is None  # no packed weights, no kernel norms
    no_norms = build_model("llama")
    use_cpu_layout(no_norms)
    use_cpu_attention(no_norms)
    assert lean_forward(no_norms).chained is None
    monkeypatch.setenv("LIGHTSPEC_CHAINED", "0")
    assert lean_forward(_kernel_model("llama")).chained is None


def test_exact_rope_table_reads_the_rotary_modules_values():
    """Head size 32: the chained exact forward reads cos/sin from a table (checked at load
    to hold the rotary module's values bit for bit) and still equals HF's forward."""
    model = _kernel_model("llama", num_attention_heads=2, num_key_value_heads=1)
    lean = exact_lean_target(model)
    assert lean is not None and lean.chained is not None and lean.exact_rope_table
    assert not lean_forward(_kernel_model("llama")).exact_rope_table  # head size 16: not checked, not used
    for (a, valid), (c, _) in zip(_run(lean, capacity=8), _run(model, capacity=8)):
        assert torch.equal(a[valid], c[valid])


@torch.inference_mode()
def test_per_row_cache_rollback_select_and_growth():
    """``KVCache``'s per-row layout through ragged appends, per-row rollbacks (lists and
    tensors), a row dropped and growth past the capacity: every real slot's logits stay
    equal, bit for bit, to its row's run alone, and no hole is ever left."""
    model = _kernel_model("llama")
    lean = exact_lean_target(model)
    g = torch.Generator().manual_seed(3)
    lens = [5, 17, 2, 11]
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lens]
    kv = KVCache(lean, len(seqs), CPU, capacity=8)  # small: forces growth
    assert kv.per_row
    width = max(lens)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        valid[b, : len(s)] = True
    kv.forward(ids, valid)
    assert kv.npos.tolist() == lens and kv.cols == width
    alone = []
    for s in seqs:
        one = KVCache(lean, 1, CPU, capacity=8)
        one.forward(torch.tensor([s]))
        alone.append(one)
    for rnd in range(10):
        B = len(seqs)
        q, new, valid = ragged_append(B, rnd, g)
        before = kv.npos.tolist()
        out = kv.forward(new, valid)
        keep_new = [(b * 7 + rnd * 3) % (q[b] + 1) for b in range(B)]
        for b in range(B):
            want = alone[b].forward(new[b : b + 1, : q[b]]).logits[0]
            assert torch.equal(out.logits[b, : q[b]], want), (rnd, b)
            alone[b].truncate([before[b] + keep_new[b]])
            seqs[b] = seqs[b] + new[b, : keep_new[b]].tolist()
        keep = [n + k for n, k in zip(before, keep_new)]
        kv.truncate(keep if rnd % 2 else torch.tensor(keep))
        assert kv.npos.tolist() == [len(s) for s in seqs] and kv.cols == max(len(s) for s in seqs)
        assert not kv.has_holes
        if rnd == 6:  # drop a row and reorder the rest
            order = [3, 0, 2]
            kv.select_rows(torch.tensor(order))
            seqs, alone = [seqs[i] for i in order], [alone[i] for i in order]
            assert kv.cols == max(len(s) for s in seqs)
    assert kv.cache.layers[0].capacity > 8  # grew


def test_per_row_needs_a_model_that_takes_row_offsets():
    model = _kernel_model("llama")
    with pytest.raises(ValueError, match="row_offsets"):
        KVCache(model, 2, CPU, per_row=True)  # HF's forward: holes only
    lean = exact_lean_target(model)
    a, b = KVCache(lean, 2, CPU), KVCache(lean, 2, CPU, per_row=False)
    with pytest.raises(ValueError, match="same layout"):
        a.copy_from(b, 1)


@pytest.mark.parametrize("strategy,opts", [("ngram", {"min_ngram": 1}), ("draft_model", {}), ("layerskip", {"layers": 1})])
def test_engine_batch_rows_equal_their_batch1_runs_in_the_per_row_layout(strategy, opts):
    """A batch of mixed prompt lengths, drafting 4 tokens every step (ragged acceptance):
    with the per-row layout each row's output is exactly its own batch-1 run's, since its
    logits are bit for bit the same (not only the same argmax)."""
    from models import ToyTokenizer, make_prompts

    from lightspec_core import MTPPipeline

    model = _kernel_model("llama")
    draft = _kernel_model("llama", num_hidden_layers=1) if strategy == "draft_model" else None
    prompts = make_prompts(6, seed=4)
    pipe = MTPPipeline(model, ToyTokenizer(), strategy=strategy, draft_model=draft,
                       budget={"type": "static", "k": 4}, **opts)
    assert pipe.engine.runner.net.row_offsets_ok
    batch = pipe.generate(prompts, max_new_tokens=24, ignore_eos=True)
    drafted, accepted = sum(r.stats.drafted for r in batch), sum(r.stats.accepted for r in batch)
    assert drafted > accepted > 0  # drafts were verified, some rejected: rows at different lengths
    for p, row in zip(prompts, batch):
        assert row.token_ids == pipe.generate([p], max_new_tokens=24, ignore_eos=True)[0].token_ids


def test_per_row_prefill_runs_chained_and_packed_and_equals_hf(monkeypatch):
    """A per-row cache creates its slabs before the first forward (``init_cache``), so a
    right-padded prefill runs the chained path with its padding packed away; its logits at
    the real positions are HF's, bit for bit."""
    from lightspec_core import lean_decoder as lean_mod

    model = _kernel_model("llama")
    lean = exact_lean_target(model)
    calls = []
    chained = lean_mod.LeanDecoder._forward_chained

    def counting(self, input_ids, *args, **kwargs):
        calls.append(input_ids.shape)
        return chained(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(lean_mod.LeanDecoder, "_forward_chained", counting)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 500, (3, 11), generator=g)
    valid = torch.ones(3, 11, dtype=torch.bool)
    valid[1, 4:] = False
    valid[2, 9:] = False
    with torch.inference_mode():
        per_row = KVCache(lean, 3, CPU).forward(ids, valid).logits
        hf = KVCache(model, 3, CPU).forward(ids, valid).logits
    assert calls == [(3, 11)]
    assert torch.equal(per_row[valid], hf[valid])
