"""The budget policies on synthetic step statistics: the dynamic policy's draft-length
choice, its cost learning (robust to timing spikes), its back-off and re-probing, the
batch-wide draft length, and the static policy.  One long file (over 1,000 lines) because its
synthetic-step helpers (``step``, ``plain``, ``calibrate``, ``ctx``...) are what the other
budget test modules import; the tests of one mechanism stay next to each other."""

from __future__ import annotations

from statistics import median

import pytest
import torch
from lightspec_core.budget import DynamicBudget, StaticBudget
from lightspec_core.interfaces import RowHistory, StepContext
from lightspec_core.sampling import SamplingParams
from lightspec_core.stats import StepStats

T1 = 0.010  # seconds of a plain target step in these synthetic runs


def ctx(histories: list[RowHistory], deterministic: bool = False) -> StepContext:
    B = len(histories)
    return StepContext(step=0, sequences=[[1, 2, 3]] * B, row_ids=list(range(B)), max_draft=torch.zeros(B, dtype=torch.long),
                       max_draft_list=[0] * B, min_confidence=torch.zeros(B), sampling=SamplingParams(), generators=[],
                       history=histories, target=None, tokenizer=None, device=torch.device("cpu"), vocab_size=10,
                       deterministic=deterministic)


def step(q: int, seconds: float, drafted=(0,), accepted=(0,), source: str = "draft_model", draft_s: float = 0.0) -> StepStats:
    B = len(drafted)
    return StepStats(kind="step", step=0, row_ids=list(range(B)), step_time_s=seconds + draft_s, device_time_s=None,
                     peak_memory_bytes=0, drafted=list(drafted), accepted=list(accepted), emitted=[a + 1 for a in accepted],
                     sources=[source if d else "" for d in drafted], confidence=[None] * B, entropy=[None] * B,
                     stage_s={"draft": draft_s}, target_forward_s=seconds, draft_forward_s=draft_s, overhead_s=0.0,
                     verify_tokens=q)


def plain(rows: int = 1, seconds: float = T1) -> StepStats:
    """A plain step of ``rows`` rows (it calibrates the policy for batches of that size)."""
    return step(1, seconds, drafted=(0,) * rows, accepted=(0,) * rows)


def calibrate(p: DynamicBudget, rows: int = 1) -> None:
    """Feed ``p`` the plain steps of ``rows`` rows that calibrate that batch size (one for a
    single row, ``BATCH_CALIBRATION`` for a batch) and count its verify cost as measured at
    its current beta: its next decision is then the cost model's, not the one-token probe of
    a batch size never verified (tested on its own)."""
    from lightspec_core.budget import BATCH_CALIBRATION

    for _ in range(1 if rows == 1 else BATCH_CALIBRATION):
        p.lightspec_on_stats(plain(rows))
    key = p.cost.key(rows)
    p.cost.verified_beta.setdefault(key, p.cost.fits[key][1])


def history(accepted: float, rejected: float) -> RowHistory:
    return RowHistory(accepted=accepted, rejected=rejected)


def slow_step(rows: int) -> StepStats:
    """A speculative step of ``rows`` rows that took 2.4 plain steps for 2 tokens per row."""
    ev = step(2, T1 * 1.1, drafted=(1,) * rows, accepted=(1,) * rows, draft_s=0.01 * T1)
    ev.step_time_s = 2.4 * T1
    return ev


def k_of(policy, histories) -> list[int]:
    return policy.lightspec_budget(ctx(histories)).max_draft.tolist()


def test_best_k_grows_with_acceptance_and_backs_off_to_zero():
    p = DynamicBudget(max_draft=8, beta=0.1, draft_cost=0.05)
    ks = [p.best_k(a) for a in (0.05, 0.3, 0.6, 0.8, 0.95)]
    assert ks[0] == 0  # drafting cannot pay at 5% acceptance
    assert ks == sorted(ks) and ks[-1] >= 6
    assert p.best_k(0.95, draft_cost=1.5) == 0  # a drafter as slow as the target never pays


def test_calibrates_with_a_plain_step_then_drafts_where_acceptance_is_high():
    p = DynamicBudget()
    good = [history(accepted=20, rejected=2)]
    assert k_of(p, good) == [0]  # no timing yet: one plain step to measure the target
    p.lightspec_on_stats(step(1, T1))
    assert p.cost.t1 == pytest.approx(T1)
    assert k_of(p, good)[0] >= 3
    assert k_of(p, [history(accepted=0, rejected=20)]) == [0]


def test_learns_the_verify_slope_and_the_draft_cost():
    p = DynamicBudget(beta=0.5, draft_cost=0.5)
    p.lightspec_on_stats(step(1, T1))
    p.lightspec_on_stats(step(5, T1 * 1.4, drafted=(4,), accepted=(4,), draft_s=T1))  # warm-up step: cost not used
    for _ in range(40):
        # verify of 5 tokens costs 1.4 plain steps (beta 0.1); 4 draft tokens cost 0.4 of a step
        p.lightspec_on_stats(step(5, T1 * 1.4, drafted=(4,), accepted=(4,), draft_s=0.4 * T1))
    assert p.cost.beta == pytest.approx(0.1, abs=0.01)
    assert p.cost.draft_cost["draft_model"] == pytest.approx(0.1, abs=0.01)
    assert p.cost.t1 == pytest.approx(T1, rel=0.05)


def test_a_draft_costs_a_fixed_part_plus_a_part_per_token():
    """A model drafter's first forward also catches its cache up (measured on the zoo
    draft: 0.13 of a target step per draft, plus 0.17 per token).  Charging all of a
    one-token draft per token would make every longer draft look too dear; the line
    through the draft lengths seen separates the two, and the policy drafts deeper."""
    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    p.lightspec_on_stats(step(1, T1))
    p.lightspec_on_stats(step(2, T1 * 1.1, drafted=(1,), accepted=(1,), draft_s=T1))  # warm-up
    for i in range(16):
        k = 1 + i % 3
        p.lightspec_on_stats(step(k + 1, T1 * (1 + 0.1 * k), drafted=(k,), accepted=(k,), draft_s=(0.13 + 0.17 * k) * T1))
    assert p.cost.draft_fixed["draft_model"] == pytest.approx(0.13, abs=0.01)
    assert p.cost.draft_cost["draft_model"] == pytest.approx(0.17, abs=0.01)
    row = [history(accepted=7, rejected=3)]  # acceptance 0.7
    per_token_only = DynamicBudget().best_k(row[0].acceptance(), 0.30, 0.1)  # a one-token draft's cost, all per token
    assert k_of(p, row)[0] > per_token_only >= 1


