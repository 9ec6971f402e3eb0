"""``lightspec bench``: LightSpec strategies against HF transformers, same prompts, one run.

Baselines (batch 1, as HF's assisted generation supports only batch 1): ``generate``
vanilla; ``prompt_lookup_num_tokens``; ``assistant_model`` (when a draft model is given);
``assistant_early_exit`` (when layerskip is measured).  They run on stock copies of the
target and draft, loaded by transformers alone (``HFModels``): the models LightSpec's
methods run on carry its CPU kernels on the CPU in float32, which make HF's ``generate``
faster too, so HF ``generate`` on LightSpec's target is a row of its own,
``hf_vanilla_lightspec_kernels``.  Every method runs each prompt
once after a warm-up, interleaved with the other methods prompt by prompt (see
``run_workload``); tokens/s is total new tokens over total wall time.  Greedy outputs
are compared token by token with HF vanilla.
"""

from __future__ import annotations

import json
import math
import os
import platform
import threading
import time
from dataclasses import dataclass, field

import click
import torch

from .errors import LightSpecError


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
            "round_tokens": self.round_tokens, "round_seconds": self.round_seconds,
        }


# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (then the normal's)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired_speedup(a: MethodResult, b: MethodResult) -> tuple[float, float, float] | None:
    """``a``'s speed relative to ``b``'s from their paired rounds: (geometric mean of the
    per-round ratios, and its 95% confidence interval from Student's t on their logs).

    In lockstep both methods ran every round's prompts at the same time, so a slow second
    of the shared machine hits both rounds alike and cancels in their ratio; what is left
    varies from round to round, and the interval says how far the mean can be trusted.
    A ratio whose interval holds 1 is not measurably different.  None with fewer than 2
    paired rounds (or rounds that did not produce the same tokens)."""
    n = len(a.round_seconds)
    if n < 2 or n != len(b.round_seconds) or a.round_tokens != b.round_tokens:
        return None
    logs = [math.log(tb / ta) for ta, tb in zip(a.round_seconds, b.round_seconds) if ta > 0 and tb > 0]
    return ratio_interval(logs) if len(logs) == n else None


def ratio_interval(logs: list[float]) -> tuple[float, float, float] | None:
    """From the logs of paired ratios: (geometric mean, its 95% confidence interval by
    Student's t), None with fewer than 2."""
    n = len(logs)
    if n < 2:
        return None
    mean, sd = _mean_sd(logs)
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) of two or more values."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def slower_p_value(logs: list[float]) -> float | None:
    """The one-sided p-value that a method is slower than its reference, from the logs of
    its paired speed ratios (``log(t_ref / t_method)`` per round, as ``paired_speedup``
    takes them): Student's t test of "mean log ratio >= 0" against "< 0".  Small means the
    rounds would rarely come out this slow if the method were not slower.  None with
    fewer than 2 logs; 0.5 when every round measured the same."""
    n = len(logs)
    if n < 2:
        return None
    mean, sd = _mean_sd(logs)
    if sd == 0:
        return 0.5 if mean == 0 else (0.0 if mean < 0 else 1.0)
    return _student_t_cdf(mean / (sd / math.sqrt(n)), n - 1)


def holm_rejected(p_values: dict[str, float], alpha: float = 0.05) -> list[str]:
    """The keys whose hypotheses Holm's step-down procedure rejects at family-wise error
    ``alpha``: sorted by p, the i-th smallest (from 0) is rejected while p <= alpha / (m - i).

    Why a family-wise test: a claim about many cells at once ("no strategy is slower on any
    workload") tested cell by cell at 5% each flags about one cell in twenty by chance
    alone, however equal the methods are (50 cells: ~2.5 two-sided, ~1.25 one-sided)."""
    ordered = sorted(p_values.items(), key=lambda kv: kv[1])
    m = len(ordered)
    out = []
    for i, (key, p) in enumerate(ordered):
        if p > alpha / (m - i):
            break
        out.append(key)
    return out


