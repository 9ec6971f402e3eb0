import lightspec_kernels as lk
import pytest
import torch
from kernel_helpers import exponentials, poison_empty, softmax_probs


def _inputs(B, K, V, mode, dtype, gen):
    tp = softmax_probs((B, K + 1, V), gen, dtype=dtype)
    dp = softmax_probs((B, K, V), gen, dtype=dtype) if mode == "sample_q" else None
    lens = torch.randint(0, K + 1, (B,), generator=gen)
    if K:
        src = tp[:, :K].float() if mode != "sample_q" else dp.float()
        drafts = torch.multinomial(src.reshape(-1, V), 1, generator=gen).view(B, K)
        if mode == "greedy":
            drafts = tp[:, :K].float().argmax(-1)
        noise = torch.randint(0, V, (B, K), generator=gen)
        drafts = torch.where(torch.rand((B, K), generator=gen) < 0.85, drafts, noise)
    else:
        drafts = torch.zeros((B, 0), dtype=torch.long)
    drafts[torch.arange(K)[None, :] >= lens[:, None]] = -1
    if mode == "greedy":
        return drafts, lens, tp, None, None, None
    u = torch.rand((B, K), generator=gen)
    return drafts, lens, tp, dp, u, exponentials(B, V, gen)


@pytest.mark.parametrize("mode", ["greedy", "sample", "sample_q"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,V", [(1, 4, 32001), (64, 3, 300), (13, 16, 4099), (5, 0, 50)])
def test_matches_reference(gen, monkeypatch, force_triton, mode, dtype, B, K, V):
    args = _inputs(B, K, V, mode, dtype, gen)
    acc_ref, emit_ref = lk.chain_verify_ref(*args)
    poison_empty(monkeypatch)
    acc, emit = lk.chain_verify(*args)
    assert torch.equal(acc, acc_ref)
    assert torch.equal(emit, emit_ref)
    # structural checks independent of the reference
    lens = args[1]
    assert (acc <= lens).all() and (acc >= 0).all()
    for b in range(B):
        a = int(acc[b])
        assert emit[b, :a].tolist() == args[0][b, :a].tolist()
        assert 0 <= int(emit[b, a]) < V
        assert (emit[b, a + 1 :] == -1).all()


def test_greedy_accepts_prefix_that_matches_argmax(force_triton):
    V = 6
    logits = torch.full((2, 4, V), -5.0)
    target = [[1, 2, 3, 4], [5, 0, 1, 2]]
    for b in range(2):
        for i, t in enumerate(target[b]):
            logits[b, i, t] = 5.0
    drafts = torch.tensor([[1, 2, 0], [5, 0, 1]])
    lens = torch.tensor([3, 2])
    acc, emit = lk.chain_verify(drafts, lens, logits)
    assert acc.tolist() == [2, 2]
    assert emit.tolist() == [[1, 2, 3, -1], [5, 0, 1, -1]]


def test_sampling_logits_logic_by_hand(force_triton):
    # u = 0 accepts any draft with p(x) > 0 (position 0); p(x) = 0 at position 1 -> rejected and the
    # recovered token comes from p with the draft removed (one-hot q)
    V = 4
    tp = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    drafts = torch.tensor([[3, 0]])
    lens = torch.tensor([2])
    u = torch.tensor([[0.0, 0.0]])
    e = torch.ones(1, V)
    acc, emit = lk.chain_verify(drafts, lens, tp, None, u, e)
    assert acc.tolist() == [1]
    assert emit.tolist() == [[3, 1, -1]]  # residual [0, .5, .5, 0], ties -> first index


@pytest.mark.parametrize("mode", ["greedy", "sample", "sample_q"])
@pytest.mark.parametrize("B,K,V,splits,block", [(3, 4, 32001, 4, 4096), (9, 8, 1000, 3, 128), (4, 3, 4099, 5, 512)])
def test_split_vocabulary_matches_reference(gen, monkeypatch, mode, B, K, V, splits, block):
    """The split path (several programs per vocabulary scan + merge kernel) used on GPUs."""
    args = _inputs(B, K, V, mode, torch.float32, gen)
    acc_ref, emit_ref = lk.chain_verify_ref(*args)
    poison_empty(monkeypatch)
    acc, emit = lk.chain_verify_triton(*args, num_splits=splits, block_v=block)
    assert torch.equal(acc, acc_ref) and torch.equal(emit, emit_ref)


@pytest.mark.parametrize("mode", ["greedy", "sample", "sample_q"])
def test_ignored_draft_slots_may_hold_any_value(gen, force_triton, mode):
    """Entries past draft_lens are ignored, even out-of-vocabulary pads (reference fix)."""
    B, K, V = 6, 4, 50
    drafts, lens, tp, dp, u, e = _inputs(B, K, V, mode, torch.float32, gen)
    lens[0] = 0
    lens[1] = 2
    junk = drafts.clone()
    junk[torch.arange(K)[None, :] >= lens[:, None]] = V + 1000
    drafts[torch.arange(K)[None, :] >= lens[:, None]] = -1
    for impl in (lk.chain_verify_ref, lk.chain_verify_triton):
        a1, e1 = impl(drafts, lens, tp, dp, u, e)
        a2, e2 = impl(junk, lens, tp, dp, u, e)
        assert torch.equal(a1, a2) and torch.equal(e1, e2)


@pytest.mark.parametrize("mode", ["greedy", "sample_q"])
def test_qwen_vocabulary(gen, monkeypatch, force_triton, mode):
    """V = 151936 (Qwen2), bf16, auto block size (one dtype/mode pair each: interpreter time)."""
    args = _inputs(2, 3, 151936, mode, torch.bfloat16, gen)
    acc_ref, emit_ref = lk.chain_verify_ref(*args)
    poison_empty(monkeypatch)
    acc, emit = lk.chain_verify(*args)
    assert torch.equal(acc, acc_ref) and torch.equal(emit, emit_ref)
