"""The methods ``lightspec bench`` times: HF ``generate`` (``HFMethod``) and a LightSpec
pipeline (``LightSpecMethod``), each recording its results in a ``MethodResult``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .bench_memory import MEMORY_RUNS, PeakMemory


@dataclass
class MethodResult:
    name: str
    family: str  # "hf" or "lightspec"
    tokens: int = 0
    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    peak_extra_mb: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    overhead_s: float = 0.0
    step_s: float = 0.0
    # the same, from runs of the method alone (lockstep benchmarks add such runs: there the
    # other methods' steps run between two of its steps and evict its caches, which
    # inflates the time outside forwards; see ``LightSpecMethod.measure_overhead``)
    overhead_alone_s: float = 0.0
    step_alone_s: float = 0.0
    # seconds of its steps in which neither a drafter nor the target computed (the sum of
    # bubble_ratio x step_time_s over the steps), in lockstep and alone
    bubble_s: float = 0.0
    bubble_alone_s: float = 0.0
    identical: int | None = None
    checked: int | None = None  # how many outputs had an HF vanilla greedy reference
    error: str | None = None
    # per timed round (one batch of prompts run once): new tokens and seconds; lockstep
    # rounds of two methods ran at the same time, so their ratios pair up (``paired_speedup``)
    round_tokens: list[int] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    speedup_ci95: tuple[float, float] | None = None  # against the workload's baseline, set by ``main``
    # against LightSpec's ``none`` where the baseline is HF's (batch 1): (point, low, high), set by ``main``
    vs_none: tuple[float, float | None, float | None] | None = None
    # LightSpec methods: the step events of the timed runs (for the per-step report page)
    step_events: list = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    def per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.pos_accepted, self.pos_drafted)]

    def to_dict(self, vanilla_tps: float | None) -> dict:
        return {
            "name": self.name, "family": self.family, "tokens": self.tokens, "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "speedup_vs_hf": (self.tokens_per_s / vanilla_tps) if vanilla_tps else None,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "per_position_acceptance": self.per_position(), "peak_extra_mb": self.peak_extra_mb,
            "overhead_fraction": (self.overhead_alone_s / self.step_alone_s if self.step_alone_s
                                  else self.overhead_s / self.step_s if self.step_s else None),
            "overhead_fraction_lockstep": self.overhead_s / self.step_s if self.step_s else None,
            "bubble_ratio": (self.bubble_alone_s / self.step_alone_s if self.step_alone_s
                             else self.bubble_s / self.step_s if self.step_s else None),
            "bubble_ratio_lockstep": self.bubble_s / self.step_s if self.step_s else None,
            "identical_to_hf": self.identical, "identical_checked": self.checked, "error": self.error,
            "speedup_ci95": list(self.speedup_ci95) if self.speedup_ci95 else None,
            "speedup_vs_none": self.vs_none[0] if self.vs_none else None,
            "speedup_vs_none_ci95": list(self.vs_none[1:]) if self.vs_none and self.vs_none[1] is not None else None,
            "round_tokens": self.round_tokens, "round_seconds": self.round_seconds,
        }


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class _Method:
    """What HF and LightSpec methods share: the lockstep runs' memory measurement."""

    result: MethodResult
    device: torch.device

    def measure_memory(self, chunk: list[list[int]], max_new: int, seed: int | None) -> None:
        """Lockstep runs: peak memory comes from untimed runs of ``chunk`` on their own
        (interleaved methods share the process's memory), the lowest of ``MEMORY_RUNS``,
        sampled every 2 ms (untimed: it may take the GIL that often)."""
        peaks = []
        for _ in range(MEMORY_RUNS):
            with PeakMemory(self.device, interval=0.002) as mem:
                self._generate_untimed(chunk, max_new, seed)
            peaks.append(mem.extra)
        self.result.peak_extra_mb = max(self.result.peak_extra_mb, min(peaks))

    def _generate_untimed(self, chunk: list[list[int]], max_new: int, seed: int | None) -> None:
        raise NotImplementedError


class HFMethod(_Method):
    """HF transformers ``generate`` with extra arguments (prompt lookup, assistant model, ...)."""

    family = "hf"

    def __init__(self, model, label: str, extra: dict, temperature: float, device):
        self.model, self.device = model, device
        self.result = MethodResult(label, "hf")
        # eos_token_id=None: generate exactly max_new tokens without suppressing eos (min_new_tokens
        # would mask the eos logit and change the greedy choice; LightSpec runs with ignore_eos)
        self.kwargs = dict(do_sample=temperature > 0, eos_token_id=None,
                           pad_token_id=model.generation_config.pad_token_id or 0, **extra)
        if temperature > 0:
            self.kwargs.update(temperature=temperature, top_k=0, top_p=1.0)

    def warm_up(self, chunk: list[list[int]], max_new: int) -> None:
        """An untimed run of the first prompt (HF methods run batch 1 only)."""
        warm = torch.tensor([chunk[0]], device=self.device)
        with torch.inference_mode():
            self.model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=max_new, **self.kwargs)

    def run(self, chunk: list[list[int]], max_new: int, seed: int | None, record: bool = True, pause=None) -> None:
        """Generate for ``chunk``.  ``pause``: called after every decoding step (lockstep
        runs time the method from outside); without it the run times itself."""
        res = self.result
        extra = {"streamer": _StepStreamer(pause)} if pause else {}
        with torch.inference_mode(), PeakMemory(self.device, enabled=pause is None) as mem:
            for p in chunk:  # HF assisted generation is batch-1 only: HF baselines run prompt by prompt
                ids = torch.tensor([p], device=self.device)
                _sync(self.device)
                t0 = time.perf_counter()
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                          **self.kwargs, **extra)
                _sync(self.device)
                if pause is None:
                    res.seconds += time.perf_counter() - t0
                new = out[0, len(p):].tolist()
                if record:
                    res.outputs.append(new)
                res.tokens += len(new)
        if pause is None:
            res.peak_extra_mb = max(res.peak_extra_mb, mem.extra)

    def _generate_untimed(self, chunk: list[list[int]], max_new: int, seed: int | None) -> None:
        with torch.inference_mode():
            for p in chunk:
                ids = torch.tensor([p], device=self.device)
                self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, **self.kwargs)

    def finish(self) -> None:
        pass


