"""``MTPPipeline``: load a target (and optional draft), resolve a strategy once, generate.

    pipe = MTPPipeline.from_pretrained("path/to/model", strategy="hybrid")
    out = pipe.generate(["def add(a, b):"], max_new_tokens=64)
    out[0].text, out[0].stats.mean_accepted_length
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from .cpu_norm import use_cpu_norms
from .engine import BoundStrategy, Engine
from .errors import LightSpecError
from .hf_attention import use_cpu_attention
from .plugins import get_registry, new_plugin_manager
from .sampling import SamplingParams
from .stats import JsonlSink, LogSink, RequestSummary, SummaryCollector
from .weight_layout import use_cpu_layout

log = logging.getLogger("lightspec")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: RequestSummary


@dataclass
class PipelineEnv:
    """What components see in ``setup(env)``."""

    target: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    draft_model: Any  # a path, a model object, or None
    progress: bool = False

    def load_draft_model(self):
        if isinstance(self.draft_model, torch.nn.Module):
            return self.draft_model.to(self.device).eval()
        return load_model(self.draft_model, self.device, self.dtype, self.progress)


def resolve_device(device) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise LightSpecError(f"device={device!r} is invalid: use 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LightSpecError(f"device={device!r} is not available: no CUDA device found")
    return dev


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise LightSpecError(f"dtype={dtype!r} is invalid: use one of {', '.join(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def default_model_path() -> str:
    try:
        import lightspec_zoo
    except ImportError:
        raise LightSpecError(
            "no model given and the default model package lightspec-zoo is not installed: pass a model path"
        ) from None
    return str(lightspec_zoo.model_path(lightspec_zoo.DEFAULT_TARGET))


def default_draft_path() -> str | None:
    try:
        import lightspec_zoo

        return str(lightspec_zoo.model_path(lightspec_zoo.DEFAULT_DRAFT))
    except Exception:
        return None


def load_model(path, device: torch.device, dtype: torch.dtype, progress: bool = False, cpu_layout: bool = True):
    """Load a local HF causal LM folder in ``dtype`` on ``device``, in eval mode.

    ``cpu_layout``: on the CPU in float32, store its Linear weights column-major and
    packed for LightSpec's CPU kernel (``weight_layout.use_cpu_layout``), and run its
    attention through LightSpec's CPU attention kernel (``hf_attention``): the same
    values, 2-3x faster decode steps.  Every forward of the model (HF's included) then runs
    the same kernels.  Models passed in as objects are never changed."""
    from transformers import AutoModelForCausalLM

    if not Path(str(path)).exists():
        raise LightSpecError(f"model {str(path)!r} not found: give a local model folder (no downloads here)")
    if progress:
        log.info("loading %s", path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as exc:
        raise LightSpecError(f"cannot load model {str(path)!r}: {exc}") from None
    model = model.to(device).eval()
    if cpu_layout and device.type == "cpu" and dtype == torch.float32:
        use_cpu_layout(model)
        use_cpu_norms(model)
        use_cpu_attention(model)
    return model


def bind(name: str, strategy, verifier, budget, sinks: list) -> BoundStrategy:
    """Resolve the per-step hooks of the pipeline's components to plain callables."""
    pm = new_plugin_manager()
    objects = [strategy, verifier, budget, *sinks]
    for i, obj in enumerate(objects):
        pm.register(obj, name=f"{i}:{getattr(obj, 'name', type(obj).__name__)}")
    for plugin in get_registry().pm.get_plugins():  # global plugins may be stats sinks too
        if hasattr(plugin, "lightspec_on_stats") and pm.get_name(plugin) is None:
            pm.register(plugin)
    pm.check_pending()

    def first(hookname, owner):
        impl = getattr(owner, hookname, None)
        return impl

    on_stats = [impl.function for impl in reversed(pm.hook.lightspec_on_stats.get_hookimpls())]
    propose = first("lightspec_propose", strategy)
    verify = first("lightspec_verify", verifier)
    budget_fn = first("lightspec_budget", budget)
    if verify is None:
        raise LightSpecError(f"verifier {getattr(verifier, 'name', verifier)!r} does not implement lightspec_verify")
    if budget_fn is None:
        raise LightSpecError(f"budget policy {getattr(budget, 'name', budget)!r} does not implement lightspec_budget")
    return BoundStrategy(
        name=name,
        propose=propose,
        verify=verify,
        budget=budget_fn,
        sinks=on_stats,
        components=objects,
        hidden_layers=list(getattr(strategy, "hidden_layers", []) or []),
    )


class MTPPipeline:
    """A target model plus a resolved speculative-decoding strategy."""

    def __init__(self, target, tokenizer, strategy: str | Any = "hybrid", draft_model=None, device=None,
                 dtype=None, budget: str | dict | Any | None = None, verifier: str = "standard",
                 stats_out: str | None = None, log_interval_s: float | None = None, progress: bool = False,
                 lean_target: bool = True, sinks: list | tuple | None = None, **strategy_options):
        """``budget``: a policy name, ``"NAME:OPTION=VALUE,..."``, a YAML file, a mapping
        ``{"type": name, **options}`` or a policy object (default: the strategy file's
        budget, else ``dynamic``).  ``sinks``: statistics sinks to add, each a name,
        ``"NAME:OPTION=VALUE,..."``, a mapping or an object (after a strategy file's
        ``sinks:``); built ones are in ``self.sinks``."""
        from .component_spec import build_component
        from .composer import build_strategy, load_strategy_file

        reg = get_registry()
        self.device = resolve_device(device) if device is not None else next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype if dtype is None else resolve_dtype(dtype, self.device)
        self.target = target.to(self.device).eval()
        self.tokenizer = tokenizer
        file_budget = file_sinks = None
        if isinstance(strategy, str) and strategy.endswith((".yaml", ".yml")):
            if strategy_options:
                raise LightSpecError("strategy options cannot be combined with a strategy file; put them in the file")
            self.strategy, file_budget, file_sinks = load_strategy_file(strategy, reg)
            self.strategy_name = getattr(self.strategy, "name", Path(strategy).stem)
        elif isinstance(strategy, str):
            self.strategy = build_strategy({"type": strategy, **strategy_options}, reg, where=f"strategy {strategy!r}")
            self.strategy_name = strategy
        else:
            self.strategy = strategy
            self.strategy_name = getattr(strategy, "name", type(strategy).__name__)
        env = PipelineEnv(self.target, tokenizer, self.device, self.dtype, draft_model, progress)
        if hasattr(self.strategy, "setup"):
            self.strategy.setup(env)
        budget = budget if budget is not None else (file_budget or "dynamic")
        self.budget = build_component("budget", budget, reg, default_type="dynamic")
        if sinks is not None and not isinstance(sinks, (list, tuple)):
            raise LightSpecError(f"sinks={sinks!r} is invalid: use a list of sink names, mappings or objects")
        self.sinks = [build_component("sink", s, reg, where=f"{strategy}: sinks[{i}]") for i, s in enumerate(file_sinks or [])]
        self.sinks += [build_component("sink", s, reg, where=f"sinks[{i}]") for i, s in enumerate(sinks or [])]
        self.verifier = reg.create("verifier", verifier) if isinstance(verifier, str) else verifier
        self.summary = SummaryCollector()
        sinks = [self.summary, *self.sinks]
        self.jsonl = JsonlSink(stats_out) if stats_out else None
        if self.jsonl:
            sinks.append(self.jsonl)
        if log_interval_s:
            sinks.append(LogSink(log_interval_s))
        self.bound = bind(self.strategy_name, self.strategy, self.verifier, self.budget, sinks)
        if not isinstance(lean_target, bool):
            raise LightSpecError(f"lean_target={lean_target!r} is invalid: use True or False")
        self.engine = Engine(self.target, tokenizer, self.bound, self.device, lean_target=lean_target)
        gen_cfg = getattr(target, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])

    @classmethod
    def from_pretrained(cls, model_or_path=None, strategy: str = "hybrid", draft_model=None, device=None,
                        dtype=None, tokenizer=None, progress: bool = False, **kwargs) -> "MTPPipeline":
        """Load a target model (a local folder, or an already built model plus ``tokenizer``)."""
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        if model_or_path is None:
            model_or_path = default_model_path()
            if draft_model is None:
                draft_model = default_draft_path()
        if isinstance(model_or_path, torch.nn.Module):
            if tokenizer is None:
                raise LightSpecError("a model object needs tokenizer=... too")
            model = model_or_path.to(device=dev, dtype=dt).eval()
        else:
            model = load_model(model_or_path, dev, dt, progress)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(model_or_path))
        return cls(model, tokenizer, strategy=strategy, draft_model=draft_model, device=dev, dtype=dt,
                   progress=progress, **kwargs)

    # ------------------------------------------------------------------------------------

    def _encode(self, prompts) -> list[list[int]]:
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                ids = self.tokenizer(p, add_special_tokens=True)["input_ids"]
            elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
                ids = list(p)
            else:
                raise LightSpecError(f"prompt {i} is a {type(p).__name__}: use a string or a list of token ids")
            if not ids:
                raise LightSpecError(f"prompt {i} is empty after tokenization")
            out.append(ids)
        return out

    def generate(self, prompts, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, seed: int | list | None = None, stop=None,
                 stream: bool = False, ignore_eos: bool = False):
        """Generate continuations.

        ``prompts``: a string, a list of strings or a list of token-id lists.  Returns a
        ``GenerationResult`` (for one string) or a list of them; with ``stream=True`` an
        iterator of text pieces (one string prompt) or of ``(index, text)`` pairs.
        """
        single = isinstance(prompts, str)
        plist = [prompts] if single else list(prompts)
        if not plist:
            raise LightSpecError("prompts is empty: give at least one prompt")
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise LightSpecError(f"max_new_tokens={max_new_tokens!r} is invalid: use an integer >= 1")
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(plist)
        if len(seeds) != len(plist):
            raise LightSpecError(f"seed has {len(seeds)} values for {len(plist)} prompts: give one per prompt or one int")
        try:
            params = SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p), min_p=float(min_p), seed=None)
            for s in seeds:
                SamplingParams(seed=s)
        except ValueError as exc:
            raise LightSpecError(str(exc)) from None
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        ids = self._encode(plist)
        it = self._run(ids, max_new_tokens, params, seeds, stops, set() if ignore_eos else self.eos_ids)
        if stream:
            return self._stream(it, len(ids), single)
        return self._collect(it, single)

    def _run(self, ids, max_new, params, seeds, stops, eos):
        starts = {}
        for i, p in enumerate(ids):
            starts[i] = self.summary.start(i, len(p))
        t0 = time.perf_counter()
        generated: dict[int, list[int]] = {i: [] for i in range(len(ids))}

        def on_prefill(n, seconds):
            for s in starts.values():
                s.prefill_time_s = seconds

        for outputs in self.engine.run(ids, [max_new] * len(ids), params, seeds, stops, eos, on_prefill):
            for o in outputs:
                generated[o.request].extend(o.tokens)
                if o.finish_reason:
                    s = starts[o.request]
                    s.new_tokens = len(generated[o.request])
                    s.finish_reason = o.finish_reason
                    s.wall_time_s = time.perf_counter() - t0
                    for sink in self.bound.sinks:  # sinks hear about finished requests too
                        sink(event=s)
                yield o, generated[o.request]

    def _collect(self, it, single: bool):
        final: dict[int, list[int]] = {}
        for o, toks in it:
            final[o.request] = toks
        results = []
        for i in sorted(final):
            s = self.summary.summaries[i]
            text = self.tokenizer.decode(final[i], skip_special_tokens=True)
            results.append(GenerationResult(text=text, token_ids=final[i], finish_reason=s.finish_reason, stats=s))
        if self.jsonl:
            self.jsonl.fh.flush()
        return results[0] if single else results

    def _stream(self, it, n: int, single: bool) -> Iterator:
        sent = [""] * n
        for o, toks in it:
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            if not o.finish_reason and text.endswith("\ufffd"):
                continue  # wait for the rest of a multi-byte character
            delta = text[len(sent[o.request]):]
            if delta:
                sent[o.request] = text
                yield delta if single else (o.request, delta)

    def results_stats(self) -> list[RequestSummary]:
        return [self.summary.summaries[i] for i in sorted(self.summary.summaries)]
