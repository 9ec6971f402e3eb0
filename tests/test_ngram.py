"""The n-gram drafter's match-length-aware draft cut: it learns, per match length and
draft position, how often the target accepts, and stops a draft where the chance that
all of it is accepted falls below ``min_accept``."""

from __future__ import annotations

import pytest
import torch

from lightspec_core.interfaces import RowHistory, StepContext
from lightspec_core.sampling import SamplingParams
from lightspec_core.stats import StepStats
from lightspec_core.strategies.ngram import NgramDrafter


def ctx(seq: list[int], k: int = 8, deterministic: bool = False) -> StepContext:
    return StepContext(step=0, sequences=[list(seq)], row_ids=[0], max_draft=torch.tensor([k]), max_draft_list=[k],
                       min_confidence=torch.zeros(1), sampling=SamplingParams(), generators=[], history=[RowHistory()],
                       target=None, tokenizer=None, device=torch.device("cpu"), vocab_size=100,
                       deterministic=deterministic)


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
