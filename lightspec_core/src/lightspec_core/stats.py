"""Runtime statistics: one ``StepStats`` event per decode step, at three levels.

* hardware:  step wall time, device time (CUDA events, on GPU), peak memory
* algorithm: drafted/accepted per row and per draft position, acceptance, confidence,
             entropy, per-token latency, the component each row used
* system:    time per pipeline stage (budget, draft, verify forward, accept, bookkeeping),
             overhead = wall time outside model forwards, queue backlog when serving

Sinks receive events through ``lightspec_on_stats``: ``JsonlSink`` (``--stats-out``),
``LogSink`` (a periodic "SpecDecoding metrics" line like vLLM's), and
``SummaryCollector`` (the per-request summaries ``generate()`` returns).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from .hookspecs import hookimpl

log = logging.getLogger("lightspec.stats")


@dataclass
class StepStats:
    kind: str
    step: int
    row_ids: list[int]
    # hardware
    step_time_s: float
    device_time_s: float | None
    peak_memory_bytes: int
    # algorithm
    drafted: list[int]
    accepted: list[int]
    emitted: list[int]
    sources: list[str]
    confidence: list[float | None]
    entropy: list[float | None]
    # system
    stage_s: dict[str, float]
    target_forward_s: float
    draft_forward_s: float
    overhead_s: float
    verify_tokens: int
    queue_backlog: int = 0
    failure: str | None = None
    draft_setup_s: float = 0.0  # part of draft_forward_s spent catching a drafter up (not per-token cost)
    # per model drafter: (seconds of its forwards without setup, draft tokens of its longest row)
    draft_by_source: dict[str, tuple[float, int]] = field(default_factory=dict)
    # the budget's decision: k per row (after the max_new_tokens cap), why, and its estimates
    budget_k: list[int] = field(default_factory=list)
    budget_reason: str = ""
    budget_estimates: dict[str, float] = field(default_factory=dict)
    # share of the step's wall time in which neither a drafter nor the target computed
    bubble_ratio: float = 0.0
    # each row's draft depth (the nodes on its longest path: ``drafted`` for a chain, fewer
    # for a tree); empty when the producer did not say, read as ``drafted``
    depth: list[int] = field(default_factory=list)

    @property
    def levels(self) -> list[int]:
        """Each row's draft depth: ``depth`` when given, else ``drafted`` (chains)."""
        return self.depth if len(self.depth) == len(self.drafted) else self.drafted

    @property
    def drafted_total(self) -> int:
        return sum(self.drafted)

    @property
    def drafted_max(self) -> int:
        return max(self.drafted, default=0)

    @property
    def accepted_total(self) -> int:
        return sum(self.accepted)

    @property
    def acceptance_rate(self) -> float | None:
        d = self.drafted_total
        return self.accepted_total / d if d else None

    @property
    def per_token_latency_s(self) -> float:
        n = sum(self.emitted)
        return self.step_time_s / n if n else self.step_time_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=(sum(a + 1 for a, e in zip(self.accepted, self.emitted) if e) / max(1, sum(1 for e in self.emitted if e))),
            per_token_latency_s=self.per_token_latency_s,
        )
        return d


@dataclass
class RequestSummary:
    """Statistics of one finished request (returned by ``generate()``)."""

    kind: str = "request"
    request: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    finish_reason: str = ""
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target verify step, including the bonus/corrected token."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s else 0.0

    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
            per_position_acceptance=self.per_position_acceptance(),
        )
        return d


class SummaryCollector:
    """Builds one RequestSummary per request from the step events."""

    name = "summary"

    def __init__(self) -> None:
        self.summaries: dict[int, RequestSummary] = {}

    def start(self, request: int, prompt_tokens: int) -> RequestSummary:
        s = self.summaries[request] = RequestSummary(request=request, prompt_tokens=prompt_tokens)
        return s

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if event.kind != "step":
            return
        levels = event.levels
        for b, rid in enumerate(event.row_ids):
            s = self.summaries.get(rid)
            if s is None:
                continue
            d, a, depth = event.drafted[b], event.accepted[b], levels[b]
            s.steps += 1
            s.drafted += d
            s.accepted += a
            if d:
                while len(s.per_position_drafted) < depth:  # positions are levels of a tree
                    s.per_position_drafted.append(0)
                    s.per_position_accepted.append(0)
                for i in range(depth):
                    s.per_position_drafted[i] += 1
                    if i < a:
                        s.per_position_accepted[i] += 1
                src = event.sources[b] or "none"
                s.sources[src] = s.sources.get(src, 0) + 1
            if event.failure:
                s.failures.append(event.failure)


class JsonlSink:
    """Writes every event as one JSON line (``--stats-out FILE``)."""

    name = "jsonl"

    def __init__(self, path: str):
        self.path = path
        self.fh = open(path, "a", encoding="utf-8")

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        self.fh.write(json.dumps(event.to_dict()) + "\n")

    def close(self) -> None:
        self.fh.flush()
        self.fh.close()


class LogSink:
    """Logs aggregate "SpecDecoding metrics" every ``interval_s`` seconds (INFO level)."""

    name = "log"

    def __init__(self, interval_s: float = 5.0):
        self.interval_s = interval_s
        self._reset()
        self.last = time.monotonic()

    def _reset(self) -> None:
        self.drafted = self.accepted = self.verifies = self.emitted = 0
        self.pos_d: list[int] = []
        self.pos_a: list[int] = []

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        if event.kind != "step":
            return
        for d, a, e in zip(event.drafted, event.accepted, event.emitted):
            self.drafted += d
            self.accepted += a
            self.emitted += e
            self.verifies += 1
            while len(self.pos_d) < d:
                self.pos_d.append(0)
                self.pos_a.append(0)
            for i in range(d):
                self.pos_d[i] += 1
                self.pos_a[i] += i < a
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.flush()
            self.last = now

    def line(self) -> str:
        rate = self.accepted / self.drafted if self.drafted else 0.0
        mean_len = self.emitted / self.verifies if self.verifies else 0.0
        per_pos = ", ".join(f"{a / d:.3f}" for a, d in zip(self.pos_a, self.pos_d) if d)
        return (
            f"SpecDecoding metrics: Draft acceptance rate: {rate:.1%}, Mean acceptance length: {mean_len:.2f}, "
            f"Accepted: {self.accepted} tokens, Drafted: {self.drafted} tokens, Per-position acceptance rate: {per_pos}"
        )

    def flush(self) -> None:
        if self.verifies:
            log.info(self.line())
        self._reset()
