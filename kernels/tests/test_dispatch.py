import lightspec_kernels as lk
import pytest
import torch
from lightspec_kernels import chain, confidence, kv_compact, tree, tree_mask


def test_backend_selection(monkeypatch):
    x = torch.zeros(2, 3)
    monkeypatch.delenv("LIGHTSPEC_KERNELS", raising=False)
    assert lk.backend_for(x) == "torch"  # CPU tensors -> reference
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")
    assert lk.backend_for(x) == "torch"
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "triton")
    assert lk.backend_for(x) == "triton"  # allowed: conftest sets TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        lk.backend_for(x)
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "cuda")
    with pytest.raises(ValueError, match="LIGHTSPEC_KERNELS"):
        lk.backend_for(x)


def _boom(*args, **kwargs):
    raise AssertionError("the Triton path must not run for CPU tensors by default")


def test_public_functions_use_reference_on_cpu(monkeypatch):
    monkeypatch.delenv("LIGHTSPEC_KERNELS", raising=False)
    for mod, name in [
        (confidence, "confidence_stats_triton"),
        (chain, "chain_verify_triton"),
        (tree, "tree_verify_triton"),
        (kv_compact, "compact_kv_triton"),
        (tree_mask, "tree_attention_mask_triton"),
    ]:
        monkeypatch.setattr(mod, name, _boom)
    lk.confidence_stats(torch.randn(2, 10), top_k=2)
    lk.chain_verify(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 3]), torch.randn(2, 4, 10))
    lk.tree_verify(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[-1, 0, 0]]), torch.rand(1, 3, 10))
    lk.compact_kv(torch.randn(1, 2, 8, 4), torch.tensor([[2, 3]]), 0)
    lk.tree_attention_mask(torch.tensor([[-1, 0]]), 3)


def test_forced_triton_calls_kernel(monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "triton")
    called = []
    monkeypatch.setattr(confidence, "confidence_stats_triton", lambda *a, **k: called.append(1) or "k")
    assert lk.confidence_stats(torch.randn(2, 10)) == "k" and called


B, K, V = 2, 3, 11
TOK = torch.zeros(B, K, dtype=torch.long)
LENS = torch.tensor([1, 3])
TP = torch.rand(B, K + 1, V)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: lk.confidence_stats(torch.randn(2, 3, 4)), r"logits: got shape \(2, 3, 4\).*2 dimensions"),
        (lambda: lk.confidence_stats(torch.zeros(2, 4, dtype=torch.long)), r"logits: .*dtype torch.int64.*float32"),
        (lambda: lk.confidence_stats(torch.randn(2, 40), top_k=17), r"top_k: got 17"),
        (lambda: lk.confidence_stats(torch.randn(2, 4), top_k=5), r"top_k: got 5 .* V"),
        (lambda: lk.confidence_stats(torch.randn(2, 4), temperature=0.0), r"temperature"),
        (lambda: lk.chain_verify(TOK.int(), LENS, TP), r"draft_tokens: .*int32.*int64"),
        (lambda: lk.chain_verify(TOK, LENS[:1], TP), r"draft_lens: got shape \(1,\).*\(2\)"),
        (lambda: lk.chain_verify(TOK, LENS, TP[:, :K]), r"target_probs: got shape \(2, 3, 11\).*\(2, 4, \*\)"),
        (lambda: lk.chain_verify(TOK, LENS, TP, torch.rand(B, K, V + 1)), r"draft_probs: .*\(2, 3, 11\)"),
        (lambda: lk.chain_verify(TOK, LENS, TP, None, torch.rand(B, K)), r"exponentials: got None"),
        (
            lambda: lk.chain_verify(TOK, LENS, TP, None, torch.rand(B, K), torch.rand(B, 5)),
            r"exponentials: .*\(2, 11\)",
        ),
        (lambda: lk.tree_verify(TOK, torch.tensor([[-1, 0], [-1, 0]]), TP), r"parents: got shape \(2, 2\)"),
        (lambda: lk.tree_verify(TOK, torch.tensor([[-1, 0, 2], [-1, 0, 0]]), TP[:, :K]), r"parents\[0, 2\] = 2"),
        (lambda: lk.tree_verify(TOK, torch.tensor([[0, 0, 0], [-1, 0, 0]]), TP[:, :K]), r"root"),
        (lambda: lk.tree_verify(TOK, torch.tensor([[-1, -1, 1], [-1, 0, 0]]), TP[:, :K]), r"padding"),
        (lambda: lk.compact_kv(torch.randn(2, 4, 8), torch.tensor([[1]]), 0), r"cache: .*4 dimensions"),
        (lambda: lk.compact_kv(torch.randn(2, 1, 8, 4), torch.tensor([[1]]), 0), r"keep_idx: got shape \(1, 1\)"),
        (lambda: lk.compact_kv(torch.randn(1, 1, 8, 4), torch.tensor([[1]]), 0, seq_dim=3), r"seq_dim"),
        (
            lambda: lk.compact_kv(torch.randn(1, 1, 8, 4), torch.tensor([[1]]), torch.tensor([0], dtype=torch.int32)),
            r"dst_start: .*int32.*int64",
        ),
        (lambda: lk.compact_kv(torch.randn(1, 1, 8, 4), torch.tensor([[9]]), 0), r"< T=8"),
        (lambda: lk.tree_attention_mask(torch.tensor([[-1, 0]]), -1), r"prefix_len"),
        (lambda: lk.tree_attention_mask(torch.tensor([[-1, 0]]), 2, torch.int32), r"dtype: got torch.int32"),
        (lambda: lk.tree_attention_mask(torch.tensor([-1, 0]), 2), r"parents: got shape \(2,\)"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match, force_torch):
    with pytest.raises(ValueError, match=match):
        call()


def test_triton_path_checks_arguments_too(force_triton):
    with pytest.raises(ValueError, match="draft_lens"):
        lk.chain_verify_triton(TOK, LENS.int(), TP)
    with pytest.raises(ValueError, match="logits"):
        lk.confidence_stats_triton(torch.randn(3))