def test_a_cascade_prices_its_model_drafter_from_the_drafters_own_timing():
    """In a cascade at batch size > 1, some rows draft by n-gram lookup and others by the
    draft model in the same step.  The model drafter times its own forwards
    (``StepTimer.record``), so its cost is learned from those steps too; before, such
    mixed steps measured nothing and the draft model kept its structural estimate (0.16
    of a target step per token at batch 8, where it measured 0.26)."""
    def mixed(model_s):
        ev = step(2, T1 * 1.2, drafted=(1, 1, 0, 1), accepted=(1, 0, 0, 1), draft_s=model_s)
        ev.sources = ["ngram", "draft_model", "", "ngram+draft_model"]
        ev.draft_by_source = {"draft_model": (model_s, 1)}
        return ev

    p = DynamicBudget(guard=False)
    p.lightspec_on_stats(step(1, T1, drafted=(0, 0, 0, 0), accepted=(0, 0, 0, 0)))
    p.lightspec_on_stats(mixed(2.0 * T1))  # its first step fills its cache: not a typical cost
    for _ in range(16):
        p.lightspec_on_stats(mixed(0.26 * T1))
    assert p.cost.draft_cost["draft_model"] == pytest.approx(0.26, abs=0.01)
    assert "ngram" not in p.cost.draft_cost  # measured only on steps where it drafts alone
    # the modelled cost of such a step charges the model drafter at its own draft length
    assert p.cost.modelled_cost(mixed(0.26 * T1)) == pytest.approx(1 + p.cost.spec_overhead + 0.26 + p.cost.beta * 1, abs=0.01)

    # without the drafter's own timing a mixed step cannot be attributed and measures nothing
    q = DynamicBudget(guard=False)
    q.lightspec_on_stats(step(1, T1, drafted=(0, 0, 0, 0), accepted=(0, 0, 0, 0)))
    for _ in range(10):
        ev = mixed(0.26 * T1)
        ev.draft_by_source = {}
        q.lightspec_on_stats(ev)
    assert q.cost.draft_cost == {}


def test_the_first_speculative_step_of_a_generation_is_not_charged_as_overhead():
    """A generation's first speculative step also builds the drafters' state (an n-gram
    index over the prompts, a draft model's prefill); charged as per-step overhead, one such
    step (0.23 of a target step at batch 8) stopped a batch from speculating again."""
    def spec(overhead):
        ev = step(2, T1 * 1.1, drafted=(1, 1), accepted=(1, 1), draft_s=0.1 * T1)
        ev.overhead_s = overhead
        ev.draft_by_source = {"draft_model": (0.1 * T1, 1)}
        return ev

    p = DynamicBudget(guard=False)
    p.lightspec_on_stats(step(1, T1, drafted=(0, 0), accepted=(0, 0)))
    p.lightspec_on_stats(spec(0.5 * T1))
    assert p.cost.spec_overhead == 0.0
    p.lightspec_on_stats(spec(0.03 * T1))
    assert p.cost.spec_overhead == pytest.approx(0.03, abs=0.005)
    p.reset()  # a new generation: its first speculative step is skipped again
    p.lightspec_on_stats(spec(0.5 * T1))
    assert p.cost.spec_overhead == pytest.approx(0.03, abs=0.005)


def test_one_slow_step_does_not_switch_speculation_off():
    p = DynamicBudget()
    good = [history(accepted=20, rejected=4)]
    p.lightspec_on_stats(step(1, T1))
    for _ in range(10):
        p.lightspec_on_stats(step(4, T1 * 1.3, drafted=(3,), accepted=(3,), draft_s=0.3 * T1))
    before = k_of(p, good)[0]
    p.lightspec_on_stats(step(4, T1 * 6.0, drafted=(3,), accepted=(3,), draft_s=3 * T1))  # a 5x timing spike
    assert before >= 2 and k_of(p, good)[0] == before


def test_backs_off_then_probes_again():
    """A drafter measured expensive during a slow period is dropped; while unused its cost
    drifts back to the cheapest it was measured at, so the policy tries it again instead
    of never drafting again."""
    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    good = [history(accepted=10, rejected=5)]
    p.lightspec_on_stats(step(1, T1))
    for _ in range(12):  # normal period: a draft token costs 0.1 of a plain step
        p.lightspec_on_stats(step(4, T1 * 1.3, drafted=(3,), accepted=(2,), draft_s=0.3 * T1))
    assert k_of(p, good)[0] >= 1
    for _ in range(20):  # slow period: 2 plain steps per draft token
        p.lightspec_on_stats(step(4, T1 * 3.0, drafted=(3,), accepted=(1,), draft_s=6 * T1))
    assert k_of(p, good) == [0]
    plain_steps = 0
    while k_of(p, good) == [0]:
        p.lightspec_on_stats(step(1, T1))
        plain_steps += 1
        assert plain_steps <= 48, "the policy never probes again"
    # ...but not at once: the bad measurements still count for a while (34 steps here; up to
    # MAX_RECHECK more while the row waits between decisions)
    assert plain_steps >= 4


def test_a_drafter_too_expensive_for_its_acceptance_is_not_probed_again_and_again():
    """Layer skip with an exit layer near the top costs most of a target step per draft
    token: once measured, the policy stays at plain decoding; with ``explore_after`` it drafts
    one token now and then ("explore", ever more rarely while it keeps losing) to measure again."""
    p = DynamicBudget(beta=0.1, draft_cost=0.05, explore_after=64)
    never = DynamicBudget(beta=0.1, draft_cost=0.05)
    good = [history(accepted=10, rejected=5)]
    p.lightspec_on_stats(step(1, T1))
    for _ in range(12):
        p.lightspec_on_stats(step(4, T1 * 1.3, drafted=(3,), accepted=(1,), draft_s=2.4 * T1))  # 0.8 per token
    assert k_of(p, good) == [0]
    never.lightspec_on_stats(step(1, T1))
    for _ in range(12):
        never.lightspec_on_stats(step(4, T1 * 1.3, drafted=(3,), accepted=(1,), draft_s=2.4 * T1))
    for _ in range(300):
        never.lightspec_on_stats(step(1, T1))
        assert k_of(never, good) == [0]
    explored = []
    for i in range(3000):
        b = p.lightspec_budget(ctx(good))
        if b.reason == "explore":
            assert b.max_draft.tolist() == [1]
            explored.append(i)
            p.lightspec_on_stats(step(2, T1 * 1.3, drafted=(1,), accepted=(0,), draft_s=0.8 * T1))
        else:
            assert b.max_draft.tolist() == [0]
            p.lightspec_on_stats(step(1, T1))
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert 1 <= len(explored) <= 6 and gaps == sorted(gaps) and explored[0] >= 60  # rare, and rarer


def test_a_batch_shares_one_draft_length():
    """Every row waits for the widest verify: the batch gets the k that pays for the
    batch, not each row's own best k."""
    p = DynamicBudget(beta=0.3, draft_cost=0.05)
    calibrate(p, 1)
    one_good = [history(accepted=40, rejected=1)] + [history(accepted=0, rejected=40)] * 7
    alone = k_of(p, one_good[:1])[0]
    assert k_of(p, one_good) == [0] * 8  # a batch size never measured: one plain step calibrates it
    calibrate(p, 8)
    ks = k_of(p, one_good)
    assert len(set(ks)) == 1
    assert alone >= 3 and ks[0] < alone  # one confident row cannot make seven others pay for a wide verify
    fresh = DynamicBudget(beta=0.3, draft_cost=0.05)
    calibrate(fresh, 8)
    ks = k_of(fresh, [history(40, 1)] * 8)
    assert len(set(ks)) == 1 and ks[0] >= 3


def test_a_batch_that_chose_plain_decoding_decides_again_after_recheck_steps():
    """Deciding costs ~1% of a batch-8 step and its inputs move little per step: after a
    batch chose k = 0 the next RECHECK steps of that batch stay plain, then it decides
    again (and a batch of another size decides at once)."""
    from lightspec_core.budget import RECHECK

    p = DynamicBudget(beta=0.3, draft_cost=0.05)
    for rows in (8, 4):
        calibrate(p, rows)
    assert k_of(p, [history(0, 40)] * 8) == [0] * 8
    for _ in range(RECHECK):
        assert k_of(p, [history(40, 1)] * 8) == [0] * 8  # not re-decided yet
    assert k_of(p, [history(40, 1)] * 8)[0] >= 3
    assert k_of(p, [history(0, 40)] * 8) == [0] * 8
    assert k_of(p, [history(40, 1)] * 4)[0] >= 3  # another batch size: decided now


