"""OpenAI response bodies and stream chunks, and the incremental text of a request.

``TextStream`` turns a request's tokens into text deltas: it holds back an incomplete
multi-byte character and, while stop strings are set, the last characters that could be
the start of one, and cuts the text before the first stop string (OpenAI leaves the stop
string out of the output).
"""

from __future__ import annotations

import json
import time
import uuid

FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


class TextStream:
    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.sent = ""
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.stopped = False

    def feed(self, tokens: list[int], finished: bool) -> str:
        """The new text after ``tokens``; ``finished``: the request ended, release everything.
        Sets ``stopped`` when a stop string was reached (the text ends before it)."""
        self.ids.extend(tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, finished, self.stopped = text[:cut], True, True
        if not finished:
            if text.endswith("\ufffd"):
                return ""  # wait for the rest of a multi-byte character
            text = text[: len(text) - self.hold] if self.hold else text
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, strategy: str, summary) -> dict:
    """OpenAI's usage, plus ``speculation``: this request's drafting and acceptance."""
    spec = {"strategy": strategy, "steps": 0, "drafted": 0, "accepted": 0, "acceptance_rate": None,
            "mean_accepted_length": None, "per_position_acceptance": []}
    if summary is not None:
        spec.update(steps=summary.steps, drafted=summary.drafted, accepted=summary.accepted,
                    acceptance_rate=summary.acceptance_rate,
                    mean_accepted_length=summary.mean_accepted_length if summary.steps else None,
                    per_position_acceptance=summary.per_position_acceptance())
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "speculation": spec}


def full_response(kind: str, rid: str, model: str, text: str, finish: str, usage_: dict) -> dict:
    created = int(time.time())
    if kind == "chat":
        return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": finish}], "usage": usage_}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": usage_}


def chunk(kind: str, rid: str, model: str, text: str | None, finish: str | None, role: bool = False,
          usage_: dict | None = None) -> str:
    """One SSE event (``data: {...}``); ``usage_`` alone: the final usage chunk (no choices)."""
    created = int(time.time())
    if usage_ is not None:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_}
    elif kind == "chat":
        delta = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    else:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"
