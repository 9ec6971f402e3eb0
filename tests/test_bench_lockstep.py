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


def test_student_t_cdf_matches_tabulated_quantiles():
    import pytest
    from lightspec_core.bench_stats import _T95, _student_t_cdf

    # the two-sided 95% quantiles the intervals use: P(T <= -t) = 0.025 for each df
    for df, t in enumerate(_T95, start=1):
        assert _student_t_cdf(-t, df) == pytest.approx(0.025, abs=1e-4)  # the table has 3 decimals
        assert _student_t_cdf(t, df) == pytest.approx(0.975, abs=1e-4)
    assert _student_t_cdf(0.0, 7) == pytest.approx(0.5)
    # one-sided 5% for df = 7 (1.895) and 99.5% for df = 3 (5.841), from t tables
    assert _student_t_cdf(-1.895, 7) == pytest.approx(0.05, abs=1e-4)
    assert _student_t_cdf(5.841, 3) == pytest.approx(0.995, abs=1e-4)
    # df = 1 is Cauchy: P(T <= t) = 1/2 + atan(t)/pi
    import math
    for t in (-30.0, -1.0, 0.3, 4.0):
        assert _student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


def test_slower_p_value_is_small_only_for_consistently_slower_rounds():
    import math

    from lightspec_core.bench import slower_p_value

    slower = [math.log(r) for r in (0.97, 0.98, 0.96, 0.975, 0.985, 0.97, 0.965, 0.98)]
    faster = [-x for x in slower]
    assert slower_p_value(slower) < 0.001
    assert slower_p_value(faster) > 0.999
    assert 0.2 < slower_p_value([math.log(r) for r in (0.97, 1.03, 0.99, 1.01)]) < 0.8
    assert slower_p_value([0.0, 0.0, 0.0]) == 0.5
    assert slower_p_value([0.01]) is None


def test_holm_rejects_step_down_and_stops_at_the_first_kept_hypothesis():
    from lightspec_core.bench import holm_rejected

    # m = 4: thresholds 0.0125, 0.0167, 0.025, 0.05
    assert holm_rejected({"a": 0.001, "b": 0.015, "c": 0.03, "d": 0.9}) == ["a", "b"]
    # "b" at 0.02 > 0.0167 stops the procedure, though "c" alone would pass its threshold
    assert holm_rejected({"a": 0.001, "b": 0.02, "c": 0.021, "d": 0.9}) == ["a"]
    assert holm_rejected({"a": 0.02, "b": 0.5}) == ["a"]  # 0.02 <= 0.05 / 2
    assert holm_rejected({"a": 0.03, "b": 0.5}) == []
    assert holm_rejected({}) == []


def test_equal_methods_flag_one_cell_in_forty_alone_and_hardly_ever_a_family():
    """Why the batch target is judged as a family: 50 cells of two equal methods (8 paired
    rounds each, noise only) put ~2.5% of cells "below 1" one by one; Holm's procedure
    over the 50 flags a family in about 5% of such runs at most."""
    import math
    import random

    from lightspec_core.bench import holm_rejected, slower_p_value

    rng = random.Random(4)
    runs, cells, per_cell, families = 200, 50, 0, 0
    for _ in range(runs):
        ps = {}
        for c in range(cells):
            ps[c] = slower_p_value([rng.gauss(0.0, 0.02) for _ in range(8)])
            per_cell += ps[c] < 0.025
        families += bool(holm_rejected(ps))
    assert 0.015 < per_cell / (runs * cells) < 0.035
    assert families / runs <= 0.08
    # and a real 3% slowdown in one cell among them is found nearly every time
    found = 0
    for _ in range(50):
        ps = {c: slower_p_value([rng.gauss(0.0, 0.01) for _ in range(8)]) for c in range(cells - 1)}
        ps["slow"] = slower_p_value([rng.gauss(math.log(0.97), 0.01) for _ in range(8)])
        found += "slow" in holm_rejected(ps)
    assert found >= 45