def test_best_k_shortcut_agrees_with_the_search():
    """best_k returns 0 early when no k can beat the margin; that must be exactly when the
    full search finds no k either."""
    import random

    rng = random.Random(0)
    p = DynamicBudget()
    for _ in range(2000):
        n = rng.choice([1, 2, 8])
        accs = [rng.random() for _ in range(n)]
        hits = [rng.random() for _ in range(n)]
        kw = dict(draft_cost=rng.random() * 0.5, beta=rng.random(), fixed=rng.random() * 0.3, hits=hits,
                  scale=1 + rng.random() * 0.5, margin=1 + rng.random() * 0.5)
        got = p.best_k(accs, **kw)
        # the search alone: a margin-free reference of the same rule
        slope = kw["beta"] + kw["draft_cost"]
        p_any = 1.0
        for h in hits:
            p_any *= 1.0 - h
        p_any = 1.0 - p_any
        best_k, best, gain, terms = 0, float(n), float(n), [1.0] * n
        for k in range(1, p.max_draft + 1):
            for i, a in enumerate(accs):
                terms[i] *= min(a, 0.995)
                gain += hits[i] * terms[i]
            rate = gain / (1.0 - p_any + p_any * kw["scale"] * (1.0 + kw["fixed"] + slope * k))
            if rate > best * kw["margin"]:
                best_k, best = k, rate
        assert got == best_k


def test_a_single_row_lets_model_free_drafters_go_past_k_but_a_batch_does_not():
    """k is the row's average; an n-gram lookup knows how long its match is and pays only
    verify width, so one row that speculates lifts the free drafters' limit to
    free_max_draft.  Not when it does not speculate, not in a batch, not when seeded."""
    p = DynamicBudget(free_max_draft=16)
    p.lightspec_on_stats(step(1, T1))
    good = [history(accepted=20, rejected=2)]
    b = p.lightspec_budget(ctx(good))
    assert 0 < int(b.max_draft[0]) < 16 and b.free_max_draft == [16]
    assert p.lightspec_budget(ctx([history(accepted=0, rejected=20)])).free_max_draft is None  # k = 0
    assert p.lightspec_budget(ctx(good * 4)).free_max_draft is None
    assert p.lightspec_budget(ctx(good, deterministic=True)).free_max_draft is None
    assert DynamicBudget(free_max_draft=0).lightspec_budget(ctx(good)).free_max_draft is None


def test_seeded_sampling_decides_from_acceptance_only():
    p = DynamicBudget()
    good = [history(accepted=20, rejected=2)]
    first = p.lightspec_budget(ctx(good, deterministic=True)).max_draft.tolist()
    p.lightspec_on_stats(step(1, T1))
    p.lightspec_on_stats(step(4, T1 * 9.0, drafted=(3,), accepted=(3,), draft_s=5 * T1))
    assert p.lightspec_budget(ctx(good, deterministic=True)).max_draft.tolist() == first and first[0] > 0


def test_seeded_sampling_uses_each_rows_own_record_and_the_drafters_structural_costs():
    """Timing-free and per row: a seeded row's draft length does not depend on the machine
    or on the other rows; a drafter that reads half the target per token is not used."""
    p = DynamicBudget()
    good, bad = history(accepted=20, rejected=2), history(accepted=0, rejected=20)

    def ks(rows, hints):
        c = ctx(rows, deterministic=True)
        c.draft_cost_hints = hints
        return p.lightspec_budget(c).max_draft.tolist()

    alone = ks([good], {"draft_model": 0.15})[0]
    assert alone >= 2
    assert ks([good, bad, bad], {"draft_model": 0.15}) == [alone, 0, 0]
    mid = history(accepted=6, rejected=4)  # acceptance 0.6
    assert ks([mid], {"layerskip": 0.55}) == [0] and ks([mid], {"draft_model": 0.15})[0] >= 1
    assert ks([good], {"ngram": 0.0})[0] >= alone


def test_per_source_limits_follow_each_sources_record():
    p = DynamicBudget()
    p.lightspec_on_stats(step(1, T1))
    for src in ("ngram", "draft_model"):
        p.lightspec_on_stats(step(3, T1 * 1.1, drafted=(2,), accepted=(2,), source=src, draft_s=0.01 * T1))
    for _ in range(10):
        p.lightspec_on_stats(step(3, T1 * 1.1, drafted=(2,), accepted=(0,), source="ngram", draft_s=0.01 * T1))
        p.lightspec_on_stats(step(3, T1 * 1.1, drafted=(2,), accepted=(2,), source="draft_model", draft_s=0.1 * T1))
    b = p.lightspec_budget(ctx([history(10, 2)]))
    assert b.by_source["ngram"][0] < b.by_source["draft_model"][0]


def test_rows_that_rarely_get_a_draft_make_a_batch_back_off_but_not_a_single_row():
    """n-gram lookup finds no match on most rows of some workloads.  In a batch the widest
    verify is paid whenever any row drafts, so rare drafts do not pay; a single row pays
    only when it does draft, so it keeps drafting."""
    p = DynamicBudget(beta=0.15, draft_cost=0.01)
    p.lightspec_on_stats(step(1, T1))
    calibrate(p, 8)
    good = history(accepted=20, rejected=4)
    assert k_of(p, [good] * 8)[0] >= 2  # before any evidence: rows are expected to get drafts
    for _ in range(30):  # offered drafts, one row in eight gets one
        p.lightspec_budget(ctx([good] * 8))
        p.lightspec_on_stats(step(3, T1 * 1.3, drafted=(2,) + (0,) * 7, accepted=(2,) + (0,) * 7, source="ngram",
                                  draft_s=0.01 * T1))
    assert p.acceptance.hit_rate(1) < 0.3 < 0.5 < p.acceptance.hit_rate(0)  # row 0 always got its draft
    assert k_of(p, [history(20, 4)] * 8) == [0] * 8
    p.reset()  # a new generation, one row: the pooled rate says drafts are rare, but misses cost nothing
    assert k_of(p, [good])[0] >= 2


def test_a_new_row_starts_from_the_acceptance_pooled_over_recent_rows():
    p = DynamicBudget()
    assert p.acceptance.pooled_acceptance("") == pytest.approx(0.6)  # no evidence: the fixed prior
    p.lightspec_on_stats(step(1, T1))
    for _ in range(30):  # drafts of 4, none accepted
        p.lightspec_on_stats(step(5, T1 * 1.3, drafted=(4,), accepted=(0,), draft_s=0.1 * T1))
    assert p.acceptance.pooled_acceptance("") < 0.2 and p.acceptance.pooled_acceptance("draft_model") < 0.2
    fresh = RowHistory()
    assert k_of(p, [fresh])[0] < DynamicBudget().best_k(fresh.acceptance(), 0.05)