class _StepStreamer:
    """A ``generate`` streamer that only marks step boundaries: HF calls ``put`` once with
    the prompt and then once per decoding step (assisted or not)."""

    def __init__(self, pause):
        self.pause = pause

    def put(self, value) -> None:
        self.pause()

    def end(self) -> None:
        pass


class LightSpecMethod(_Method):
    """One LightSpec pipeline; its per-step statistics are collected while it runs."""

    family = "lightspec"

    def __init__(self, pipe, label: str, temperature: float):
        self.pipe, self.temperature = pipe, temperature
        self.device = pipe.device
        self.result = MethodResult(label, "lightspec")
        self.steps_log: list = []
        self.collect = lambda event: self.steps_log.append(event) if event.kind == "step" else None
        pipe.bound.sinks.append(self.collect)

    def warm_up(self, chunk: list[list[int]], max_new: int) -> None:
        """An untimed run of a workload's first batch, as the timed runs run it."""
        self.pipe.generate(chunk, max_new_tokens=max_new, ignore_eos=True, temperature=self.temperature)
        self.steps_log.clear()

    def run(self, chunk: list[list[int]], max_new: int, seed: int | None, record: bool = True, pause=None) -> None:
        """As ``HFMethod.run``; ``pause`` is called after every engine step."""
        res = self.result
        step_end = (lambda event: pause() if event.kind == "step" else None) if pause else None
        if step_end:
            self.pipe.bound.sinks.append(step_end)
        try:
            with PeakMemory(self.device, enabled=pause is None) as mem:
                _sync(self.device)
                t0 = time.perf_counter()
                outs = self.pipe.generate(chunk, max_new_tokens=max_new, ignore_eos=True, temperature=self.temperature,
                                          seed=seed)
                _sync(self.device)
                if pause is None:
                    res.seconds += time.perf_counter() - t0
        finally:
            if step_end:
                self.pipe.bound.sinks.remove(step_end)
        if pause is None:
            res.peak_extra_mb = max(res.peak_extra_mb, mem.extra)
        for o in outs:
            if record:
                res.outputs.append(o.token_ids)
            res.tokens += len(o.token_ids)
            s = o.stats
            res.steps += s.steps + 1  # +1: the token from the prefill
            res.drafted += s.drafted
            res.accepted += s.accepted
            for j, (d, a) in enumerate(zip(s.per_position_drafted, s.per_position_accepted)):
                while len(res.pos_drafted) <= j:
                    res.pos_drafted.append(0)
                    res.pos_accepted.append(0)
                res.pos_drafted[j] += d
                res.pos_accepted[j] += a

    def _generate_untimed(self, chunk: list[list[int]], max_new: int, seed: int | None) -> None:
        logged = len(self.steps_log)
        self.pipe.generate(chunk, max_new_tokens=max_new, ignore_eos=True, temperature=self.temperature, seed=seed)
        del self.steps_log[logged:]  # untimed steps do not count in the statistics

    def measure_overhead(self, chunks: list[list[list[int]]], max_new: int, seed: int | None) -> None:
        """Lockstep runs: the engine overhead (time outside model forwards per step) from one
        more run of every chunk with this method alone.  Interleaved, another method's
        forward runs between two of this method's steps and evicts its caches, so its
        Python takes longer than it does when it runs by itself, as a user runs it (the zoo
        target at batch 1: `ngram` 8.2% alone against 10.1% in lockstep)."""
        alone: list = []
        sink = lambda event: alone.append(event) if event.kind == "step" else None  # noqa: E731
        self.pipe.bound.sinks.append(sink)
        try:
            for chunk in chunks:
                self._generate_untimed(chunk, max_new, seed)
        finally:
            self.pipe.bound.sinks.remove(sink)
        self.result.overhead_alone_s += sum(e.overhead_s for e in alone)
        self.result.step_alone_s += sum(e.step_time_s for e in alone)
        self.result.bubble_alone_s += bubble_seconds(alone)

    def finish(self) -> None:
        self.result.overhead_s = sum(e.overhead_s for e in self.steps_log)
        self.result.step_s = sum(e.step_time_s for e in self.steps_log)
        self.result.bubble_s = bubble_seconds(self.steps_log)
        self.pipe.bound.sinks.remove(self.collect)
        self.result.step_events = self.steps_log


def bubble_seconds(steps) -> float:
    """Seconds of ``steps`` (step events) in which neither a drafter nor the target
    computed: the sum of ``bubble_ratio * step_time_s``.  Divided by the steps' total
    time it is their time-weighted bubble ratio (``MethodResult.to_dict``)."""
    return sum(e.bubble_ratio * e.step_time_s for e in steps)
