"""Continuous batching for the server: one worker thread owns the model.

Requests wait in a bounded queue (``QueueFull`` beyond ``max_queue``: the server answers
429).  Between engine steps the worker removes cancelled rows (a client went away),
admits waiting requests while fewer than ``batch_size`` rows decode, then runs one step of
every group.  A group is one ``EngineSession`` on its own pipeline, for one (strategy,
sampling setting): rows of a batch share a strategy and sampling parameters, seeds are
per row.  Events go back to each request's asyncio queue with ``call_soon_threadsafe``, so
the event loop never waits for the model.

A group that has admitted ``RESET_EVERY`` requests stops admitting until its rows finish,
so that its components start afresh (their per-request state is dropped at a reset).
A failure inside a group's step fails that group's requests only (500), and the group's
pipeline is rebuilt for the next request.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine_session import EngineSession
from ..errors import LightSpecError
from ..sampling import SamplingParams

log = logging.getLogger("lightspec.server")

RESET_EVERY = 256
MAX_GROUPS = 8  # pipelines kept at once (one per strategy and sampling setting in use)


class QueueFull(Exception):
    """The waiting queue is full."""


@dataclass
class Job:
    """One admitted or waiting request and where its events go."""

    prompt: list[int]
    max_tokens: int
    strategy: str
    sampling: SamplingParams
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    ignore_eos: bool = False  # no token id ends the row (max_tokens or a stop string do)
    id: int = 0
    generated: int = 0
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)

    def send(self, event: tuple) -> None:
        """Hand an event to the request's coroutine (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass
class Group:
    key: tuple
    pipe: Any
    session: EngineSession
    admitted: int = 0
    draining: bool = False