def test_the_extra_overhead_of_speculative_steps_is_charged():
    """Speculative steps do more engine bookkeeping than plain ones; the policy learns the
    difference and counts it as a fixed cost of drafting."""
    def spec(overhead):
        ev = step(3, T1 * 1.2, drafted=(2,), accepted=(1,), draft_s=0.05 * T1)
        ev.overhead_s = overhead
        return ev

    p = DynamicBudget(guard=False)
    plain = step(1, T1)
    plain.overhead_s = 0.02 * T1
    p.lightspec_on_stats(plain)
    for _ in range(10):
        p.lightspec_on_stats(spec(0.52 * T1))
    assert p.cost.spec_overhead == pytest.approx(0.5, abs=0.01)
    row = [history(accepted=3, rejected=7)]
    assert k_of(p, row) == [0]  # acceptance ~0.35 cannot pay for half a step of bookkeeping
    assert DynamicBudget().best_k(row[0].acceptance(), p.cost.draft_cost["draft_model"], p.cost.beta) >= 1


def test_the_guard_remembers_losses_per_kind_of_batch_across_generations():
    """A generation of several rows where speculation lost makes the next one of the same
    kind start with a 16-step hold (then probe); one row, or a kind that was winning,
    starts drafting at once."""
    p = DynamicBudget(beta=0.1, draft_cost=0.01)
    batch = [history(accepted=30, rejected=3)] * 8
    k_of(p, batch)  # the generation's first step: calibration
    calibrate(p, 8)
    for _ in range(12):
        assert k_of(p, batch)[0] >= 1
        p.lightspec_on_stats(slow_step(8))
    assert p.guard.record[(True, True)] > 1.0
    p.reset()  # next generation, same kind: held for 16 steps, then probing
    for _ in range(16):
        assert k_of(p, batch)[0] == 0
        p.lightspec_on_stats(plain(8))
    assert k_of(p, batch)[0] >= 1
    p.reset()  # one row: no record of losses there
    calibrate(p, 1)
    assert k_of(p, [history(accepted=30, rejected=3)])[0] >= 1
    off = DynamicBudget(beta=0.1, draft_cost=0.01, guard=False)
    off.guard.record[(True, True)] = 2.0
    calibrate(off, 8)
    assert k_of(off, batch)[0] >= 1


def test_the_throughput_guard_holds_plain_decoding_after_speculation_measured_slower():
    """The cost model says drafting pays, but the measured steps are slower than plain
    decoding would have been for the same tokens: the guard switches to plain decoding for
    16 steps, then probes again (and holds twice as long after a second loss)."""
    def slow():  # 2 tokens per step; the forward and the draft look cheap, the step takes 2.4 plain steps
        ev = step(2, T1 * 1.1, drafted=(1,), accepted=(1,), draft_s=0.01 * T1)
        ev.step_time_s = 2.4 * T1
        return ev

    p = DynamicBudget(beta=0.1, draft_cost=0.01)
    good = [history(accepted=30, rejected=3)]
    p.lightspec_on_stats(step(1, T1))
    for _ in range(11):
        assert k_of(p, good)[0] >= 1
        p.lightspec_on_stats(slow())
    assert p.guard.hold == 0
    p.lightspec_on_stats(slow())  # the window's 12th speculative step completes the check
    assert p.guard.hold == 16
    for _ in range(16):
        assert k_of(p, good) == [0]
        p.lightspec_on_stats(step(1, T1))
    assert k_of(p, good)[0] >= 1  # probing again
    for _ in range(12):
        p.lightspec_on_stats(slow())
    assert p.guard.hold == 32
    p.reset()  # each generation starts with a clean guard...
    assert p.guard.hold == 0 and p.guard.backoff == 16
    assert k_of(p, good) == [0] and p.guard.hold == 15  # ...held 16 steps, as this kind of batch was losing
    p.guard.record.clear()
    p.reset()
    assert k_of(p, good)[0] >= 1
    off = DynamicBudget(beta=0.1, draft_cost=0.01, guard=False)
    off.lightspec_on_stats(step(1, T1))
    for _ in range(24):
        off.lightspec_on_stats(slow())
    assert off.guard.hold == 0 and k_of(off, good)[0] >= 1


def test_speculative_steps_slower_than_modelled_raise_the_cost_scale_of_that_kind_of_batch():
    """The guard's windows compare the measured time of speculative steps with the cost
    model's: steps 20% slower than modelled scale the cost of drafting by about that much,
    for that kind of batch only, so a gain the model overstated is no longer drafted for;
    while nothing drafts, the scale drifts back to 1."""
    p = DynamicBudget(beta=0.1, draft_cost=0.01)
    batch = [history(accepted=30, rejected=3)] * 8
    k_of(p, batch)
    calibrate(p, 8)
    modelled = None
    for _ in range(3 * 12):
        k_of(p, batch)
        ev = step(2, T1 * 1.1, drafted=(1,) * 8, accepted=(1,) * 8, draft_s=0.01 * T1)
        modelled = p.cost.modelled_cost(ev) * T1 * 1.03  # 1.03: the plain steps' step/forward ratio
        ev.step_time_s = 1.2 * modelled
        p.lightspec_on_stats(ev)
    scale = p.guard.cost_scale[(True, True)]
    assert 1.1 < scale <= 1.25
    assert (False, True) not in p.guard.cost_scale  # one row: not measured
    accs = [0.45] * 8  # a gain the unscaled model takes (at the batch margin), the scaled one not
    assert p.best_k(accs, 0.01, 0.1) >= 1 and p.best_k(accs, 0.01, 0.1, scale=scale) == 0
    for _ in range(60):  # plain steps: the scale decays back
        p.lightspec_on_stats(plain(8))
    assert p.guard.cost_scale[(True, True)] < 1.01


def rows_step(rows: int, seconds: float, drafted: int = 0, accepted: int = 0) -> StepStats:
    """A step of ``rows`` rows taking ``seconds`` in all (its forward ``seconds`` too)."""
    ev = step(drafted + 1, seconds, drafted=(drafted,) * rows, accepted=(accepted,) * rows)
    ev.step_time_s = seconds
    return ev


def test_the_guard_compares_with_measured_plain_steps_of_as_many_rows():
    """The guard's "what plain decoding would have cost" is the mean of recent plain
    steps with the same number of rows once 3 exist, not the cost model's extrapolated
    ``t1`` (which at batch 8 measured 14 ms against plain steps of 20 ms)."""
    p = DynamicBudget()
    batch = [history(accepted=30, rejected=3)] * 4
    k_of(p, batch)
    p.lightspec_on_stats(rows_step(4, T1))
    assert p.guard.plain_reference(4) == pytest.approx(T1 * median_ratio(p))  # one sample: the model's
    for _ in range(3):
        p.lightspec_on_stats(rows_step(4, 2 * T1))
    assert p.guard.plain_reference(4) == pytest.approx((T1 + 3 * 2 * T1) / 4)
    assert p.guard.plain_reference(3) == pytest.approx(p.cost.t1 * median_ratio(p))  # none with 3 rows yet
    # speculative steps of 4 rows: 1.8 tokens per row for 3 T1.  Against the model's plain
    # step (~T1 .. 2 T1 as it is refitted) that can look like a loss or a win; against
    # the measured 1.75 T1 (3.15 T1 of plain decoding per step) it is a win
    p.cost.t1 = T1  # pin the model's view low, as the extrapolated intercept was
    for _ in range(12):
        p.lightspec_on_stats(rows_step(4, 3 * T1, drafted=1, accepted=1))
        p.cost.t1 = T1
    assert p.guard.hold == 0 and p.guard.record[(True, True)] < 1.0


def median_ratio(p):
    from statistics import median

    return median(p.guard.plain_ratio)


