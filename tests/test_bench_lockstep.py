"""``lightspec bench``'s lockstep runner: methods advance one step each in turn, and each
is charged only for its own running time."""

import time

import torch
from lightspec_core.bench import MethodResult, run_lockstep


class FakeMethod:
    """Runs ``steps`` steps of ``step_s`` seconds each (sleeping), logging each step."""

    def __init__(self, name, steps, step_s, log, fail_at=None):
        self.result = MethodResult(name, "test")
        self.steps, self.step_s, self.log, self.fail_at = steps, step_s, log, fail_at

    def run(self, chunk, max_new, seed, record=True, pause=None):
        for i in range(self.steps):
            if i == self.fail_at:
                raise RuntimeError(f"{self.result.name} broke")
            time.sleep(self.step_s)
            self.log.append(self.result.name)
            self.result.tokens += len(chunk)
            pause()


def test_lockstep_alternates_steps_and_charges_each_method_its_own_time():
    log = []
    slow = FakeMethod("slow", steps=4, step_s=0.02, log=log)
    fast = FakeMethod("fast", steps=6, step_s=0.002, log=log)
    failed = {}
    run_lockstep([slow, fast], [[1, 2]], 8, None, True, torch.device("cpu"), failed)
    assert not failed
    # one step of each in turn; the longer run finishes alone
    assert log == ["slow", "fast"] * 4 + ["fast", "fast"]
    assert slow.result.tokens == 4 and fast.result.tokens == 6
    # each is charged its own sleeping, not the other's: the slow method's 4 x 20 ms
    # against the fast one's 6 x 2 ms (waiting for a turn is not running)
    assert slow.result.seconds >= 4 * 0.02
    assert fast.result.seconds >= 6 * 0.002
    assert fast.result.seconds < 0.5 * slow.result.seconds


def test_lockstep_reports_a_failing_method_and_finishes_the_others():
    log = []
    bad = FakeMethod("bad", steps=5, step_s=0.0, log=log, fail_at=2)
    good = FakeMethod("good", steps=3, step_s=0.0, log=log)
    failed = {}
    run_lockstep([bad, good], [[1]], 8, None, True, torch.device("cpu"), failed)
    assert failed == {"bad": "RuntimeError: bad broke"}
    assert log.count("good") == 3 and log.count("bad") == 2


def test_peak_memory_counts_what_a_run_allocates_even_when_the_heap_is_already_grown():
    """In-use bytes, not the resident set: a second allocation of the same size, reusing
    the heap the first one grew, still counts."""
    from lightspec_core.bench import PeakMemory

    cpu = torch.device("cpu")
    for _ in range(2):
        with PeakMemory(cpu, interval=0.001) as mem:
            x = torch.ones(2_000_000)  # 7.6 MB
            time.sleep(0.02)
            del x
        assert mem.extra >= 6.0, mem.extra


def test_lockstep_records_each_rounds_tokens_and_time():
    log = []
    a = FakeMethod("a", steps=3, step_s=0.002, log=log)
    for _ in range(2):
        run_lockstep([a], [[1, 2]], 8, None, True, torch.device("cpu"), {})
    assert a.result.round_tokens == [3, 3]
    assert len(a.result.round_seconds) == 2 and sum(a.result.round_seconds) == a.result.seconds


def test_paired_speedup_is_the_geometric_mean_of_round_ratios_with_a_t_interval():
    import math

    import pytest
    from lightspec_core.bench import paired_speedup

    base = MethodResult("none", "lightspec", round_tokens=[10] * 4, round_seconds=[1.0, 2.0, 1.0, 2.0])
    # every round 10% faster than the baseline's round: the machine's swings cancel, no spread
    same = MethodResult("x", "lightspec", round_tokens=[10] * 4, round_seconds=[t / 1.1 for t in base.round_seconds])
    mean, lo, hi = paired_speedup(same, base)
    assert mean == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    # ratios 1.05 and 0.95 alternating: the interval holds 1
    mixed = MethodResult("y", "lightspec", round_tokens=[10] * 4,
                         round_seconds=[t / r for t, r in zip(base.round_seconds, (1.05, 0.95, 1.05, 0.95))])
    mean, lo, hi = paired_speedup(mixed, base)
    logs = [math.log(1.05), math.log(0.95)] * 2
    m = sum(logs) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 3)
    assert mean == pytest.approx(math.exp(m))
    assert hi == pytest.approx(math.exp(m + 3.182 * sd / 2)) and lo < 1.0 < hi
    # rounds that do not pair up (other tokens, one round) give no interval
    assert paired_speedup(MethodResult("z", "l", round_tokens=[9] * 4, round_seconds=[1.0] * 4), base) is None
    assert paired_speedup(MethodResult("z", "l", round_tokens=[10], round_seconds=[1.0]),
                          MethodResult("b", "l", round_tokens=[10], round_seconds=[1.0])) is None


def test_round_order_balances_positions_over_each_pair_of_rounds():
    from lightspec_core.bench import round_order

    methods = list("abcdefg")
    for pair in range(10):
        first, second = round_order(methods, 2 * pair), round_order(methods, 2 * pair + 1)
        assert sorted(first) == methods and sorted(second) == methods
        for m in methods:
            assert first.index(m) + second.index(m) == len(methods) - 1
    firsts = [round_order(methods, i)[0] for i in range(0, 14, 2)]
    assert sorted(firsts) == methods  # the rotation gives every method the first place in turn
