"""A failure inside one group's engine step fails that group's requests only (500), and
the group gets a fresh pipeline; requests of other strategies finish with exact output."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import cached_tiny, tiny_tokenizer
from lightspec_core.plugins import get_registry
from lightspec_core.server import start_server

from lightspec_core import MTPPipeline, hookimpl


class BrokenHints:
    """Raises outside the engine's guarded hooks: its cost hints fail in the step's preparation."""

    name = "broken_hints"
    built = 0

    def __init__(self):
        BrokenHints.built += 1

    def draft_cost_hints(self):
        raise RuntimeError("broken_hints: cost hints fail")

    @hookimpl
    def lightspec_propose(self, ctx):
        return None


class _Plugin:
    @hookimpl
    def lightspec_register_strategies(self, register):
        register("broken_hints", BrokenHints, description="test only: fails inside the engine step")


@pytest.fixture
def server():
    reg = get_registry()
    plugin = _Plugin()
    reg.add_plugin(plugin, name="test_server_faults", distribution="tests")
    model, _ = cached_tiny()
    pipe = MTPPipeline(model, tiny_tokenizer(), strategy="ngram")
    handle = start_server(pipe, port=0, batch_size=4, model_name="tiny")
    yield handle, MTPPipeline(model, tiny_tokenizer(), strategy="none")
    handle.stop()
    reg.pm.unregister(plugin)
    reg.plugins.pop("test_server_faults", None)
    reg.components.pop(("strategy", "broken_hints"), None)


def test_a_failing_group_fails_only_its_own_requests(server):
    handle, offline = server
    body = {"model": "tiny", "prompt": "the cat is red", "max_tokens": 300, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text = ""
    with httpx.stream("POST", handle.url + "/v1/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: "))
        text += json.loads(first[6:])["choices"][0]["text"]
        built = BrokenHints.built
        for _ in range(2):  # while the stream's row is decoding in its own group
            r = httpx.post(handle.url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": "one two", "max_tokens": 20, "strategy": "broken_hints"})
            assert r.status_code == 500
            err = r.json()["error"]
            assert err["type"] == "server_error" and "cost hints fail" in err["message"]
        assert BrokenHints.built == built + 2  # a fresh pipeline after the failure
        rest = [ln for ln in lines if ln]
    for ln in rest[:-1]:
        text += json.loads(ln[6:])["choices"][0]["text"]
    assert rest[-1] == "data: [DONE]"
    assert text == offline.generate("the cat is red", max_new_tokens=300, ignore_eos=True).text
    assert httpx.get(handle.url + "/health").json() == {"status": "ok", "running": 0, "waiting": 0}
