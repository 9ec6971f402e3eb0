"""Lockstep runs for ``lightspec bench``: every method works on the same batch of prompts at
the same time, each in a thread of its own, one decoding step of each in turn, each
charged only for its own running time (see docs/benchmarks.md for why)."""

from __future__ import annotations

import threading
import time

import torch


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Lane:
    """One method's run of one batch in a thread of its own, advanced one decoding step per
    turn: ``step()`` lets it run until the end of its next step (or of the run).

    ``busy`` is the time it spent running, its wall time minus the time it waited for its
    turns; a thread switch happens outside that time."""

    def __init__(self, method, chunk: list[list[int]], max_new: int, seed: int | None, record: bool, device):
        self.method, self.device = method, device
        self.args = (chunk, max_new, seed, record)
        self.busy = 0.0
        self.done = False
        self.error: BaseException | None = None
        self._turn, self._parked = threading.Event(), threading.Event()
        self._t0 = 0.0
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        self._turn.wait()
        self._turn.clear()
        self._t0 = time.perf_counter()
        try:
            self.method.run(*self.args, pause=self._pause)
        except BaseException as exc:  # reported by the scheduler
            self.error = exc
        finally:
            _sync(self.device)
            self.busy += time.perf_counter() - self._t0
            self.done = True
            self._parked.set()

    def _pause(self) -> None:
        _sync(self.device)
        self.busy += time.perf_counter() - self._t0
        self._parked.set()
        self._turn.wait()
        self._turn.clear()
        self._t0 = time.perf_counter()

    def step(self) -> None:
        self._turn.set()
        self._parked.wait()
        self._parked.clear()
        if self.done:
            self._thread.join()


def run_lockstep(methods: list, chunk: list[list[int]], max_new: int, seed: int | None, record: bool, device,
                 failed: dict[str, str]) -> None:
    """Run ``chunk`` with every method at once, one decoding step of each in turn (in the
    given order), adding each method's running time to its result."""
    lanes = [Lane(m, chunk, max_new, seed, record, device) for m in methods]
    tokens_before = {id(lane): lane.method.result.tokens for lane in lanes}
    while lanes:
        for lane in list(lanes):
            lane.step()
            if lane.done:
                lanes.remove(lane)
                res = lane.method.result
                res.seconds += lane.busy
                res.round_seconds.append(lane.busy)
                res.round_tokens.append(res.tokens - tokens_before[id(lane)])
                if lane.error is not None:
                    failed[lane.method.result.name] = f"{type(lane.error).__name__}: {lane.error}"


def round_order(methods: list, i: int) -> list:
    """The order of ``methods`` in round ``i``: rotated every second round, mirrored in the
    round in between, so that over each pair of rounds every method's two positions add up
    to the same.  In lockstep the later lanes of a round ran slower (run T, batch 8: the
    last two positions 2-3% above a round's mean, the first ones 1% below), and a plain
    rotation over 8 rounds of 7 methods put one method first twice."""
    rot = (i // 2) % len(methods)
    order = methods[rot:] + methods[:rot]
    return order[::-1] if i % 2 else order