class Scheduler:
    """The worker and its queue.  ``make_pipeline(strategy, sampling)`` builds a group's
    pipeline (sharing the target model); ``metrics``: an object with ``queue_depth(n)``,
    ``running(n)`` and ``request_done(job, summary)`` (or None)."""

    def __init__(self, make_pipeline: Callable[[str, SamplingParams], Any], batch_size: int, max_queue: int,
                 metrics=None):
        self.make_pipeline, self.batch_size, self.max_queue = make_pipeline, batch_size, max_queue
        self.metrics = metrics
        self.waiting: deque[Job] = deque()
        self.running: dict[int, tuple[Job, Group]] = {}
        self.groups: dict[tuple, Group] = {}
        self.cond = threading.Condition()
        self.ids = itertools.count(1)
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="lightspec-model", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        """Queue ``job`` (its id is set here); ``QueueFull`` when ``max_queue`` wait already."""
        with self.cond:
            if len(self.waiting) >= self.max_queue:
                raise QueueFull
            job.id = next(self.ids)
            self.waiting.append(job)
            self._gauges()
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: the row leaves at the next step (or never starts)."""
        with self.cond:
            job.cancelled = True
            self.cond.notify()

    @property
    def active(self) -> int:
        return len(self.running)

    # -- the worker ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self.cond:
                if not self.stopped and not self.waiting and not self.running:
                    _release_memory()  # idle: the freed KV caches go back to the OS
                while not self.stopped and not self.waiting and not self.running:
                    self.cond.wait()
                if self.stopped:
                    break
            try:
                self._drop_cancelled()
                self._admit()
                for group in list(self.groups.values()):
                    if len(group.session):
                        self._step(group)
            except Exception:  # noqa: BLE001 - the worker must outlive any one failure
                log.exception("the scheduler's loop failed; its running requests are failed")
                for job, group in list(self.running.values()):
                    self._fail(job, 500, "internal error while decoding", group)
        for job, group in list(self.running.values()):
            self._fail(job, 503, "the server is shutting down", group)
        with self.cond:
            waiting, self.waiting = list(self.waiting), deque()
        for job in waiting:
            job.send(("error", 503, "the server is shutting down"))

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth(len(self.waiting))
            self.metrics.running(len(self.running))

    def _drop_cancelled(self) -> None:
        for rid, (job, group) in list(self.running.items()):
            if job.cancelled:
                group.session.remove(rid)
                group.pipe.summary.summaries.pop(rid, None)
                del self.running[rid]
                if self.metrics is not None:
                    self.metrics.request_cancelled()
        self._gauges()

    def _admit(self) -> None:
        skipped = []
        while len(self.running) < self.batch_size:
            with self.cond:
                if not self.waiting:
                    break
                job = self.waiting.popleft()
            if job.cancelled:
                continue
            try:
                group = self._group(job)
            except LightSpecError as exc:
                job.send(("error", 422, str(exc)))
                continue
            except Exception as exc:  # noqa: BLE001 - a strategy that cannot be built fails its request only
                log.warning("building strategy %r failed: %s: %s", job.strategy, type(exc).__name__, exc)
                job.send(("error", 500, f"strategy {job.strategy!r} could not be built: {type(exc).__name__}: {exc}"))
                continue
            if group is not None and group.draining and not len(group.session):
                group.draining, group.admitted = False, 0  # drained: the next add starts it afresh
            if group is None or group.draining:
                skipped.append(job)
                continue
            self._start(job, group)
        if skipped:
            with self.cond:
                self.waiting.extendleft(reversed(skipped))
        self._gauges()

    def _group(self, job: Job) -> Group | None:
        """The group for ``job``, built on first use; None when ``MAX_GROUPS`` are all busy."""
        key = (job.strategy, job.sampling, job.ignore_eos)
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:  # forget an idle group's pipeline first
                idle = next((k for k, g in self.groups.items() if not len(g.session)), None)
                if idle is None:
                    return None
                self.groups.pop(idle).session.close()
            pipe = self.make_pipeline(job.strategy, job.sampling)
            eos = set() if job.ignore_eos else pipe.eos_ids
            group = self.groups[key] = Group(key, pipe, EngineSession(pipe.engine, job.sampling, eos))
        return group

    def _start(self, job: Job, group: Group) -> None:
        session = group.session
        group.pipe.summary.start(job.id, len(job.prompt))
        try:
            first = session.add(job.id, job.prompt, job.max_tokens, job.seed, job.stop)
        except LightSpecError as exc:
            group.pipe.summary.summaries.pop(job.id, None)
            job.send(("error", 400, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001
            group.pipe.summary.summaries.pop(job.id, None)
            log.warning("prefill failed: %s: %s", type(exc).__name__, exc)
            job.send(("error", 500, f"prefill failed: {type(exc).__name__}: {exc}"))
            return
        group.admitted += 1
        if group.admitted >= RESET_EVERY:
            group.draining = True
        self.running[job.id] = (job, group)
        if self.metrics is not None:
            self.metrics.first_token(time.perf_counter() - job.submitted)
        self._deliver(job, group, first.tokens, first.finish_reason)

    def _step(self, group: Group) -> None:
        try:
            outputs = group.session.step(queue_backlog=len(self.waiting))
        except Exception as exc:  # noqa: BLE001 - one group's failure stays in that group
            log.warning("a step of strategy %r failed: %s: %s; its requests are failed", group.key[0],
                        type(exc).__name__, exc)
            for job, g in list(self.running.values()):
                if g is group:
                    self._fail(job, 500, f"decoding failed: {type(exc).__name__}: {exc}", group)
            return
        for out in outputs:
            entry = self.running.get(out.request)
            if entry is not None:
                self._deliver(entry[0], group, out.tokens, out.finish_reason)
        if not len(group.session) and group.draining:
            group.draining, group.admitted = False, 0

    def _deliver(self, job: Job, group: Group, tokens: list[int], finish: str | None) -> None:
        summary = None
        job.generated += len(tokens)
        if finish is not None:
            summary = group.pipe.summary.summaries.pop(job.id, None)
            if summary is not None:
                summary.new_tokens, summary.finish_reason = job.generated, finish
                summary.wall_time_s = time.perf_counter() - job.submitted
            self.running.pop(job.id, None)
            if self.metrics is not None:
                self.metrics.request_done(job, summary)
            self._gauges()
        job.send(("tokens", tokens, finish, summary))

    def _fail(self, job: Job, status: int, message: str, group: Group) -> None:
        self.running.pop(job.id, None)
        group.pipe.summary.summaries.pop(job.id, None)
        job.send(("error", status, message))
        if group.key in self.groups and self.groups[group.key] is group and status == 500:
            group.session.close()
            del self.groups[group.key]  # the next request of this strategy gets a fresh pipeline


def _release_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; nothing elsewhere):
    without it a server's RSS stays at its busiest moment's high-water mark after the load
    is gone, since glibc keeps the freed KV-cache blocks of its per-thread arenas."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        gc.collect()
        _TRIM(0)


_TRIM = None