def test_a_batch_that_lost_over_a_whole_generation_needs_a_larger_modelled_gain():
    """Rows that speculate finish at different steps; the last ones run in small batches
    that cost nearly a full step each.  No per-step check sees that, so the generation is
    judged as a whole when the next one starts (``reset``): its steps' time against plain
    decoding of the same tokens at the full batch's plain step.  A loss raises the
    margin this kind of batch needs by the measured ratio; a win lowers it, not below
    ``batch_margin``; a generation without speculation lets it drift back."""
    p = DynamicBudget(batch_margin=1.15)
    kind = (True, True)
    batch = [history(accepted=30, rejected=3)] * 4

    def generation(spec_time, tail_time):
        p.reset()
        k_of(p, batch)
        for _ in range(3):
            p.lightspec_on_stats(rows_step(4, T1))  # plain steps: 4 tokens for T1
        for _ in range(10):  # speculative steps: 8 tokens each
            p.lightspec_on_stats(rows_step(4, spec_time, drafted=1, accepted=1))
        for _ in range(10):  # the tail: one row left, one token per step
            p.lightspec_on_stats(rows_step(1, tail_time))

    generation(1.5 * T1, 0.9 * T1)  # 3 + 15 + 9 = 27 T1 for 12 + 80 + 10 = 102 tokens (25.5 T1 plain)
    generation(1.5 * T1, 0.9 * T1)  # judged now
    assert p.guard.margin[kind] == pytest.approx(1.15 * 27 / 25.5, rel=1e-3)
    lost = p.guard.margin[kind]
    generation(1.2 * T1, 0.3 * T1)  # 3 + 12 + 3 = 18 T1 for 25.5 T1 of plain decoding: a win
    p.reset()
    assert p.guard.margin[kind] == pytest.approx(max(1.15, lost * 18 / 25.5))
    assert p.guard.margin[kind] == 1.15  # never below batch_margin
    # the learned margin is what a batch must clear
    p.guard.margin[kind] = 2.0
    p.reset()
    k_of(p, batch)
    p.lightspec_on_stats(rows_step(4, T1))
    # a generation that never drafts lets it drift back by a quarter
    p.reset()
    assert p.guard.margin[kind] == pytest.approx(1.15 + 0.75 * (2.0 - 1.15))
    # seeded requests and single rows leave it alone
    before = dict(p.guard.margin)
    q = ctx(batch, deterministic=True)
    p.lightspec_budget(q)
    p.lightspec_on_stats(rows_step(4, 5 * T1, drafted=1, accepted=0))
    p.reset()
    assert p.guard.margin == before
    k_of(p, [history(accepted=30, rejected=3)])
    p.lightspec_on_stats(rows_step(1, 5 * T1, drafted=1, accepted=0))
    p.reset()
    assert p.guard.margin == before


def test_the_learned_batch_margin_decides_whether_a_batch_drafts():
    p = DynamicBudget(beta=0.1, draft_cost=0.05, guard=False)
    batch = [history(accepted=6, rejected=4)] * 8  # acceptance ~0.58
    for _ in range(3):  # calibration (BATCH_CALIBRATION plain steps)
        k_of(p, batch)
        p.lightspec_on_stats(rows_step(8, T1))
    assert k_of(p, batch)[0] >= 1
    p.guard.margin[(True, True)] = 1.6
    assert k_of(p, batch)[0] == 0
    calibrate(p, 1)
    assert k_of(p, [history(accepted=6, rejected=4)])[0] >= 1  # one row: its own margin


def test_a_drafter_starts_from_its_structural_cost_estimate():
    """Before a drafter is measured a batch prices it by its ``draft_cost_hints()``: an
    early exit that does half the target's work per token is not drafted on a prior
    acceptance, free n-gram lookup is.  A single row tries it (the flat prior)."""
    def first_k(hints, rows):
        p = DynamicBudget()
        calibrate(p, rows)
        c = ctx([history(0, 0)] * rows)
        c.draft_cost_hints = hints
        return p.lightspec_budget(c).max_draft.tolist()[0], p

    assert first_k({"layerskip": 0.54}, 8)[0] == 0
    assert first_k({"ngram": 0.0}, 8)[0] >= 1
    k, p = first_k({"layerskip": 0.54}, 1)
    assert k >= 1 and p.cost.prior_cost("layerskip") == 0.05
    _, p = first_k({"layerskip": 0.54}, 8)
    assert p.cost.prior_cost("layerskip") == 0.54 and p.cost.prior_cost("other") == 0.05


def test_a_batch_needs_a_larger_modelled_gain_than_one_row():
    """``batch_margin``: with several rows a draft length must beat plain decoding by that
    factor in the model (rows that finish early are a cost it does not see); one row needs 2%."""
    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    a = 0.3  # k = 1 models a ~14% gain: 1.3 tokens for 1.15 steps
    assert p.best_k(a) == 1 and p.best_k([a] * 8) == 0
    assert DynamicBudget(beta=0.1, draft_cost=0.05, batch_margin=1.0).best_k([a] * 8) == 1


def test_the_guard_lets_speculation_that_pays_run():
    p = DynamicBudget()
    good = [history(accepted=30, rejected=3)]
    p.lightspec_on_stats(step(1, T1))
    for _ in range(60):
        p.lightspec_on_stats(step(5, T1 * 1.3, drafted=(4,), accepted=(4,), draft_s=0.2 * T1))
    assert p.guard.hold == 0 and k_of(p, good)[0] >= 3


@pytest.mark.parametrize("kw, bad", [({"max_draft": 0}, "max_draft=0"), ({"beta": -1}, "beta=-1"),
                                     ({"draft_cost": "x"}, "draft_cost='x'"), ({"min_confidence": 1.5}, "min_confidence=1.5"),
                                     ({"decay": 1}, "decay=1"), ({"window": 0}, "window=0"), ({"guard": "no"}, "guard='no'"),
                                     ({"batch_margin": 0.9}, "batch_margin=0.9"), ({"free_max_draft": -1}, "free_max_draft=-1")])
def test_dynamic_rejects_bad_options(kw, bad):
    with pytest.raises(ValueError, match=bad):
        DynamicBudget(**kw)


def test_static_budget():
    b = StaticBudget(k=3).lightspec_budget(ctx([history(0, 9)] * 2))
    assert b.max_draft.tolist() == [3, 3] and b.min_confidence.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="k=-1 is invalid"):
        StaticBudget(k=-1)


def test_a_batch_carries_its_hold_and_back_off_into_the_next_generation():
    """Where speculation keeps losing on a kind of batch, the hold doubles from generation
    to generation (it is not reset to 16 by each new batch), so probes get rarer."""
    p = DynamicBudget(beta=0.1, draft_cost=0.01)
    batch = [history(accepted=30, rejected=3)] * 8
    k_of(p, batch)
    calibrate(p, 8)
    holds = []
    for _ in range(3):  # generations: plain while held, then a losing probe window
        held = 0
        while k_of(p, batch)[0] == 0:
            held += 1
            p.lightspec_on_stats(plain(8))
        holds.append(held)
        p.lightspec_on_stats(slow_step(8))
        for _ in range(11):
            k_of(p, batch)
            p.lightspec_on_stats(slow_step(8))
        p.reset()
    assert holds == [0, 16, 32]
    assert p.guard.carried[(True, True)] == (64, 128)


