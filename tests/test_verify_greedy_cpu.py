"""The CPU fast path of greedy chain verification (``verify.greedy_cpu``) against the
kernel library's reference: same accepted counts and emitted tokens on random and
hand-made chains (ragged lengths, empty drafts, tied logits)."""

from __future__ import annotations

import torch
from lightspec_core.verify import greedy_cpu
from lightspec_kernels import chain_verify_ref


def test_matches_the_reference_on_random_chains():
    gen = torch.Generator().manual_seed(0)
    for B, K, V in [(1, 0, 7), (1, 1, 5), (1, 6, 11), (4, 5, 3), (8, 16, 50)]:
        for _ in range(40):
            logits = torch.randn(B, K + 1, V, generator=gen)
            logits[:, :, 1] = logits[:, :, 0]  # ties: the first maximum wins in both
            target = logits.argmax(-1)
            tokens = torch.randint(0, V, (B, K), generator=gen)
            agree = torch.rand(B, K, generator=gen) < 0.7  # mostly correct drafts, so prefixes get accepted
            tokens = torch.where(agree, target[:, :K], tokens)
            lengths = torch.randint(0, K + 1, (B,), generator=gen)
            got = greedy_cpu(tokens, lengths, logits)
            acc, emitted = chain_verify_ref(tokens, lengths, logits)
            assert torch.equal(got.accepted, acc) and torch.equal(got.emitted, emitted)


def test_a_hand_made_chain():
    logits = torch.full((1, 4, 5), -1.0)
    for pos, tok in enumerate([2, 4, 1, 3]):
        logits[0, pos, tok] = 1.0
    got = greedy_cpu(torch.tensor([[2, 4, 0]]), torch.tensor([3]), logits)
    assert got.accepted.tolist() == [2] and got.emitted.tolist() == [[2, 4, 1, -1]]
    got = greedy_cpu(torch.tensor([[2, 4, 1]]), torch.tensor([3]), logits)  # all accepted: the bonus token
    assert got.accepted.tolist() == [3] and got.emitted.tolist() == [[2, 4, 1, 3]]


def test_the_lazy_head_walk_equals_the_full_verify():
    """``greedy_cpu_lazy``: the lm_head applied only to the positions the walk reaches (3,
    then 4 at a time) gives ``greedy_cpu``'s result; ties, all-accepted rows and batches."""
    from lightspec_core.verify import greedy_cpu_lazy

    gen = torch.Generator().manual_seed(1)
    for B, K, V in [(1, 0, 7), (1, 1, 5), (1, 6, 11), (4, 5, 3), (8, 16, 50), (2, 12, 9)]:
        for _ in range(30):
            head_w = torch.randn(V, 6, generator=gen)
            hidden = torch.randn(B, K + 1, 6, generator=gen)
            logits = hidden @ head_w.T
            target = logits.argmax(-1)
            tokens = torch.randint(0, V, (B, K), generator=gen)
            agree = torch.rand(B, K, generator=gen) < 0.85
            tokens = torch.where(agree, target[:, :K], tokens)
            lengths = torch.randint(0, K + 1, (B,), generator=gen)
            reached = []

            def head(h, reached=reached, head_w=head_w):
                reached.append(h.numel() // h.shape[-1])  # (row, position) slots
                return h @ head_w.T

            got = greedy_cpu_lazy(tokens, lengths, hidden, head)
            want = greedy_cpu(tokens, lengths, logits)
            assert torch.equal(got.accepted, want.accepted) and torch.equal(got.emitted, want.emitted)
            # never past a row's own draft (its drafts and the bonus), always what the walk needs
            assert sum(reached) <= int(lengths.sum()) + B
            assert sum(reached) >= int(want.accepted.sum()) + B


def test_argmax_last_is_torch_argmax_with_ties_and_nan():
    from lightspec_core.sampling import argmax_last

    x = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("-inf"), -2.0, float("nan"), 5.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))
    y = torch.randn(3, 5, 8192, generator=torch.Generator().manual_seed(2))
    assert torch.equal(argmax_last(y[:, 1]), y[:, 1].argmax(dim=-1)) and argmax_last(y).dtype == torch.int64