def _student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom, from the regularized
    incomplete beta function: P(|T| > |t|) = I_x(df/2, 1/2) with x = df / (df + t^2)."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t < 0 else 1.0 - tail


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1, by its continued
    fraction (modified Lentz), evaluated on the side of ``x`` where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


# lockstep runs measure peak memory this many times per method and workload and keep the
# lowest: the first run may include one-time allocations (measured: `none` at batch 8,
# 128 MB on its first run, 111 MB on its second)
MEMORY_RUNS = 2


class PeakMemory:
    """Peak memory in use above the level at start: on CUDA, PyTorch's peak allocated
    memory; on the CPU, the C heap's bytes in use (glibc's ``mallinfo2``: where PyTorch's
    CPU tensors live), sampled every ``interval`` seconds, or the resident set where that
    is not available.  In-use bytes, not the resident set: once an earlier run has grown the
    heap, a run that reuses it adds no resident memory however much it allocates (in
    lockstep every method's allocations grow it first, and each method's own run then
    measured +0.0 MB)."""

    def __init__(self, device: torch.device, enabled: bool = True, interval: float = 0.02):
        self.device = device
        self.enabled = enabled
        self.interval = interval  # 20 ms during a timed run: sampling more often steals the GIL from it
        self.extra = 0.0

    def __enter__(self):
        if not self.enabled:
            return self
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.base = self.peak = _cpu_memory()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, _cpu_memory())

    def __exit__(self, *exc):
        if not self.enabled:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.extra = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, _cpu_memory())
            self.extra = (self.peak - self.base) / 2**20