def test_a_batch_drifts_back_to_the_verify_cost_it_measured_one_row_to_the_prior():
    """While only plain steps are left in the window, beta drifts: a single row back to its
    prior (probing again after a slow period), a batch back to the beta it last fitted (at
    batch 8 a verified token's cost is structural; drifting to the batch-1 prior had it
    probe at a loss in every generation)."""
    for rows, want in ((8, 0.7), (1, 0.12)):
        p = DynamicBudget(beta=0.12)
        k_of(p, [history(0, 0)] * rows)  # the generation's kind: several rows or one
        for _ in range(6):
            p.lightspec_on_stats(step(1, T1, drafted=(0,) * rows, accepted=(0,) * rows))
            p.lightspec_on_stats(step(3, T1 * 2.4, drafted=(2,) * rows, accepted=(1,) * rows, source="ngram"))
        assert p.cost.beta == pytest.approx(0.7, rel=0.05)
        for _ in range(80):
            p.lightspec_on_stats(step(1, T1, drafted=(0,) * rows, accepted=(0,) * rows))
        assert p.cost.beta == pytest.approx(want, rel=0.05)


def test_a_batch_charges_a_model_drafter_its_start_up_and_its_catch_up_when_it_resumes():
    """A model drafter that did not draft last step must first catch its cache up (its
    ``setup_s``): the generation's first draft reads the whole prompt (the start-up), a
    resumed one the tokens decoded since.  A batch learns both and charges the one ahead,
    spread over SETUP_HORIZON steps, while one that drafted last step, and a drafter without
    catch-up, pay nothing."""
    from lightspec_core.budget import SETUP_HORIZON

    p = DynamicBudget()
    k_of(p, [history(0, 0)] * 8)
    p.lightspec_on_stats(step(1, T1, drafted=(0,) * 8, accepted=(0,) * 8))
    ev = step(2, T1 * 1.5, drafted=(1,) * 8, accepted=(1,) * 8, draft_s=3 * T1)
    ev.draft_setup_s = 2 * T1
    ev.draft_by_source = {"draft_model": (1 * T1, 1)}
    p.lightspec_on_stats(ev)
    assert p.cost.start_cost["draft_model"] == pytest.approx(2.0) and "draft_model" not in p.cost.setup_cost
    assert p.cost.catch_up("draft_model") == 0.0  # it drafted last step: nothing to catch up
    p.lightspec_on_stats(step(1, T1, drafted=(0,) * 8, accepted=(0,) * 8))
    ev.draft_setup_s = 0.5 * T1  # resumed: it has drafted in this generation
    p.lightspec_on_stats(ev)
    assert p.cost.setup_cost["draft_model"] == pytest.approx(0.5) and p.cost.start_cost["draft_model"] == pytest.approx(2.0)
    p.lightspec_on_stats(step(1, T1, drafted=(0,) * 8, accepted=(0,) * 8))
    assert p.cost.catch_up("draft_model") == pytest.approx(0.5 / SETUP_HORIZON)
    assert p.cost.catch_up("ngram") == 0.0
    p.reset()  # the next generation starts with the start-up ahead
    assert p.cost.catch_up("draft_model") == pytest.approx(2.0 / SETUP_HORIZON)


def timed_step(k: int, draft_s: float, setup_s: float = 0.0, verify_s: float | None = None) -> StepStats:
    """A single row's speculative step of ``k`` drafts by the draft model, which timed
    itself (``draft_s`` in all, ``setup_s`` of it catching up)."""
    ev = step(k + 1, T1 * (1 + 0.1 * k) if verify_s is None else verify_s, drafted=(k,), accepted=(k,),
              draft_s=draft_s)
    ev.draft_setup_s = setup_s
    ev.draft_by_source = {"draft_model": (draft_s - setup_s, k)}
    return ev


def test_a_single_row_charges_its_start_up_and_its_catch_up_when_it_resumes():
    """One row pays its drafter's catch-ups too: on the zoo models the generation's first
    draft (the drafter reads the prompt) cost about two plain steps, more than a 64-token
    generation's later drafts gained, so a row that does not expect to gain that much does
    not start drafting."""
    from lightspec_core.budget import SETUP_HORIZON

    p = DynamicBudget()
    p.lightspec_on_stats(plain())
    p.lightspec_on_stats(timed_step(1, 9 * T1, setup_s=8 * T1))  # the first draft reads the prompt
    assert p.cost.start_cost["draft_model"] == pytest.approx(8.0) and "draft_model" not in p.cost.setup_cost
    p.lightspec_on_stats(plain())
    p.lightspec_on_stats(timed_step(1, 1.2 * T1, setup_s=T1))  # resumed after plain steps
    assert p.cost.setup_cost["draft_model"] == pytest.approx(1.0)
    assert p.cost.catch_up("draft_model") == 0.0  # it drafted last step
    p.lightspec_on_stats(plain())
    assert p.cost.catch_up("draft_model") == pytest.approx(1.0 / SETUP_HORIZON)
    p.reset()
    assert p.cost.catch_up("draft_model") == pytest.approx(8.0 / SETUP_HORIZON)
    row = [history(accepted=5, rejected=5)]
    p.lightspec_on_stats(plain())
    assert k_of(p, row) == [0]  # a start-up of 8 plain steps is not worth it at acceptance 0.5
    p.cost.start_cost["draft_model"] = 0.0
    p.recheck = 0  # decide now, not after the recheck steps that follow a k = 0 decision
    assert k_of(p, row)[0] >= 1  # without it, drafting pays


def test_lengths_measured_often_enough_are_priced_at_their_median_not_the_line():
    """Verify and draft costs are concave in length: on the zoo models a one-token draft and
    its two-slot verify cost more than the line through all lengths says.  A length with
    ``MEASURED_AT`` samples in its window is priced at its median; other lengths keep the
    line, and so does a drafter's guard (``modelled_cost``)."""
    from lightspec_core.budget.costs import MEASURED_AT

    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    p.lightspec_on_stats(plain())
    p.lightspec_on_stats(timed_step(4, 0.4 * T1))  # warm-up
    for _ in range(4):  # k = 4 on the line: verify 1.4, draft 0.1 per token
        p.lightspec_on_stats(timed_step(4, 0.4 * T1, verify_s=1.4 * T1))
    for _ in range(MEASURED_AT - 1):  # k = 1 measured twice: verify 1.3, draft 0.35
        p.lightspec_on_stats(timed_step(1, 0.35 * T1, verify_s=1.3 * T1))
    p.cost.use_fit(p.cost.key(1))
    line = p.cost.extra_costs("draft_model", 1, 4, p.cost.draft_cost["draft_model"], p.cost.draft_fixed["draft_model"])
    assert line[0] == pytest.approx(p.cost.beta + p.cost.draft_fixed["draft_model"] + p.cost.draft_cost["draft_model"])
    assert line[0] < 0.5
    p.lightspec_on_stats(timed_step(1, 0.35 * T1, verify_s=1.3 * T1))  # the MEASURED_AT-th sample
    p.cost.use_fit(p.cost.key(1))
    d, f = p.cost.draft_cost["draft_model"], p.cost.draft_fixed["draft_model"]
    extra = p.cost.extra_costs("draft_model", 1, 4, d, f)
    assert extra[0] == pytest.approx(0.3 + 0.35)  # both medians at k = 1
    assert extra[3] == pytest.approx(0.4 + 0.4)  # k = 4: measured too
    assert extra[1] == pytest.approx(2 * p.cost.beta + f + 2 * d)  # k = 2: never measured, the line
    assert p.cost.modelled_cost(timed_step(1, 0.35 * T1)) == pytest.approx(1 + p.cost.spec_overhead + 0.65)
    # a row whose acceptance pays a one-token draft on a line (beta 0.1, 0.15 per token), but
    # not at the cost measured above (longer drafts priced out)
    acc = [0.42]
    assert p.best_k(acc, 0.15, 0.1) == 1
    assert p.best_k(acc, 0.15, 0.1, extra=extra[:1] + [9.0] * 7) == 0


