"""The OpenAI request bodies the server takes, checked field by field (no model involved).

Every problem becomes one ``APIError`` (an HTTP status and an OpenAI-style error body
``{"error": {"message", "type", "param", "code"}}``) naming the bad value and what is
allowed.  Statuses: 400 a body that is not a JSON object (or a prompt the model cannot
take), 404 an unknown model, 413 a body over the size limit, 422 a field that is missing,
of the wrong type or out of range (an unknown strategy too).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..sampling import SEED_RANGE, SamplingParams

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    """An error answered as ``status`` with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


@dataclass
class GenerationRequest:
    """A checked completion or chat request (``prompt``: text or token ids; ``messages``: chat)."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | list[int] | None
    messages: list[dict] | None
    max_tokens: int | None
    strategy: str | None
    sampling: SamplingParams
    seed: int | None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or 400."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc}): send a JSON object",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body is a JSON {type(body).__name__}, not an object: send a JSON object",
                       code="invalid_json")
    return body


def _bad(param: str, value, allowed: str) -> APIError:
    shown = json.dumps(value) if not isinstance(value, str) or len(value) < 60 else json.dumps(value[:57] + "...")
    return APIError(422, f"{param}={shown} is invalid: use {allowed}", param=param, code="invalid_value")


def _int(body: dict, name: str, low: int, high: int | None, default):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, v, f"an integer in [{low}, {high if high is not None else 'inf'}]")
    if v < low or (high is not None and v > high):
        raise _bad(name, v, f"an integer in [{low}, {high if high is not None else 'inf'}]")
    return v


def _float(body: dict, name: str, ok, allowed: str, default: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise _bad(name, v, allowed)
    return float(v)


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not 1 <= len(v) <= 4 or not all(isinstance(s, str) and s for s in v):
        raise _bad("stop", v, "a non-empty string or a list of 1 to 4 non-empty strings")
    return list(v)


def _prompt(body: dict, vocab: int) -> str | list[int]:
    if "prompt" not in body:
        raise APIError(422, "prompt is missing: give a string or a list of token ids", param="prompt",
                       code="missing_field")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise _bad("prompt", p, "a non-empty string")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if not all(0 <= t < vocab for t in p):
            raise _bad("prompt", p, f"token ids in [0, {vocab})")
        return list(p)
    raise _bad("prompt", p, "one non-empty string or one non-empty list of token ids (one prompt per request)")


def _messages(body: dict) -> list[dict]:
    if "messages" not in body:
        raise APIError(422, "messages is missing: give a list of {role, content} objects", param="messages",
                       code="missing_field")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", msgs, "a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(where, m, "an object with a string role and a content")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
                       for c in content):
                raise _bad(f"{where}.content", content, "a string or a list of {type: 'text', text} parts")
            content = "".join(c["text"] for c in content)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", content, "a string or a list of {type: 'text', text} parts")
        out.append({"role": m["role"], "content": content})
    return out


def parse_request(body: dict, kind: str, vocab: int, context: int | None) -> GenerationRequest:
    """Check a /v1/completions (``kind="completion"``) or /v1/chat/completions body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        if "model" not in body:
            raise APIError(422, "model is missing: give the served model's id (GET /v1/models)", param="model",
                           code="missing_field")
        raise _bad("model", model, "the served model's id (GET /v1/models)")
    prompt = _prompt(body, vocab) if kind == "completion" else None
    messages = _messages(body) if kind == "chat" else None
    limit = context if context is not None else None
    key = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, 1, limit, None)
    n = _int(body, "n", 1, 1, 1)
    del n
    temperature = _float(body, "temperature", lambda v: 0 <= v <= 2, "a number in [0, 2] (0 = greedy)", 1.0)
    top_p = _float(body, "top_p", lambda v: 0 < v <= 1, "a number in (0, 1]", 1.0)
    top_k = _int(body, "top_k", -1, None, 0)
    min_p = _float(body, "min_p", lambda v: 0 <= v < 1, "a number in [0, 1)", 0.0)
    seed = _int(body, "seed", SEED_RANGE[0], SEED_RANGE[1] - 1, None)
    strategy = body.get("strategy")
    if strategy is not None and (not isinstance(strategy, str) or not strategy):
        raise _bad("strategy", strategy, "a strategy name (GET /v1/models lists them)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", stream, "true or false")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos", ignore_eos, "true or false")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options", opts, "an object such as {\"include_usage\": true}")
    include_usage = bool((opts or {}).get("include_usage", False))
    # temperature <= 1.92e-34 behaves as greedy (the sampler refuses smaller ones)
    sampling = SamplingParams(temperature=temperature if temperature > 1e-30 else 0.0, top_k=max(top_k, 0),
                              top_p=top_p, min_p=min_p)
    return GenerationRequest(kind, model, prompt, messages, max_tokens, strategy, sampling, seed, _stop(body),
                             stream, include_usage, ignore_eos)