def _heap_in_use():
    """A function returning the C heap's bytes in use (glibc), or None elsewhere."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = MallInfo2

    def in_use() -> int:
        m = fn()
        return m.uordblks + m.hblkhd  # allocated chunks + mmap-ed blocks (large tensors)

    return in_use


_HEAP = _heap_in_use() if platform.system() == "Linux" else None


def _cpu_memory() -> int:
    return _HEAP() if _HEAP is not None else _rss()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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


def bubble_seconds(steps) -> float:
    """Seconds of ``steps`` (step events) in which neither a drafter nor the target
    computed: the sum of ``bubble_ratio * step_time_s``.  Divided by the steps' total
    time it is their time-weighted bubble ratio (``MethodResult.to_dict``)."""
    return sum(e.bubble_ratio * e.step_time_s for e in steps)


@dataclass
class HFModels:
    """The models HF's baselines run on: stock copies of the target and the draft, loaded
    by transformers alone, without LightSpec's CPU kernels (``load_model(...,
    cpu_layout=False)``).  ``kernels_row``: also time HF ``generate`` on LightSpec's own
    target (``hf_vanilla_lightspec_kernels``), when that target differs from stock."""

    target: object
    draft: object = None
    kernels_row: bool = False


KERNELS_ROW = "hf_vanilla_lightspec_kernels"  # HF generate on the target as LightSpec loaded it


def default_strategies(draft_model) -> list[str]:
    names = ["none", "ngram", "layerskip", "hybrid"]
    if draft_model:
        names.insert(2, "draft_model")
    from .plugins import get_registry

    builtin = set(names) | {"none", "ngram", "draft_model", "layerskip", "hybrid"}
    names += [n for n in get_registry().names("strategy") if n not in builtin]
    return names


def load_prompt_sets(prompts_file, suite, limit) -> dict[str, list[str]]:
    from .cli import read_prompts

    if suite:
        if suite != "default":
            raise LightSpecError(f"--suite {suite!r} is unknown; allowed: default")
        try:
            import lightspec_zoo
        except ImportError:
            raise LightSpecError("--suite default needs the lightspec-zoo package (its prompts ship there)") from None
        sets = lightspec_zoo.prompt_sets()
        return {k: v[:limit] if limit else v for k, v in sets.items()}
    if not prompts_file:
        raise LightSpecError("give --prompts FILE or --suite default")
    ps = read_prompts((), prompts_file)
    return {os.path.basename(prompts_file): ps[:limit] if limit else ps}


def _budget_specs(budgets) -> list[tuple[str, dict]]:
    """``--budget`` values as (label, spec mapping), each checked by building it once
    (before any model loads)."""
    from .component_spec import build_component, parse_spec, spec_label
    from .plugins import get_registry

    out = []
    for text in budgets:
        spec = parse_spec(text, "budget") if isinstance(text, str) else dict(text)
        build_component("budget", spec, get_registry(), default_type="dynamic", where="--budget")
        out.append((spec_label(text), spec))
    return out


def _methods(names, budgets: list[tuple[str, dict]]) -> list[tuple[str, str, dict | None]]:
    """(strategy, method label, budget spec) per method: each strategy under each budget,
    or under its own when none is given; ``none`` once (it never consults its budget)."""
    if not budgets:
        return [(name, name, None) for name in names]
    out = []
    for name in names:
        for label, spec in [(None, None)] if name == "none" else budgets:
            out.append((name, name if label is None else f"{name}[{label}]", None if spec is None else dict(spec)))
    return out


CONTROL = "none (control)"  # the label of the second `none` pipeline in batched runs
SUITE_CONFIGS = [(1, 0.0), (8, 0.0), (1, 0.8), (8, 0.8)]  # (batch size, temperature)


def main(model=None, strategies=(), draft_model=None, prompts_file=None, suite=None, limit=None, max_new_tokens=64,
         batch_size=1, temperature=0.0, hf_lookup_tokens=10, with_hf=True, device=None, dtype=None, json_out=None,
         md_out=None, lean_target=True, repeat=1, seed=None, batch_repeat=None, interleave="step", control=True,
         budgets=()):
    """``budgets``: budget specs (``component_spec``); each strategy but ``none`` (which
    never drafts) then runs once per budget, labelled ``strategy[budget]``."""
    import sys

    from .loading import cpu_kernels_apply, load_tokenizer
    from .pipeline import MTPPipeline, default_draft_path, default_model_path, load_model, resolve_device, resolve_dtype

    if batch_size < 1:
        raise LightSpecError(f"--batch-size {batch_size} is invalid: use an integer >= 1")
    if repeat < 1:
        raise LightSpecError(f"--repeat {repeat} is invalid: use an integer >= 1")
    if batch_repeat is not None and batch_repeat < 1:
        raise LightSpecError(f"--batch-repeat {batch_repeat} is invalid: use an integer >= 1")
    if max_new_tokens < 1:
        raise LightSpecError(f"--max-new-tokens {max_new_tokens} is invalid: use an integer >= 1")
    if interleave not in ("step", "batch"):
        raise LightSpecError(f"--interleave {interleave!r} is invalid; allowed: step, batch")
    budgets = _budget_specs(budgets)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if model is None:
        model = default_model_path()
        draft_model = draft_model or default_draft_path()
    if suite and limit is None:
        limit = 6
    configs = SUITE_CONFIGS if suite else [(batch_size, temperature)]
    # a batched suite run gets at least one full batch of prompts per workload
    widest = max(bs for bs, _ in configs)
    sets = load_prompt_sets(prompts_file, suite, max(limit, widest) if suite else limit)
    tok = load_tokenizer(model)
    target = load_model(model, dev, dt, progress=True)
    draft = load_model(draft_model, dev, dt, progress=True) if draft_model else None
    hf_models = None
    if with_hf and any(bs == 1 for bs, _ in configs) and cpu_kernels_apply(dev, dt):
        # LightSpec's target carries its CPU kernels here: HF's baselines get stock copies
        click.echo("loading stock copies for the HF baselines…", err=True)
        hf_models = HFModels(load_model(model, dev, dt, cpu_layout=False),
                             load_model(draft_model, dev, dt, cpu_layout=False) if draft_model else None,
                             kernels_row=True)
    names = list(strategies) or default_strategies(draft_model)
    pipes = {}
    for name, label, budget in _methods(names, budgets):
        try:
            pipes[label] = MTPPipeline(target, tok, strategy=name, draft_model=draft, lean_target=lean_target,
                                       budget=budget)
        except LightSpecError as exc:
            click.echo(f"skipping {label}: {exc}", err=True)
    # batched runs compare with LightSpec's own `none`; a second, identical `none` pipeline
    # measured beside it shows how far two identical methods differ on this machine
    control_pipe = None
    if control and "none" in pipes and any(bs > 1 for bs, _ in configs):
        control_pipe = MTPPipeline(target, tok, strategy="none", lean_target=lean_target)
    report = {"command": "lightspec bench", "command_line": "lightspec " + " ".join(sys.argv[1:]), "model": str(model),
              "draft_model": str(draft_model) if draft_model else None, "device": str(dev),
              "dtype": str(dt).replace("torch.", ""), "max_new_tokens": max_new_tokens, "repeat": repeat,
              "batch_repeat": batch_repeat or repeat, "seed": seed, "interleave": interleave, "machine": machine_info(dev),
              "budgets": [label for label, _ in budgets],
              "target_forward": {name: p.engine.target_forward for name, p in pipes.items()},
              "notes": bench_notes(with_hf, hf_models), "runs": []}
    greedy_ref: dict[str, list[list[int]]] = {}  # HF vanilla greedy outputs at batch 1, per workload
    for bs, temp in configs:
        run = {"batch_size": bs, "temperature": temp, "workloads": {}}
        for wname, prompts in sets.items():
            n = max(limit, bs) if suite and limit else len(prompts)
            ids = [tok(p)["input_ids"] for p in prompts[:n]]
            reps = batch_repeat if bs > 1 and batch_repeat else repeat
            run_pipes = {**pipes, CONTROL: control_pipe} if control_pipe is not None and bs > 1 else pipes
            results = run_workload(target, draft, run_pipes, ids, max_new_tokens, bs, temp, hf_lookup_tokens,
                                   with_hf, dev, f"{wname} b{bs} t{temp}", reps, seed, interleave, hf_models)
            vanilla = next((r for r in results if r.name == "hf_vanilla" and not r.error), None)
            if temp == 0 and bs == 1 and vanilla is not None:
                greedy_ref[wname] = vanilla.outputs
            if vanilla is None:  # batched runs compare with LightSpec's own plain decoding
                vanilla = next((r for r in results if r.name == "none" and not r.error), None)
            ref = greedy_ref.get(wname)
            if temp == 0 and ref is not None:
                for r in results:
                    if not r.error and r.name != "hf_vanilla":
                        pairs = list(zip(r.outputs, ref))  # the prompts that have an HF reference
                        r.identical, r.checked = sum(a == b for a, b in pairs), len(pairs)
            if vanilla is not None:
                for r in results:
                    ci = None if r is vanilla or r.error else paired_speedup(r, vanilla)
                    r.speedup_ci95 = ci[1:] if ci else None
            vt = vanilla.tokens_per_s if vanilla else None
            run["workloads"][wname] = {"prompts": len(ids), "baseline": vanilla.name if vanilla else None,
                                       "results": [r.to_dict(vt) for r in results]}
            click.echo(format_table(f"{wname}, batch {bs}, temperature {temp}", run["workloads"][wname], len(ids)))
        report["runs"].append(run)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
        click.echo(f"wrote {json_out}", err=True)
    if md_out:
        from .report import write_markdown

        write_markdown(report, md_out)
        click.echo(f"wrote {md_out}", err=True)
    return report


def bench_notes(with_hf: bool, hf_models: HFModels | None) -> list[str]:
    """What the report's HF rows are, in words (the JSON's ``notes``, the Markdown's list)."""
    if not with_hf:
        return []
    notes = ["HF baselines (hf_vanilla, hf_prompt_lookup, hf_assisted, hf_early_exit) run HF generate on "
             + ("stock copies of the target and draft, loaded by transformers alone (no LightSpec kernels)"
                if hf_models else "the target and draft as transformers loads them (LightSpec's CPU kernels "
                                  "apply only to float32 on the CPU)")]
    if hf_models and hf_models.kernels_row:
        notes.append(f"{KERNELS_ROW}: HF generate on the target as LightSpec loaded it, with its CPU kernels "
                     "(packed linears, kernel RMSNorm, CPU attention), the model the LightSpec rows run on; "
                     "speed-ups are against the stock hf_vanilla")
    return notes


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