def test_verify_costs_are_fitted_per_number_of_rows_through_the_plain_forward():
    """A forward over 8 rows costs several times one over a single row: each row count has
    its own window, so a batch's fit is not pulled by single-row verifies (a batch's last
    steps, earlier requests).  The line goes through the measured plain forward (the cost
    a draft has to beat), not a free intercept: verify costs are concave in width, and a
    free line through widths 3-6 put t1 above the plain step and beta far below its cost."""
    p = DynamicBudget(beta=0.12)
    for _ in range(20):  # single rows: plain 10 ms, verifies of width 5 cost 14 ms (beta 0.1)
        p.lightspec_on_stats(rows_step(1, T1))
        p.lightspec_on_stats(rows_step(1, 1.4 * T1, drafted=4, accepted=4))
    assert p.cost.t1 == pytest.approx(T1) and p.cost.beta == pytest.approx(0.1)
    assert k_of(p, [history(30, 3)] * 8) == [0] * 8  # 8 rows never measured: calibrate first
    t8 = 3 * T1
    for _ in range(3):
        p.lightspec_on_stats(rows_step(8, t8))
    # concave costs at 8 rows: width 2 costs 1.55 plain steps, width 4 2.2, width 6 2.8
    for q, c in ((2, 1.55), (4, 2.2), (6, 2.8)):
        p.lightspec_on_stats(rows_step(8, c * t8, drafted=q - 1, accepted=q - 1))
    assert p.cost.t1 == pytest.approx(t8)
    want = (1 * 0.55 + 3 * 1.2 + 5 * 1.8) / (1 + 9 + 25)  # least squares through (0, 1)
    assert p.cost.beta == pytest.approx(want)
    free = 2.8 - (2.8 - 1.55) / 4 * 5  # the free line's intercept, in plain steps: above 1
    assert free > 1.2 and p.cost.beta > 0.35
    assert p.cost.verified_beta[(8, True)] == pytest.approx(want)
    p.lightspec_on_stats(rows_step(1, T1))  # back to one row: its own window and fit
    assert p.cost.t1 == pytest.approx(T1) and p.cost.beta == pytest.approx(0.1)
    k_of(p, [history(30, 3)] * 8)  # a decision for 8 rows uses the 8-row fit, whatever ran last
    assert p.cost.t1 == pytest.approx(t8) and p.cost.beta == pytest.approx(want)


def test_a_batch_size_never_verified_borrows_the_nearest_beta_and_probes_one_token():
    """A generation's first decision uses the fit of its own batch size, not the fit of the
    step that ran last: after one-row steps with a cheap verify (beta 0), a batch of 8
    calibrates with one plain step, then borrows the prior (no batch verified yet) and
    drafts a single token, which measures its verify.  A batch size seen later borrows
    the nearest one measured."""
    p = DynamicBudget(beta=0.12, draft_cost=0.0)
    for _ in range(20):  # one row: the verify is free
        p.lightspec_on_stats(rows_step(1, T1))
        p.lightspec_on_stats(rows_step(1, T1, drafted=4, accepted=4))
    assert p.cost.beta == pytest.approx(0.0)
    assert k_of(p, [history(40, 1)])[0] >= 4
    p.reset()
    good = [history(40, 1)] * 8
    from lightspec_core.budget import BATCH_CALIBRATION

    for _ in range(BATCH_CALIBRATION):  # calibration: the median of a few plain steps
        assert k_of(p, good) == [0] * 8
        p.lightspec_on_stats(rows_step(8, 3 * T1))
    assert k_of(p, good) == [1] * 8  # the probe: one token
    assert p.cost.beta == pytest.approx(0.12)  # the prior, not the one row's 0
    p.lightspec_on_stats(rows_step(8, 3 * T1 * 1.5, drafted=1, accepted=1))  # a verified token costs 0.5
    assert p.cost.verified_beta[(8, True)] == pytest.approx(0.5)
    assert k_of(p, good)[0] >= 2  # measured now: 40/41 acceptance pays at 0.5 a token
    for _ in range(BATCH_CALIBRATION):  # 6 rows: calibrated, then the 8 rows' beta
        p.lightspec_on_stats(rows_step(6, 2.5 * T1))
    k_of(p, [history(40, 1)] * 6)
    assert p.cost.t1 == pytest.approx(2.5 * T1) and p.cost.beta == pytest.approx(0.5)
    assert p.cost.borrowed_beta((7, True)) == pytest.approx(0.5) and p.cost.borrowed_beta((1, True)) == pytest.approx(0.12)
    p.lightspec_on_stats(rows_step(8, 3 * T1 * 1.9, drafted=1, accepted=1))
    p.lightspec_on_stats(rows_step(8, 3 * T1 * 1.9, drafted=1, accepted=1))  # now 0.9 a token (the median)
    assert k_of(p, good) == [0] * 8  # no draft length pays for the batch's margin then


def test_a_batch_that_keeps_choosing_plain_decoding_decides_ever_less_often():
    """Each further k = 0 doubles the interval before the next decision (RECHECK, 2 RECHECK,
    ... up to MAX_RECHECK); a decision to draft, or a new generation, starts it over."""
    from lightspec_core.budget import MAX_RECHECK, RECHECK

    p = DynamicBudget(beta=0.3, draft_cost=0.05)
    calibrate(p, 8)
    bad, good = [history(0, 40)] * 8, [history(40, 1)] * 8

    def plain_steps_until_decided(h):
        n = 0
        while True:
            decided = p.recheck == 0
            k = k_of(p, h)[0]
            if decided:
                return n, k
            n += 1

    assert k_of(p, bad) == [0] * 8
    waits = [plain_steps_until_decided(bad)[0] for _ in range(4)]
    assert waits == [RECHECK, 2 * RECHECK, 4 * RECHECK, MAX_RECHECK]
    n, k = plain_steps_until_decided(good)
    assert n == MAX_RECHECK and k >= 3  # decided after the longest wait, and drafts
    assert k_of(p, bad) == [0] * 8
    assert plain_steps_until_decided(bad)[0] == RECHECK  # starts over after drafting
    p.reset()
    assert k_of(p, bad) == [0] * 8
    assert plain_steps_until_decided(bad)[0] == RECHECK  # and in a new generation


def test_a_batchs_plain_steps_are_fitted_when_a_decision_reads_them():
    """A batch's plain step only records its forward; the fit (t1 = the plain forwards'
    median, beta through the verify widths) runs at the next decision, with the same
    result as fitting on every step."""
    lazy, eager = DynamicBudget(), DynamicBudget()
    for p in (lazy, eager):
        p.lightspec_on_stats(rows_step(8, 3 * T1))
        p.lightspec_on_stats(rows_step(8, 4.5 * T1, drafted=1, accepted=1))
    for i in range(10):
        for p in (lazy, eager):
            p.lightspec_on_stats(rows_step(8, (2.5 + 0.1 * i) * T1))
        eager.cost.fit_forward_cost((8, True))
    assert (8, True) in lazy.cost.unfitted and lazy.cost.fits[(8, True)][0] == pytest.approx(3 * T1)
    k_of(lazy, [history(0, 40)] * 8)
    assert lazy.cost.fits[(8, True)] == pytest.approx(eager.cost.fits[(8, True)]) and not lazy.cost.unfitted
    assert lazy.cost.t1 == pytest.approx(median([3 * T1] + [(2.5 + 0.1 * i) * T1 for i in range(10)]))


