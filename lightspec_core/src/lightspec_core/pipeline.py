"""``MTPPipeline``: load a target (and optional draft), resolve a strategy once, generate.

    pipe = MTPPipeline.from_pretrained("org/name" or "path/to/model", strategy="hybrid")
    out = pipe.generate(["def add(a, b):"], max_new_tokens=64)
    out[0].text, out[0].stats.mean_accepted_length

A little over 400 lines: ``MTPPipeline`` is the user-facing API, and each of its arguments
is checked where it is taken.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from .arguments import (
    check_flag,
    check_max_new_tokens,
    check_prompt_ids,
    check_strategy_argument,
    eos_id_set,
    prompt_list,
    short,
    stop_list,
    token_id_list,
)
from .binding import bind
from .engine import Engine
from .engine_parts import length_groups
from .errors import InvalidTypeError, InvalidValueError, LightSpecError
from .limits import context_length
from .loading import (
    check_causal_lm,
    check_passed_model,
    check_vocabulary,
    cpu_kernels_apply,
    install_cpu_kernels,
    load_config,
    load_model,
    load_tokenizer,
)
from .plugins import get_registry
from .sampling import SamplingParams
from .stats import JsonlSink, LogSink, RequestSummary, SummaryCollector

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
    draft_model: Any  # a folder, a hub id, a model object, or None
    progress: bool = False
    cpu_kernels: bool | None = None  # as MTPPipeline's

    def load_draft_model(self):
        """The draft model: a passed object as it is (checked to be on the pipeline's
        device and in eval mode; its dtype may differ from the target's), or loaded like
        the target (``load_model``, with LightSpec's CPU kernels unless
        ``cpu_kernels=False``).  ``cpu_kernels=True`` installs them into a passed draft."""
        if isinstance(self.draft_model, torch.nn.Module):
            check_passed_model(self.draft_model, self.device, None, "draft model")
            if self.cpu_kernels:
                install_cpu_kernels(self.draft_model)
            return self.draft_model
        return load_model(self.draft_model, self.device, self.dtype, self.progress,
                          cpu_layout=self.cpu_kernels is not False)


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


def _check_cpu_kernels_flag(cpu_kernels) -> None:
    if not (cpu_kernels is None or isinstance(cpu_kernels, bool)):
        raise LightSpecError(f"cpu_kernels={cpu_kernels!r} is invalid: use None (auto), True or False")


class MTPPipeline:
    """A target model plus a resolved speculative-decoding strategy.

    ``MTPPipeline(target, tokenizer, ...)`` takes a model object and leaves it as it is:
    ``device`` / ``dtype`` (``None``: the model's own) must match where it is, and it must
    be in eval mode (``check_passed_model``: an error asks the caller to move it or call
    ``.eval()``).  ``cpu_kernels``: ``None`` or ``False`` leave it unchanged; ``True``
    installs LightSpec's CPU kernels into it (and into a passed draft model), in place:
    its Linear and RMSNorm modules are replaced and its attention implementation switched
    (``loading.install_cpu_kernels``; float32 on the CPU only).  A draft model given as a
    folder or hub id is loaded with the kernels unless ``cpu_kernels=False``.  The tokenizer must not be
    longer than the model's vocabulary (``check_vocabulary``)."""

    def __init__(self, target, tokenizer, strategy: str | Any = "hybrid", draft_model=None, device=None,
                 dtype=None, budget: str | dict | Any | None = None, verifier: str = "standard",
                 stats_out: str | None = None, log_interval_s: float | None = None, progress: bool = False,
                 lean_target: bool = True, cpu_kernels: bool | None = None, sinks: list | tuple | None = None,
                 **strategy_options):
        """``strategy``: a registered name (``lightspec strategies``), a name with options
        ``"NAME:OPTION=VALUE,..."`` (``"eagle3:max_draft=4"``), a mapping ``{"type": name,
        **options}`` (values of any type, e.g. a tree's ``choices``), a YAML strategy file or
        a strategy object; ``strategy_options`` (keywords) add options to a name or mapping.
        ``budget``: a policy name, ``"NAME:OPTION=VALUE,..."``, a YAML file, a mapping
        ``{"type": name, **options}`` or a policy object (default: the strategy file's
        budget, else ``dynamic``).  ``sinks``: statistics sinks to add, each a name,
        ``"NAME:OPTION=VALUE,..."``, a mapping or an object (after a strategy file's
        ``sinks:``); built ones are in ``self.sinks``."""
        from .component_spec import build_component
        from .strategy_files import build_strategy, is_strategy_file, load_strategy_file, strategy_spec

        reg = get_registry()
        check_strategy_argument(strategy, reg.names("strategy"))
        _check_cpu_kernels_flag(cpu_kernels)
        self.device, self.dtype = check_passed_model(target, device, dtype, "model")
        if cpu_kernels:
            install_cpu_kernels(target)
        check_vocabulary(target, tokenizer, f"model {getattr(target, 'name_or_path', '') or type(target).__name__!r}")
        self.target = target
        self.tokenizer = tokenizer
        self.draft_model_source = draft_model  # what the server gives each strategy it builds
        file_budget = file_sinks = None
        named = isinstance(strategy, (str, dict))
        spec = strategy_spec(strategy, strategy_options) if named and not is_strategy_file(strategy) else None
        # what builds this strategy again (the server builds one pipeline per group); None: an object
        self.strategy_source = (spec if strategy_options else strategy) if named else None
        if is_strategy_file(strategy):
            if strategy_options:
                raise InvalidValueError(f"strategy options ({', '.join(sorted(strategy_options))}) cannot be combined "
                                        f"with a strategy file ({strategy}); put them in the file")
            self.strategy, file_budget, file_sinks = load_strategy_file(strategy, reg)
            self.strategy_name = getattr(self.strategy, "name", Path(strategy).stem)
        elif isinstance(strategy, str):
            self.strategy = build_strategy(spec, reg, where=f"strategy {strategy!r}")
            self.strategy_name = strategy
        elif spec is not None:
            self.strategy = build_strategy(spec, reg, where="strategy")
            self.strategy_name = getattr(self.strategy, "name", None) or str(spec["type"])
        else:
            self.strategy = strategy
            self.strategy_name = getattr(strategy, "name", type(strategy).__name__)
        env = PipelineEnv(self.target, tokenizer, self.device, self.dtype, draft_model, progress, cpu_kernels)
        if hasattr(self.strategy, "setup"):
            self.strategy.setup(env)
        budget_arg, budget = budget, budget if budget is not None else (file_budget or "dynamic")
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
            raise InvalidTypeError(f"lean_target={lean_target!r} is invalid: use True or False")
        self.engine = Engine(self.target, tokenizer, self.bound, self.device, lean_target=lean_target)
        # with strategy_source: what builds this pipeline again (the server, per request group)
        self.rebuild_options = {"lean_target": lean_target, "verifier": verifier,
                                **({"budget": budget_arg} if budget_arg is not None else {})}
        gen_cfg = getattr(target, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])

    @classmethod
    def from_pretrained(cls, model_or_path=None, strategy: str = "hybrid", draft_model=None, device=None,
                        dtype=None, tokenizer=None, progress: bool = False, cpu_kernels: bool | None = None,
                        **kwargs) -> "MTPPipeline":
        """A pipeline on a target model given as a hub id (``org/name``), a local folder or
        an already built model (plus ``tokenizer``); ``None``: lightspec-zoo's target (and
        its draft).

        Names are resolved by transformers (``AutoModelForCausalLM.from_pretrained``,
        ``AutoTokenizer.from_pretrained``): a local folder, else the Hugging Face cache
        (``HF_HOME`` / ``HF_HUB_CACHE``), downloading what is missing unless
        ``HF_HUB_OFFLINE=1``.  ``draft_model`` may be any of the same.  ``device`` /
        ``dtype``: for loaded models, where to put them (default: CUDA in bfloat16 when
        available, else the CPU in float32); a passed model must already be there
        (``MTPPipeline``).  ``cpu_kernels``: ``None`` installs LightSpec's CPU kernels into
        the models the pipeline loads (CPU, float32), not into passed ones; ``True`` into
        passed ones too (changing them in place); ``False`` never.  ``progress``: report
        loading on stderr (transformers' progress bars).  Every load failure is one
        ``LightSpecError`` line (``loading``)."""
        from .strategy_files import check_strategy_spec

        _check_cpu_kernels_flag(cpu_kernels)
        check_strategy_argument(strategy, get_registry().names("strategy"))
        check_strategy_spec(strategy, get_registry())  # a misspelt name fails before the weights load
        if model_or_path is None:
            model_or_path = default_model_path()
            if draft_model is None:
                draft_model = default_draft_path()
        if isinstance(model_or_path, torch.nn.Module):
            if tokenizer is None:
                raise LightSpecError("a model object needs tokenizer=... too")
            return cls(model_or_path, tokenizer, strategy=strategy, draft_model=draft_model, device=device,
                       dtype=dtype, progress=progress, cpu_kernels=cpu_kernels, **kwargs)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        if cpu_kernels and not cpu_kernels_apply(dev, dt):
            raise LightSpecError(f"cpu_kernels=True needs the CPU in float32, not {dev} in "
                                 f"{str(dt).removeprefix('torch.')}: leave cpu_kernels unset")
        name = str(model_or_path)
        config = load_config(name, progress)
        check_causal_lm(config, name)
        if tokenizer is None:  # before the weights: a missing tokenizer should not wait for them
            tokenizer = load_tokenizer(name, progress)
        model = load_model(name, dev, dt, progress, cpu_layout=cpu_kernels is not False, config=config)
        # cpu_kernels passes on for the draft model; on this target it changes nothing more
        return cls(model, tokenizer, strategy=strategy, draft_model=draft_model, device=dev, dtype=dt,
                   progress=progress, cpu_kernels=cpu_kernels, **kwargs)

    # ------------------------------------------------------------------------------------

    def _vocab_size(self) -> int:
        """Rows of the target's lm_head: token ids must lie in ``[0, vocab)``."""
        head = self.target.get_output_embeddings()
        if head is not None and getattr(head, "weight", None) is not None:
            return int(head.weight.shape[0])
        return int(self.target.config.vocab_size)

    def _encode(self, prompts: list, vocab: int, context: int | None) -> list[list[int]]:
        """Token ids per prompt (a ``str`` is tokenized); refuses prompts that are no
        ``str`` or list of int token ids, empty ones, ids outside ``[0, vocab)`` and prompts
        longer than ``context``, naming the prompt's index (``arguments`` module)."""
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                ids, source = self.tokenizer(p, add_special_tokens=True)["input_ids"], "tokenizes to"
            else:
                ids, source = token_id_list(i, p), "has"
            check_prompt_ids(i, ids, vocab, context, source)
            out.append(ids)
        return out

    def generate(self, prompts, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, seed: int | list | None = None, stop=None,
                 stream: bool = False, ignore_eos: bool = False, eos_token_id: int | list[int] | None = None):
        """Generate continuations.

        ``prompts``: a string, a list of strings or a list of token-id lists (ints in
        ``[0, vocab)``, vocab = the target's lm_head rows).  Returns a ``GenerationResult``
        (for one string) or a list of them; with ``stream=True`` an iterator of text pieces
        (one string prompt) or of ``(index, text)`` pairs.

        ``max_new_tokens``: tokens to generate per prompt, 1 .. the model's context length
        (``limits.context_length``; any integer >= 1 when the config states none).  A
        prompt longer than the context length is refused before any work.
        ``temperature``/``top_p``/``top_k``/``min_p``/``seed``: see ``SamplingParams``
        (``seed`` may also be a list, one per prompt).
        ``stop``: a non-empty string or a list of them; a row stops once its text contains one.
        ``eos_token_id``: an id or a list of ids in ``[0, vocab)`` that end a row, replacing
        the model's own (its generation config's ``eos_token_id``, else the tokenizer's);
        ``[]`` means none.  ``ignore_eos=True``: no id ends a row, rows run to
        ``max_new_tokens`` or a stop string (cannot be combined with ``eos_token_id``).

        Bad arguments raise ``InvalidTypeError`` / ``InvalidValueError`` (``TypeError`` /
        ``ValueError`` subclasses of ``LightSpecError``) naming the value and what is allowed.
        """
        single = isinstance(prompts, str)
        plist = [prompts] if single else prompt_list(prompts)
        if not plist:
            raise InvalidValueError("prompts is empty: give at least one prompt")
        vocab, context = self._vocab_size(), context_length(self.target)
        max_new_tokens = check_max_new_tokens(max_new_tokens, context)
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(plist)
        if len(seeds) != len(plist):
            raise InvalidValueError(f"seed has {len(seeds)} values for {len(plist)} prompts: give one per prompt or one int")
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=None)
        seeds = [SamplingParams(seed=s).seed for s in seeds]
        stops = stop_list(stop)
        if check_flag("ignore_eos", ignore_eos) and eos_token_id is not None:
            raise InvalidValueError(f"eos_token_id={short(eos_token_id)} with ignore_eos=True: give one of them "
                                    "(ignore_eos=True means no id ends a row)")
        eos = set() if ignore_eos else self.eos_ids if eos_token_id is None else eos_id_set(eos_token_id, vocab)
        ids = self._encode(plist, vocab, context)
        it = self._run(ids, max_new_tokens, params, seeds, stops, eos)
        if stream:
            return self._stream(it, len(ids), single)
        return self._collect(it, single)

    def _run(self, ids, max_new, params, seeds, stops, eos):
        starts = {}
        for i, p in enumerate(ids):
            starts[i] = self.summary.start(i, len(p))
        t0 = time.perf_counter()
        generated: dict[int, list[int]] = {i: [] for i in range(len(ids))}

        # prompts of very different lengths run as separate batches (length_groups): each row's
        # KV slabs are as long as its batch's longest prompt
        for group in length_groups([len(p) for p in ids], min(max_new, 256) + 32):

            def on_prefill(n, seconds, group=group):
                for i in group:
                    starts[i].prefill_time_s = seconds

            for outputs in self.engine.run([ids[i] for i in group], [max_new] * len(group), params,
                                           [seeds[i] for i in group], stops, eos, on_prefill, requests=group):
                for o in outputs:
                    generated[o.request].extend(o.tokens)
                    if o.finish_reason:
                        s = starts[o.request]
                        s.new_tokens = len(generated[o.request])
                        s.finish_reason = o.finish_reason
                        s.wall_time_s = time.perf_counter() - t0
                        self.engine.emit(s)  # sinks hear about finished requests too
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

    def serve(self, port: int = 8080, batch_size: int = 32, host: str = "127.0.0.1", api_key: str | None = None,
              max_queue: int = 256, **options) -> None:
        """Serve this pipeline's model over an OpenAI-compatible HTTP API until interrupted
        (``lightspec_core.server.serve``; needs ``pip install lightspec-core[serve]``).
        ``batch_size``: requests decoded together (continuous batching); ``max_queue``:
        requests waiting beyond them (429 when full); ``api_key``: required as a bearer token
        when set.  Requests may pick another strategy (``"strategy"``, ``"none"`` = off)."""
        try:
            from .server import serve
        except ImportError as exc:
            raise LightSpecError(f"serving needs the serve extra ({exc.name} is missing): "
                                 "pip install 'lightspec-core[serve]'") from None
        serve(self, port=port, batch_size=batch_size, host=host, api_key=api_key, max_queue=max_queue, **options)

    def results_stats(self) -> list[RequestSummary]:
        return [self.summary.summaries[i] for i in sorted(self.summary.summaries)]