def run_workload(target, draft, pipes, ids, max_new, bs, temp, hf_lookup_tokens, with_hf, dev, label, repeat=1,
                 seed=None, interleave="step", hf_models: HFModels | None = None):
    """Every method on one workload; HF baselines only at batch 1 (assisted generation is batch-1 only).

    HF's baselines run on ``hf_models`` (stock copies: ``HFModels``), or on ``target`` and
    ``draft`` themselves when it is None (where those are what transformers loaded).

    Methods are interleaved so that a change in machine speed during the run (the shared
    VM's forwards vary by 2x from one second to the next) hits all methods alike instead
    of whichever happened to run then:

    * ``interleave="step"`` (the default): every method runs the same batch of prompts at
      the same time, in lockstep: one decoding step of each method in turn (``Lane``),
      each timed on its own.  Peak memory then comes from extra, untimed runs of the
      first batch per method, alone, after the timed runs (the lower of two), and the
      engine overhead of LightSpec methods from one more run of every batch, alone
      (``overhead_fraction``; the lockstep runs' figure is kept as
      ``overhead_fraction_lockstep``: interleaving evicts each method's caches).
    * ``"batch"``: each batch of prompts is run by every method in turn before the next
      batch starts, each run timed from start to end.

    Either way the order changes from batch to batch: rotated every second batch and
    mirrored in between, so that over each pair of batches every method's positions add
    up to the same (later lanes of a lockstep round measured slower).  ``repeat`` runs every batch that
    many times (tokens/s over all of them; outputs kept from the first).  ``seed``: seed
    LightSpec's sampled runs (seeded requests use the budget's reproducible, timing-free
    policy); by default they are unseeded, as requests usually are."""
    from tqdm import tqdm

    if interleave not in ("step", "batch"):
        raise LightSpecError(f"interleave={interleave!r} is invalid; allowed: step, batch")
    methods: list = []
    if with_hf and bs == 1:
        hf_target, hf_draft = (hf_models.target, hf_models.draft) if hf_models else (target, draft)
        methods.append(HFMethod(hf_target, "hf_vanilla", {}, temp, dev))
        if hf_models and hf_models.kernels_row:
            methods.append(HFMethod(target, KERNELS_ROW, {}, temp, dev))
        methods.append(HFMethod(hf_target, f"hf_prompt_lookup({hf_lookup_tokens})", {"prompt_lookup_num_tokens": hf_lookup_tokens}, temp, dev))
        if hf_draft is not None:
            methods.append(HFMethod(hf_target, "hf_assisted", {"assistant_model": hf_draft}, temp, dev))
        if "layerskip" in pipes:
            L = getattr(pipes["layerskip"].strategy, "layers", None)
            L = L if isinstance(L, int) else max(1, hf_target.config.num_hidden_layers // 2)
            methods.append(HFMethod(hf_target, f"hf_early_exit({L})", {"assistant_early_exit": L}, temp, dev))
    methods += [LightSpecMethod(pipe, name, temp) for name, pipe in pipes.items()]
    failed: dict[str, str] = {}
    chunks = [ids[i:i + bs] for i in range(0, len(ids), bs)]
    with tqdm(total=len(methods) * len(ids) * repeat, desc=f"bench {label}", unit="prompt", leave=False) as bar:
        # every method first runs the first batch once, untimed, as the timed rounds run it:
        # a batch shape's one-time costs stay out of them.  The first batch-8 generation of
        # a process measured 610-1110 ms against ~500 for the next ones, and after a warm-up
        # of 8 new tokens the first timed round still 730 ms (its KV cache, sized for all
        # the new tokens, was a fresh allocation); the budget's calibration and one-token
        # probe at a batch size it never saw (~14 ms, once per process) also fall here
        for m in methods:
            try:
                m.warm_up(chunks[0], max_new)
            except Exception as exc:  # a method this model/transformers cannot run is reported, not fatal
                failed[m.result.name] = f"{type(exc).__name__}: {exc}"
        rounds = [(r, c, chunk) for r in range(repeat) for c, chunk in enumerate(chunks)]
        for i, (r, c, chunk) in enumerate(rounds):
            order = round_order(methods, i)
            chunk_seed = None if seed is None else seed + c * bs
            if interleave == "step":
                run_lockstep([m for m in order if m.result.name not in failed], chunk, max_new, chunk_seed, r == 0,
                             dev, failed)
                bar.update(len(chunk) * len(order))
                continue
            for m in order:
                if m.result.name not in failed:
                    res = m.result
                    before = (res.tokens, res.seconds)
                    try:
                        m.run(chunk, max_new, seed=chunk_seed, record=r == 0)
                    except Exception as exc:
                        failed[m.result.name] = f"{type(exc).__name__}: {exc}"
                    else:
                        res.round_tokens.append(res.tokens - before[0])
                        res.round_seconds.append(res.seconds - before[1])
                bar.update(len(chunk))
    if interleave == "step":
        # after the timed runs, as the batch mode measures during them: the allocator has
        # grown its heap by then, so no method is charged for growing it first
        for m in methods:
            if m.result.name not in failed:
                try:
                    m.measure_memory(chunks[0], max_new, seed)
                    if isinstance(m, LightSpecMethod):
                        m.measure_overhead(chunks, max_new, seed)
                except Exception as exc:
                    failed[m.result.name] = f"{type(exc).__name__}: {exc}"
    results = []
    for m in methods:
        m.finish()
        m.result.error = failed.get(m.result.name)
        results.append(m.result)
    return results


def format_table(wname: str, w: dict, n: int) -> str:
    from .report import speedup_text

    lines = [f"\n== {wname} ({n} prompts; speed-up vs {w['baseline']}) ==",
             f"{'method':<30}{'tok/s':>9}{'speed-up (95% CI)':>22}{'acc.len':>9}{'accept':>8}{'overhead':>10}{'bubble':>8}{'+mem MB':>9}{'identical':>11}  per-position acceptance"]
    for r in w["results"]:
        if r["error"]:
            lines.append(f"{r['name']:<30} error: {r['error'][:90]}")
            continue
        sp = speedup_text(r, "x")
        al = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        ac = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "-"
        ov = f"{r['overhead_fraction']:.1%}" if r["overhead_fraction"] is not None else "-"
        bu = f"{r['bubble_ratio']:.1%}" if r.get("bubble_ratio") is not None else "-"
        ident = "-" if r["identical_to_hf"] is None else f"{r['identical_to_hf']}/{r.get('identical_checked') or n}"
        pp = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"][:8])
        lines.append(f"{r['name']:<30}{r['tokens_per_s']:>9.1f}{sp:>22}{al:>9}{ac:>8}{ov:>10}{bu:>8}{r['peak_extra_mb']:>9.1f}{ident:>11}  {pp}")
    return "\n".join(lines)


def machine_info(dev: torch.device) -> dict:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    else:
        info["cpu"] = cpu_model_name()
        info["cpu_kernels"] = cpu_kernels_info()
    return info


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_kernels_info() -> str:
    """Whether LightSpec's CPU kernels run here: their instruction set, or why not."""
    from lightspec_kernels import cpu_linear

    return f"on ({cpu_linear.isa()})" if cpu_linear.available() else f"off ({cpu_linear.reason()})"