def test_the_forward_window_keeps_each_widths_median_as_samples_arrive_and_leave():
    """``ForwardWindow`` groups its last ``size`` forwards by verify width incrementally;
    its medians equal those of the window rebuilt from scratch after every append."""
    import random
    from collections import deque

    from lightspec_core.budget import ForwardWindow, MedianWindow

    rng = random.Random(0)
    win, ref, plain, ref_plain = ForwardWindow(8), deque(maxlen=8), MedianWindow(5), deque(maxlen=5)
    for _ in range(300):
        q, t = rng.choice((1, 1, 2, 5)), rng.choice((1.0, 2.0, 2.0, 3.5))  # repeated values leave too
        win.append(q, t)
        ref.append((q, t))
        plain.append(t)
        ref_plain.append(t)
        groups: dict[int, list[float]] = {}
        for qq, tt in ref:
            groups.setdefault(qq, []).append(tt)
        assert sorted(win.medians()) == sorted((qq, median(ts), len(ts)) for qq, ts in groups.items())
        assert len(win) == len(ref) and plain.median() == median(ref_plain)


def test_a_cold_first_forward_does_not_make_a_batchs_verify_look_free_and_the_anchor_is_renewed():
    """A batch size's first forward in a process is slow (cold caches, fresh allocations):
    the anchor is the median of BATCH_CALIBRATION plain steps, so one cold step does not
    inflate it and make the probe's verify look free.  A batch that speculates on every
    step takes one plain step after PLAIN_REFRESH of them, which renews the anchor."""
    from lightspec_core.budget import BATCH_CALIBRATION, PLAIN_REFRESH

    p = DynamicBudget(beta=0.12, draft_cost=0.0, guard=False)
    good = [history(40, 1)] * 8
    t8 = 3 * T1
    for i in range(BATCH_CALIBRATION):
        assert k_of(p, good) == [0] * 8
        p.lightspec_on_stats(rows_step(8, 1.6 * t8 if i == 0 else t8))  # the first one cold
    assert k_of(p, good) == [1] * 8  # the probe
    assert p.cost.t1 == pytest.approx(t8)  # the median: the cold step left out
    p.lightspec_on_stats(rows_step(8, 1.3 * t8, drafted=1, accepted=1))
    assert p.cost.verified_beta[(8, True)] == pytest.approx(0.3)  # against the cold step: 0 (clamped)
    steps = 0
    while k_of(p, good)[0] > 0:
        p.lightspec_on_stats(rows_step(8, 1.3 * t8, drafted=1, accepted=1))
        steps += 1
    assert steps == PLAIN_REFRESH - 1  # the probe counted too: then one plain step
    p.lightspec_on_stats(rows_step(8, 0.8 * t8))  # the machine got faster meanwhile
    assert p.cost.plain_age[(8, True)] == 0 and k_of(p, good)[0] > 0


def test_a_tree_accepted_to_its_depth_counts_no_rejection():
    """A tree's siblings are rejected by design: acceptance is learned per level, so a tree
    accepted along its whole depth counts as a chain accepted in full."""
    from lightspec_core.budget.acceptance import AcceptanceModel

    def ev(drafted, depth, accepted):
        return StepStats(kind="step", step=1, row_ids=[0], step_time_s=0.01, device_time_s=None,
                         peak_memory_bytes=0, drafted=[drafted], accepted=[accepted], emitted=[accepted + 1],
                         sources=["t"], confidence=[None], entropy=[None], stage_s={}, target_forward_s=0.01,
                         draft_forward_s=0.0, overhead_s=0.0, verify_tokens=drafted + 1, depth=[depth])

    tree, chain = AcceptanceModel(decay=0.9), AcceptanceModel(decay=0.9)
    for _ in range(5):
        tree.learn(ev(8, 3, 3), offered=True, sources=["t"])  # 8 nodes, 3 levels, all 3 accepted
        chain.learn(ev(3, 3, 3), offered=True, sources=["t"])
    assert tree.pooled["t"] == chain.pooled["t"] and tree.pooled["t"][1] == 0.0
    assert tree.source_acceptance(0, "t") == chain.source_acceptance(0, "t") > 0.8
    tree.learn(ev(8, 3, 2), offered=True, sources=["t"])  # stopped above its depth: a rejection
    assert tree.pooled["t"][1] == 1.0


def test_a_single_row_rechecks_too_and_learns_the_recheck_steps_as_if_at_each_step():
    """One row that chose k = 0 waits RECHECK (doubling to MAX_RECHECK) plain steps before
    deciding again, as a batch does (a decision right after a forward cost ~0.1 ms of a ~2 ms
    step).  The statistics of those steps are learned together at the next decision, which
    then sees every estimate as if each step had been learned when it arrived.  A row that
    explores (``explore_after``), or whose strategy has a model-free drafter (n-gram lookup:
    waiting lost it matches), decides at every step."""
    import copy

    from lightspec_core.budget import MAX_RECHECK, RECHECK

    p = DynamicBudget(beta=0.1, draft_cost=0.05)
    ref = DynamicBudget(beta=0.1, draft_cost=0.05)  # learns every step at once
    bad = [history(accepted=0, rejected=20)]
    events = [step(1, T1 * (1 + 0.01 * (i % 7))) for i in range(40)]
    reasons = []
    for event in events:
        b, r = p.lightspec_budget(ctx(bad)), ref.lightspec_budget(ctx(bad))
        reasons.append(b.reason)
        if b.reason == "recheck":
            assert b.max_draft.tolist() == [0]
        else:  # a decision: the same one, from the same estimates
            assert (b.max_draft.tolist(), b.reason, b.estimates) == (r.max_draft.tolist(), r.reason, r.estimates)
            assert (p.cost.t1, p.cost.beta, p.acceptance.pooled) == (ref.cost.t1, ref.cost.beta, ref.acceptance.pooled)
        p.lightspec_on_stats(event)
        ref.rechecking = False
        ref.lightspec_on_stats(event)
    assert p.deferred  # the last recheck steps wait for the next decision ...
    p.reset()  # ... or the end of the generation
    assert not p.deferred and len(p.cost.forward_samples[(1, True)]) == len(ref.cost.forward_samples[(1, True)])
    waits = [len(run) for run in "".join("r" if r == "recheck" else "." for r in reasons).split(".")[2:-1]]
    assert waits[:3] == [RECHECK, 2 * RECHECK, MAX_RECHECK]  # after calibrating and the first decision
    explorer = DynamicBudget(beta=0.1, draft_cost=0.05, explore_after=64)
    lookup = DynamicBudget(beta=0.1, draft_cost=0.05)  # a strategy with a model-free drafter
    for event in events[:10]:
        assert explorer.lightspec_budget(ctx(bad)).reason != "recheck"
        explorer.lightspec_on_stats(copy.copy(event))
        with_ngram = ctx(bad)
        with_ngram.draft_cost_hints = {"ngram": 0.0, "draft_model": 0.2}
        assert lookup.lightspec_budget(with_ngram).reason != "recheck"
        lookup.lightspec_on_stats(copy.copy(event))
