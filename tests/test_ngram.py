"""The n-gram drafter's match-length-aware draft cut: it learns, per match class (how
far back the context agrees with the earlier occurrence) and draft position, how often
the target accepts, and stops a draft where the chance that all of it is accepted falls
below ``min_accept``; a budget's looser limit for model-free drafters lets it go past k."""

from __future__ import annotations

import pytest
import torch
from lightspec_core.interfaces import RowHistory, StepContext
from lightspec_core.sampling import SamplingParams
from lightspec_core.stats import StepStats
from lightspec_core.strategies.ngram import NgramDrafter, match_class


def ctx(seq: list[int], k: int = 8, deterministic: bool = False, free: int | None = None) -> StepContext:
    return StepContext(step=0, sequences=[list(seq)], row_ids=[0], max_draft=torch.tensor([k]), max_draft_list=[k],
                       min_confidence=torch.zeros(1), sampling=SamplingParams(), generators=[], history=[RowHistory()],
                       target=None, tokenizer=None, device=torch.device("cpu"), vocab_size=100,
                       deterministic=deterministic, free_max_draft_list=None if free is None else [free])


def verified(drafted: int, accepted: int) -> StepStats:
    return StepStats(kind="step", step=0, row_ids=[0], step_time_s=0.01, device_time_s=None, peak_memory_bytes=0,
                     drafted=[drafted], accepted=[accepted], emitted=[accepted + 1], sources=["ngram"],
                     confidence=[None], entropy=[None], stage_s={}, target_forward_s=0.01, draft_forward_s=0.0,
                     overhead_s=0.0, verify_tokens=drafted + 1)


# a 4-gram (10 11 12 13) seen before, followed by 14..21; and a lone token 50 seen before, followed by 60..67
LONG = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 1, 10, 11, 12, 13]
SHORT = [50, 60, 61, 62, 63, 64, 65, 66, 67, 2, 3, 50]


def drafted(d: NgramDrafter, seq, **kw) -> list[int]:
    d.reset()
    p = d.lightspec_propose(ctx=ctx(seq, **kw))
    return [] if p is None else p.tokens[0, : int(p.lengths[0])].tolist()


def test_priors_give_long_matches_long_drafts_and_single_tokens_short_ones():
    d = NgramDrafter()
    assert drafted(d, LONG) == [14, 15, 16, 17]  # 0.7^4 = 0.24, 0.7^5 = 0.17 < 0.2
    assert drafted(d, SHORT) == [60]  # 0.4, then 0.16 < 0.2
    assert drafted(NgramDrafter(min_accept=0.0), SHORT) == [60, 61, 62, 63, 64, 65, 66, 67]
    assert drafted(NgramDrafter(min_ngram=2), SHORT) == []


def test_learns_that_single_token_matches_fail_and_stops_proposing_them():
    d = NgramDrafter()
    for _ in range(10):  # single-token matches: rejected at once
        d.reset()
        d.lightspec_propose(ctx=ctx(SHORT))
        d.lightspec_on_stats(event=verified(2, 0))
    assert d.acceptance(1, 0) < 0.2
    assert drafted(d, SHORT) == []
    for _ in range(10):  # 4-gram matches: all accepted
        d.reset()
        d.lightspec_propose(ctx=ctx(LONG))
        d.lightspec_on_stats(event=verified(8, 8))
    assert d.acceptance(4, 7) > 0.8
    assert len(drafted(d, LONG)) == 8
    # seeded requests ignore what other requests taught the counts
    assert drafted(d, SHORT, deterministic=True) == [60]


def test_learns_that_single_token_matches_pay_and_drafts_them_deeper():
    d = NgramDrafter()
    lengths = []
    for _ in range(30):  # each accepted draft teaches the next position: one token deeper at a time
        d.reset()
        d.lightspec_propose(ctx=ctx(SHORT))
        n = d.pending[0][1]
        lengths.append(n)
        d.lightspec_on_stats(event=verified(n, n))  # every drafted token accepted
    assert lengths[0] == 1 and lengths == sorted(lengths)
    assert len(drafted(d, SHORT)) == 8


def test_min_accept_is_checked():
    with pytest.raises(ValueError, match="min_accept=1.5 is invalid"):
        NgramDrafter(min_accept=1.5)


# the context's last 20 tokens (30..49) repeat an earlier stretch, which went on with 100..119
COPY = list(range(30, 50)) + list(range(100, 120)) + [7, 8] + list(range(30, 50))


def test_matches_are_classed_by_how_far_back_the_context_agrees():
    assert [match_class(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 40)] == [1, 2, 3, 4, 4, 8, 8, 16, 16]
    d = NgramDrafter()
    d.lightspec_propose(ctx(LONG))
    assert d.pending[0][0] == 4  # 10 11 12 13: nothing before the earlier occurrence
    d.reset()
    d.lightspec_propose(ctx(COPY))
    assert d.pending[0][0] == 16  # found as a 4-gram, agreeing 16+ tokens back
    d.reset()
    d.lightspec_propose(ctx(SHORT))
    assert d.pending[0][0] == 1


def test_each_class_learns_on_its_own():
    d = NgramDrafter()
    for _ in range(20):  # long copies: every drafted token accepted
        d.reset()
        d.lightspec_propose(ctx(COPY, k=16))
        n = d.pending[0][1]
        d.lightspec_on_stats(event=verified(n, n))
    assert d.acceptance(16, 0) > 0.9
    assert d.acceptance(4, 0) == pytest.approx(0.7)  # 4-gram matches taught nothing
    assert len(drafted(d, COPY, k=16)) == 16
    assert drafted(d, LONG, k=16) == [14, 15, 16, 17]


def test_a_looser_limit_for_free_drafters_lets_a_long_copy_go_past_k():
    d = NgramDrafter()
    for _ in range(20):
        d.reset()
        d.lightspec_propose(ctx(COPY, k=16))
        n = d.pending[0][1]
        d.lightspec_on_stats(event=verified(n, n))
    assert len(drafted(d, COPY, k=2)) == 2
    assert len(drafted(d, COPY, k=2, free=12)) == 12
    assert len(drafted(NgramDrafter(max_draft=6), COPY, k=2, free=12)) <= 6
    # the drafter's own cut still applies: a one-token match stays short
    assert drafted(NgramDrafter(), SHORT, k=2, free=12) == [60]
    # in a cascade the free limit counts the whole draft, the prefix included
    c = ctx(COPY, k=2, free=12)
    c.prefix, c.prefix_lengths = torch.tensor([[1, 2, 3]]), torch.tensor([3])
    d.reset()
    p = d.lightspec_propose(ctx=c)
    assert p is None or int(p.lengths[0]) <= 9
