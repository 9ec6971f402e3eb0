"""The OpenAI-compatible HTTP server (FastAPI): routes, authentication, body limits.

    app = build_app(pipe, ServerConfig(batch_size=32))
    /v1/completions, /v1/chat/completions (``stream``: SSE chunks ending with ``data: [DONE]``),
    /v1/models, /health, /metrics (Prometheus), /dashboard (when lightspec_core.dashboard exists)

Requests are checked (``protocol``), tokenized here, and handed to the ``Scheduler``'s
worker thread; the event loop only waits on each request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import LightSpecError
from ..hookspecs import hookimpl
from ..limits import context_length
from ..plugins import get_registry
from .metrics import ServerMetrics
from .protocol import APIError, error_body, parse_json, parse_request
from .responses import DONE, FINISH, TextStream, chunk, full_response, new_id, usage
from .scheduler import Job, QueueFull, Scheduler

log = logging.getLogger("lightspec.server")

DISCONNECT_POLL_S = 0.5  # how often a plain (non-streaming) request checks that its client is still there
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}  # OpenAI's completions default; chat: until the context


@dataclass
class ServerConfig:
    """``batch_size``: rows decoding at once; ``max_queue``: requests waiting beyond them
    (429 when full); ``api_key``: required as ``Authorization: Bearer KEY`` on every route
    but /health when set; ``max_body_bytes``: larger bodies get 413; ``model_name``: the id
    clients send as ``model`` (default: the model folder's name); ``pipeline_options``:
    passed to every group's ``MTPPipeline`` (e.g. ``budget``); ``strategy_options``:
    ``{strategy: options}`` added for that strategy's pipelines only."""

    batch_size: int = 32
    max_queue: int = 256
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    model_name: str | None = None
    draft_model: object = None
    pipeline_options: dict | None = None
    strategy_options: dict | None = None


class _FeedSink:
    """The dashboard feed as a statistics sink of a pipeline."""

    name = "dashboard"

    def __init__(self, feed):
        self.feed = feed

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        self.feed.lightspec_on_stats(event)


class _Auth:
    """ASGI middleware: the API key on every HTTP route but /health (401 without it)."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        if given != f"Bearer {self.key}":
            what = "no API key was given" if not given else "the API key is wrong"
            resp = JSONResponse(error_body(401, f"{what}: send the header 'Authorization: Bearer <key>'",
                                           code="invalid_api_key"), status_code=401)
            return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def build_app(pipe, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving ``pipe``'s target model (each strategy and sampling setting
    gets its own pipeline on the same target and tokenizer)."""
    from ..pipeline import MTPPipeline

    cfg = config or ServerConfig()
    tokenizer, target = pipe.tokenizer, pipe.target
    model_name = cfg.model_name or Path(str(getattr(target, "name_or_path", "") or "lightspec")).name or "lightspec"
    context = context_length(target)
    vocab = pipe._vocab_size()
    default_strategy = pipe.strategy_name
    registered = set(get_registry().names("strategy"))
    # the default strategy is built again from what built it (a YAML file, a mapping, a name
    # with options), not from its name, which need not be registered
    default_source = pipe.strategy_source
    if default_source is None:  # an object: rebuilt by its name, its options would be lost
        raise LightSpecError(f"the server builds a pipeline per request group, so its default strategy must be a name, "
                             f"NAME:OPTION=VALUE,..., a mapping or a YAML file, not the object {default_strategy!r}")
    strategies = sorted(registered | {default_strategy})
    metrics = ServerMetrics()
    feed = _dashboard_feed()
    draft = cfg.draft_model if cfg.draft_model is not None else getattr(pipe, "draft_model_source", None)
    # each group's pipeline is configured as the served one (its budget, verifier, target
    # forward) unless the config says otherwise; objects hold one pipeline's state and are refused
    options = {**pipe.rebuild_options, **(cfg.pipeline_options or {})}
    for key in ("budget", "verifier"):
        if key in options and not isinstance(options[key], (str, dict)):
            raise LightSpecError(f"the server builds a pipeline per request group, so its {key} must be a name, "
                                 f"NAME:OPTION=VALUE,..., a mapping or a YAML file, not the object {options[key]!r}")

    def make_pipeline(strategy: str, sampling):
        sinks = [metrics.for_strategy(strategy)] + ([_FeedSink(feed)] if feed is not None else [])
        extra = {**options, **(cfg.strategy_options or {}).get(strategy, {})}
        source = default_source if strategy == default_strategy else strategy
        return MTPPipeline(target, tokenizer, strategy=source, draft_model=draft, sinks=sinks, **extra)

    scheduler = Scheduler(make_pipeline, cfg.batch_size, cfg.max_queue, metrics)

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)

    app = FastAPI(title="LightSpec", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.dashboard_feed = scheduler, metrics, feed
    app.add_middleware(_Auth, key=cfg.api_key)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += "; routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        return JSONResponse(error_body(422, str(exc)), status_code=422)

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": scheduler.active, "waiting": len(scheduler.waiting)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "lightspec",
                                            "strategies": strategies, "default_strategy": default_strategy,
                                            "max_model_len": context}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def generate(request: Request, kind: str):
        raw = await _read_body(request, cfg.max_body_bytes)
        req = parse_request(parse_json(raw), kind, vocab, context)
        if req.model not in (model_name, str(getattr(target, "name_or_path", model_name))):
            raise APIError(404, f"model {req.model!r} is not served here: use {model_name!r} (GET /v1/models)",
                           param="model", code="model_not_found")
        strategy = req.strategy or default_strategy
        if strategy not in strategies:
            raise APIError(422, f"strategy={strategy!r} is invalid: use one of {', '.join(strategies)}",
                           param="strategy", code="invalid_value")
        ids = _encode(tokenizer, req)
        room = (context - len(ids)) if context is not None else None
        if room is not None and room < 1:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this model's context is {context} tokens: "
                           f"shorten it", param="messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS[kind] if room is None else min(DEFAULT_MAX_TOKENS[kind], room)
        elif room is not None and max_tokens > room:
            raise APIError(400, f"max_tokens={max_tokens} with a prompt of {len(ids)} tokens exceeds this model's "
                           f"context of {context} tokens: use max_tokens <= {room}", param="max_tokens",
                           code="context_length_exceeded")
        loop = asyncio.get_running_loop()
        job = Job(ids, max_tokens, strategy, req.sampling, req.seed, req.stop, loop, asyncio.Queue(),
                  ignore_eos=req.ignore_eos)
        try:
            scheduler.submit(job)
        except QueueFull:
            raise APIError(429, f"the server is busy: {cfg.batch_size} requests decoding and {cfg.max_queue} "
                           f"waiting; retry later", code="queue_full") from None
        rid = new_id(kind)
        text = TextStream(tokenizer, req.stop)
        if req.stream:
            return StreamingResponse(_stream(job, kind, rid, model_name, text, len(ids), req.include_usage),
                                     media_type="text/event-stream")
        return await _collect(request, job, kind, rid, model_name, text, len(ids))

    async def _stream(job, kind, rid, model, text, prompt_tokens, include_usage):
        done = False
        try:
            if kind == "chat":
                yield chunk(kind, rid, model, "", None, role=True)
            while True:
                event = await job.events.get()
                if event[0] == "error":
                    done = True
                    yield f"data: {_json(error_body(event[1], event[2]))}\n\n"
                    yield DONE
                    return
                _, tokens, finish, summary = event
                delta = text.feed(tokens, finish is not None)
                if delta:
                    yield chunk(kind, rid, model, delta, None)
                if finish is not None or text.stopped:
                    done = finish is not None
                    yield chunk(kind, rid, model, None if kind == "chat" else "", FINISH.get(finish, "stop"))
                    if include_usage:
                        yield chunk(kind, rid, model, None, None,
                                    usage_=usage(prompt_tokens, job.generated, job.strategy, summary))
                    yield DONE
                    return
        finally:
            if not done:  # the client went away (or a stop string ended the text first)
                scheduler.cancel(job)

    async def _collect(request, job, kind, rid, model, text, prompt_tokens):
        out = []
        loop = asyncio.get_running_loop()
        next_check = loop.time() + DISCONNECT_POLL_S
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if loop.time() >= next_check:  # has the client gone away? (checked while tokens flow too)
                next_check = loop.time() + DISCONNECT_POLL_S
                if await request.is_disconnected():
                    scheduler.cancel(job)
                    return Response(status_code=499)
            if event is None:
                continue
            if event[0] == "error":
                raise APIError(event[1], event[2], code="server_error" if event[1] >= 500 else None)
            _, tokens, finish, summary = event
            out.append(text.feed(tokens, finish is not None))
            if finish is not None or text.stopped:
                if finish is None:
                    scheduler.cancel(job)
                return full_response(kind, rid, model, "".join(out), FINISH.get(finish, "stop"),
                                     usage(prompt_tokens, job.generated, job.strategy, summary))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    if feed is not None:
        from lightspec_core.dashboard import add_dashboard_routes

        add_dashboard_routes(app, feed)
    app.state.model_name, app.state.started = model_name, time.time()
    return app


def _dashboard_feed():
    """The dashboard's statistics feed, when ``lightspec_core.dashboard`` is installed."""
    try:
        from lightspec_core.dashboard import DashboardFeed
    except ImportError:
        return None
    return DashboardFeed()


def _json(obj) -> str:
    import json

    return json.dumps(obj)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is over ``limit`` bytes (declared or received)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body has {declared} bytes; the limit is {limit} bytes",
                       code="request_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise APIError(413, f"the request body is over the limit of {limit} bytes", code="request_too_large")
        parts.append(part)
    return b"".join(parts)


def _encode(tokenizer, req) -> list[int]:
    """The prompt's token ids; a chat goes through the tokenizer's chat template."""
    if req.kind == "completion":
        if isinstance(req.prompt, list):
            return req.prompt
        return list(tokenizer(req.prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions with a plain prompt",
                       param="messages", code="no_chat_template")
    try:
        ids = tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # a template that rejects these messages (e.g. roles out of order)
        raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages",
                       code="invalid_messages") from None
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
