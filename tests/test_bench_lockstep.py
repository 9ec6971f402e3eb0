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
