"""The server's Prometheus metrics (``prometheus_client``), fed by the engine's statistics.

``ServerMetrics`` is a statistics sink (``lightspec_on_stats``) added to every group's
pipeline, plus the scheduler's gauges.  Names follow vLLM's where one exists (prefix
``lightspec:`` instead of ``vllm:``), so existing boards need only the prefix changed.
Each server has its own registry (several servers may run in one process, e.g. tests).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..hookspecs import hookimpl

P = "lightspec:"
RATE_WINDOW_S = 10.0  # tokens/s is measured over this trailing window
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    name = "server_metrics"

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.drafts = Counter(P + "spec_decode_num_drafts", "Verify steps of rows that had a draft", ["strategy"],
                              registry=r)
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed", ["strategy"],
                                    registry=r)
        self.accepted = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted", ["strategy"],
                                registry=r)
        self.per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted per position",
                               ["strategy", "position"], registry=r)
        self.per_pos_drafted = Counter(P + "spec_decode_num_draft_tokens_per_pos",
                                       "Draft tokens proposed per position", ["strategy", "position"], registry=r)
        self.generated = Counter(P + "generation_tokens", "Tokens generated", ["strategy"], registry=r)
        self.row_steps = Counter(P + "row_steps", "Row verify steps (one per row per engine step)", ["strategy"],
                                 registry=r)
        self.acceptance = Gauge(P + "spec_decode_acceptance_rate", "Accepted / drafted tokens since start",
                                ["strategy"], registry=r)
        self.mean_len = Gauge(P + "spec_decode_mean_accepted_length",
                              "Tokens emitted per row verify step since start (bonus token included)", ["strategy"],
                              registry=r)
        self.pos_rate = Gauge(P + "spec_decode_per_position_acceptance_rate",
                              "Accepted / drafted at each draft position since start", ["strategy", "position"],
                              registry=r)
        self.tps = Gauge(P + "generation_tokens_per_second", f"Tokens generated per second over the last "
                         f"{RATE_WINDOW_S:g} s", registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests in the queue", registry=r)
        self.running_g = Gauge(P + "num_requests_running", "Requests decoding in the batch", registry=r)
        self.step_latency = Histogram(P + "step_latency_seconds", "Wall time of one engine step", ["strategy"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.bubble = Histogram(P + "step_bubble_ratio", "Share of a step's wall time outside model forwards",
                                ["strategy"], buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), registry=r)
        self.budget_k = Histogram(P + "budget_chosen_k", "Draft length the budget policy chose per row and step",
                                  ["strategy"], buckets=(0, 1, 2, 3, 4, 5, 6, 8, 12, 16), registry=r)
        self.budget_k_last = Gauge(P + "budget_chosen_k_mean", "Mean k the budget chose in the latest step",
                                   ["strategy"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Queue + prefill time to the first token",
                              buckets=REQUEST_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Time from arrival to the last token",
                             buckets=REQUEST_BUCKETS, registry=r)
        self.requests = Counter(P + "request_success", "Finished requests", ["finish_reason"], registry=r)
        self.failures = Counter(P + "step_failures", "Steps in which a strategy component failed (decoded plainly)",
                                ["strategy"], registry=r)
        self.cancelled = Counter(P + "request_cancelled", "Requests whose client went away before the end",
                                 registry=r)
        self._lock = threading.Lock()
        self._window: deque[tuple[float, int]] = deque()
        self._totals: dict[str, list[int]] = {}  # strategy -> [drafted, accepted, emitted, row steps]
        self._pos: dict[str, list[list[int]]] = {}  # strategy -> [[drafted, accepted] per position]

    def for_strategy(self, strategy: str) -> "_StrategySink":
        """The sink a pipeline of ``strategy`` reports to."""
        return _StrategySink(self, strategy)

    def observe(self, strategy: str, event) -> None:
        if getattr(event, "kind", None) != "step":
            return
        drafted, accepted, emitted = event.drafted, event.accepted, event.emitted
        with self._lock:
            tot = self._totals.setdefault(strategy, [0, 0, 0, 0])
            pos = self._pos.setdefault(strategy, [])
            for d, a in zip(event.levels, accepted):  # positions are a tree's levels
                while len(pos) < d:
                    pos.append([0, 0])
                for i in range(d):
                    pos[i][0] += 1
                    pos[i][1] += i < a
            tot[0] += sum(drafted)
            tot[1] += sum(accepted)
            tot[2] += sum(emitted)
            tot[3] += len(emitted)
            now = time.monotonic()
            self._window.append((now, sum(emitted)))
            while self._window and self._window[0][0] < now - RATE_WINDOW_S:
                self._window.popleft()
            tps = sum(n for _, n in self._window) / RATE_WINDOW_S
            snapshot = list(tot), [list(p) for p in pos]
        tot, pos = snapshot
        n_drafts = sum(1 for d in drafted if d)
        if n_drafts:
            self.drafts.labels(strategy).inc(n_drafts)
        self.draft_tokens.labels(strategy).inc(sum(drafted))
        self.accepted.labels(strategy).inc(sum(accepted))
        self.generated.labels(strategy).inc(sum(emitted))
        self.row_steps.labels(strategy).inc(len(emitted))
        for d, a in zip(drafted, accepted):
            for i in range(d):
                self.per_pos_drafted.labels(strategy, str(i)).inc()
                if i < a:
                    self.per_pos.labels(strategy, str(i)).inc()
        if tot[0]:
            self.acceptance.labels(strategy).set(tot[1] / tot[0])
        if tot[3]:
            self.mean_len.labels(strategy).set(tot[2] / tot[3])
        for i, (d, a) in enumerate(pos):
            if d:
                self.pos_rate.labels(strategy, str(i)).set(a / d)
        self.tps.set(tps)
        if event.failure:
            self.failures.labels(strategy).inc()
        self.step_latency.labels(strategy).observe(event.step_time_s)
        self.bubble.labels(strategy).observe(event.bubble_ratio)
        ks = event.budget_k or []
        for k in ks:
            self.budget_k.labels(strategy).observe(k)
        if ks:
            self.budget_k_last.labels(strategy).set(sum(ks) / len(ks))

    # -- the scheduler's side ---------------------------------------------------------------

    def queue_depth(self, n: int) -> None:
        self.waiting.set(n)

    def running(self, n: int) -> None:
        self.running_g.set(n)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def request_done(self, job, summary) -> None:
        self.e2e.observe(time.perf_counter() - job.submitted)
        self.requests.labels(summary.finish_reason if summary is not None and summary.finish_reason else "stop").inc()

    def request_cancelled(self) -> None:
        self.cancelled.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StrategySink:
    """A statistics sink that reports one strategy's steps to ``ServerMetrics``."""

    name = "server_metrics"

    def __init__(self, metrics: ServerMetrics, strategy: str):
        self.metrics, self.strategy = metrics, strategy

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        self.metrics.observe(self.strategy, event)
