"""Greedy verification (``verify.greedy_chain`` / ``greedy_tree``) through a ``TargetOutput``
against the kernel library's references: same accepted counts, emitted tokens and paths on
random and hand-made chains and trees (ragged lengths, empty drafts, tied logits), and the
lazy lm_head applied only as far as the walk goes."""

from __future__ import annotations

import torch
from lightspec_core.interfaces import DraftProposal
from lightspec_core.runner import TargetOutput
from lightspec_core.verify import greedy_chain, greedy_tree
from lightspec_kernels import chain_verify_ref, tree_verify_ref


def eager(logits: torch.Tensor) -> TargetOutput:
    return TargetOutput(logits.shape[0], logits.shape[1], None, logits, {})


def rows(tokens, lengths):
    return DraftProposal(tokens, lengths).node_rows()


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
            accepted, emitted = greedy_chain(rows(tokens, lengths), eager(logits))
            acc, em = chain_verify_ref(tokens, lengths, logits)
            assert accepted == acc.tolist()
            assert emitted == [e[: a + 1] for e, a in zip(em.tolist(), acc.tolist())]


def test_a_hand_made_chain():
    logits = torch.full((1, 4, 5), -1.0)
    for pos, tok in enumerate([2, 4, 1, 3]):
        logits[0, pos, tok] = 1.0
    assert greedy_chain([[2, 4, 0]], eager(logits)) == ([2], [[2, 4, 1]])
    assert greedy_chain([[2, 4, 1]], eager(logits)) == ([3], [[2, 4, 1, 3]])  # all accepted: the bonus token


def test_the_lazy_head_walk_equals_the_full_verify():
    """The lm_head applied only to the slots the walk reaches (3, then 4 at a time) gives
    the full verify's result; ties, all-accepted rows and batches."""
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
                reached.append(h.numel() // h.shape[-1])  # slots
                return h @ head_w.T

            lazy = TargetOutput(B, K + 1, hidden, None, {}, head, lambda h, head=head: head(h).argmax(-1))
            got = greedy_chain(rows(tokens, lengths), lazy)
            want = greedy_chain(rows(tokens, lengths), eager(logits))
            assert got == want
            # never past a row's own draft (its drafts and the bonus), always what the walk needs
            assert sum(reached) <= int(lengths.sum()) + B
            assert sum(reached) >= sum(want[0]) + B
            assert lazy.head_s > 0


def random_tree(gen, n: int, target_row: torch.Tensor, V: int) -> tuple[list[int], list[int]]:
    """n nodes in topological order; each child's token is often the target's argmax at its parent."""
    parents, tokens = [], []
    for j in range(n):
        p = int(torch.randint(-1, j, (1,), generator=gen)) if j else -1
        parents.append(p)
        hit = bool(torch.rand(1, generator=gen) < 0.6)
        tokens.append(int(target_row[p + 1]) if hit else int(torch.randint(0, V, (1,), generator=gen)))
    return tokens, parents


def test_greedy_tree_matches_the_kernel_reference():
    gen = torch.Generator().manual_seed(3)
    for B, N, V in [(1, 1, 5), (1, 7, 6), (3, 9, 4), (8, 12, 20)]:
        for _ in range(30):
            logits = torch.randn(B, N + 1, V, generator=gen)
            target = logits.argmax(-1)
            lengths = torch.randint(0, N + 1, (B,), generator=gen).tolist()
            nodes, parents = [], []
            for b, n in enumerate(lengths):
                t, p = random_tree(gen, n, target[b], V)
                nodes.append(t)
                parents.append(p)
            got = greedy_tree(nodes, parents, eager(logits))
            # the kernels' convention: node 0 is the root, node 1 + i draft node i
            ktok = torch.zeros(B, N + 1, dtype=torch.long)
            kpar = torch.full((B, N + 1), -1, dtype=torch.long)
            for b in range(B):
                ktok[b, 1 : 1 + len(nodes[b])] = torch.tensor(nodes[b], dtype=torch.long)
                kpar[b, 1 : 1 + len(nodes[b])] = torch.tensor([p + 1 for p in parents[b]], dtype=torch.long)
            ref = tree_verify_ref(ktok, kpar, logits)
            assert got.accepted == ref.path_len.tolist()
            for b in range(B):
                path = [i - 1 for i in ref.path[b].tolist()[: int(ref.path_len[b])]]
                assert got.path[b] == path
                assert got.emitted[b] == [nodes[b][i] for i in path] + [int(ref.bonus[b])]


def test_argmax_last_is_torch_argmax_with_ties_and_nan():
    from lightspec_core.sampling import argmax_last

    x = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("-inf"), -2.0, float("nan"), 5.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))
    y = torch.randn(3, 5, 8192, generator=torch.Generator().manual_seed(2))
    assert torch.equal(argmax_last(y[:, 1]), y[:, 1].argmax(dim=-1)) and argmax_last(y).dtype == torch.int64


def test_target_output_reads_only_the_slots_asked_for():
    """``logits_at`` / ``hidden_states_at`` address slots flat (b * Q + j); an output whose
    logits start at a later slot (a prefill's logits_to_keep) maps them."""
    logits = torch.randn(2, 4, 7)
    states = {3: torch.randn(2, 4, 5)}
    out = TargetOutput(2, 4, None, logits, states)
    assert torch.equal(out.logits_at([1, 6]), torch.stack([logits[0, 1], logits[1, 2]]))
    assert torch.equal(out.hidden_states_at(3, [7, 0]), torch.stack([states[3][1, 3], states[3][0, 0]]))
    kept = TargetOutput(2, 4, None, logits[:, 2:], states, first_slot=2)  # only slots 2, 3 have logits
    assert torch.equal(kept.logits_at([3, 6]), torch.stack([logits[0, 3], logits[1, 2]]))
    assert kept.argmax_at([2]) == [int(logits[0, 2].argmax())]
    # slots in any order, consecutive or not, give those slots' rows
    for flat in ([0, 1, 3, 2], [0, 1, 3, 2, 4], [2, 3, 4, 5], [5, 4]):
        assert torch.equal(out.logits_at(flat), logits.reshape(8, 7)[flat])
