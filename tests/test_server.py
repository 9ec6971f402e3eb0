"""The OpenAI-compatible server, through the official ``openai`` client (plain and
streaming, completions and chat) and raw HTTP, against a real uvicorn server on a free
loopback port serving a tiny model.  Every greedy answer is compared with the offline
greedy generation of the same prompt."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from helpers import TINY_VOCAB, cached_tiny, tiny_tokenizer
from lightspec_core.server import start_server
from models import build_model

from lightspec_core import MTPPipeline

TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} . {% endfor %}"
            "{% if add_generation_prompt %}assistant :{% endif %}")
PROMPTS = ["the cat is red and the dog is", "def x ( ) : return x + y", "one two three four one two three",
           "hello world hello world hello", "print ( x , y , z )", "a big blue fish in the green"]


def _tokenizer(chat: bool):
    tok = tiny_tokenizer()
    if chat:
        tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def served():
    model, _ = cached_tiny()
    tok = _tokenizer(chat=True)
    pipe = MTPPipeline(model, tok, strategy="ngram")
    handle = start_server(pipe, port=0, batch_size=4, max_queue=64, model_name="tiny")
    offline = MTPPipeline(model, tok, strategy="none")
    yield handle, offline, tok
    handle.stop()


def _client(url, key="unused"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def _greedy(offline, prompt, n, ignore_eos=False):
    return offline.generate(prompt, max_new_tokens=n, ignore_eos=ignore_eos).text


def test_completion_plain_and_streaming_equal_offline_greedy(served):
    handle, offline, _ = served
    c = _client(handle.url)
    r = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert r.choices[0].text == _greedy(offline, PROMPTS[0], 12)
    assert r.usage.prompt_tokens == len(offline.tokenizer(PROMPTS[0])["input_ids"])
    spec = r.usage.model_extra["speculation"]
    assert spec["strategy"] == "ngram" and spec["steps"] >= 1
    pieces = [ch.choices[0].text for ch in c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                                                 temperature=0, stream=True)]
    assert "".join(pieces) == r.choices[0].text and len([p for p in pieces if p]) > 1


def test_chat_plain_and_streaming_use_the_chat_template(served):
    handle, offline, tok = served
    c = _client(handle.url)
    messages = [{"role": "user", "content": "hello world"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    want = offline.tokenizer.decode(offline.generate([ids], max_new_tokens=10)[0].token_ids, skip_special_tokens=True)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    stream = c.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and chunks[-1].choices == []


def test_sse_ends_with_done(served):
    handle, _, _ = served
    with httpx.stream("POST", handle.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPTS[1],
                                                                      "max_tokens": 5, "stream": True}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln]
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def test_strategy_override_and_speculation_off(served):
    handle, offline, _ = served
    c = _client(handle.url)
    for strategy in ("none", "layerskip", "ngram"):
        r = c.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=14, temperature=0,
                                 extra_body={"strategy": strategy, "ignore_eos": True})
        assert r.choices[0].text == _greedy(offline, PROMPTS[2], 14, ignore_eos=True), strategy
        spec = r.usage.model_extra["speculation"]
        assert spec["strategy"] == strategy and r.usage.completion_tokens == 14
        if strategy == "none":
            assert spec["drafted"] == 0


def test_continuous_batching_keeps_every_request_greedy(served):
    """More requests than batch rows, of different lengths and strategies, at once: rows
    join and leave the running batch between steps; each answer equals offline greedy."""
    handle, offline, _ = served
    c = _client(handle.url)
    jobs = [(PROMPTS[i % len(PROMPTS)], 4 + 3 * i, ("ngram", "none", "layerskip")[i % 3]) for i in range(10)]
    got = {}

    def one(i, prompt, n, strategy):
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                 extra_body={"strategy": strategy, "ignore_eos": True})
        got[i] = r.choices[0].text

    threads = [threading.Thread(target=one, args=(i, *j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (prompt, n, _) in enumerate(jobs):
        assert got[i] == _greedy(offline, prompt, n, ignore_eos=True), i


def test_stop_string_is_cut_and_seeded_sampling_repeats(served):
    handle, offline, _ = served
    c = _client(handle.url)
    full = _greedy(offline, PROMPTS[3], 16, ignore_eos=True)
    word = full.split()[3]
    r = c.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=16, temperature=0, stop=[word],
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == full[: full.index(word)] and r.choices[0].finish_reason == "stop"
    a, b = (c.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=10, temperature=0.9, top_p=0.9,
                                 seed=7, extra_body={"top_k": 20}).choices[0].text for _ in range(2))
    assert a == b


@pytest.mark.parametrize("strategy", ["none", "ngram"])
def test_seeded_sampling_equals_offline_seeded_generation(served, strategy):
    handle, _, tok = served
    model, _ = cached_tiny()
    offline = MTPPipeline(model, tok, strategy=strategy)
    c = _client(handle.url)
    for seed in (1, 2, 3):
        r = c.completions.create(model="tiny", prompt=PROMPTS[seed], max_tokens=12, temperature=0.8, top_p=0.9,
                                 seed=seed, extra_body={"strategy": strategy, "ignore_eos": True})
        want = offline.generate(PROMPTS[seed], max_new_tokens=12, temperature=0.8, top_p=0.9, seed=seed,
                                ignore_eos=True).text
        assert r.choices[0].text == want, seed


def test_models_health_and_metrics(served):
    handle, _, _ = served
    models = _client(handle.url).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(handle.url + "/health").json()["status"] == "ok"
    _client(handle.url).completions.create(model="tiny", prompt=PROMPTS[5], max_tokens=6, temperature=0)
    text = httpx.get(handle.url + "/metrics").text
    for name in ("lightspec:spec_decode_num_draft_tokens_total", "lightspec:spec_decode_num_accepted_tokens_total",
                 "lightspec:num_requests_waiting", "lightspec:num_requests_running",
                 "lightspec:step_latency_seconds_bucket", "lightspec:step_bubble_ratio_bucket",
                 "lightspec:budget_chosen_k_bucket", "lightspec:generation_tokens_per_second",
                 "lightspec:spec_decode_mean_accepted_length", "lightspec:time_to_first_token_seconds_bucket",
                 "lightspec:e2e_request_latency_seconds_bucket"):
        assert name in text, name


BAD = [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    (json.dumps({"prompt": "the cat"}).encode(), 422, "missing_field", "model"),
    (json.dumps({"model": "tiny"}).encode(), 422, "missing_field", "prompt"),
    (json.dumps({"model": "tiny", "prompt": 5}).encode(), 422, "invalid_value", "prompt"),
    (json.dumps({"model": "tiny", "prompt": "the", "max_tokens": -3}).encode(), 422, "invalid_value", "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "the", "max_tokens": "9"}).encode(), 422, "invalid_value", "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "the", "max_tokens": 10**9}).encode(), 422, "invalid_value", "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "the", "temperature": "hot"}).encode(), 422, "invalid_value",
     "temperature"),
    (json.dumps({"model": "tiny", "prompt": "the", "stream": "yes"}).encode(), 422, "invalid_value", "stream"),
    (json.dumps({"model": "other", "prompt": "the"}).encode(), 404, "model_not_found", "model"),
    (json.dumps({"model": "tiny", "prompt": "the", "strategy": "warp"}).encode(), 422, "invalid_value", "strategy"),
    (json.dumps({"model": "tiny", "prompt": "the " * 3000}).encode(), 400, "context_length_exceeded", "prompt"),
    (json.dumps({"model": "tiny", "prompt": "the", "max_tokens": 2048}).encode(), 400, "context_length_exceeded",
     "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "x" * (2 << 20)}).encode(), 413, "request_too_large", None),
]


@pytest.mark.parametrize("body,status,code,param", BAD, ids=[f"{b[:24]!r}-{s}" for b, s, _, _ in BAD])
def test_bad_requests_get_openai_style_errors(served, body, status, code, param):
    handle, _, _ = served
    r = httpx.post(handle.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["param"] == param
    assert err["message"]
    assert httpx.get(handle.url + "/health").json()["status"] == "ok"  # nothing crashed


def test_chat_errors_and_unknown_route(served):
    handle, _, _ = served
    r = httpx.post(handle.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "messages[0].content"
    r = httpx.get(handle.url + "/v1/nothing")
    assert r.status_code == 404 and "routes" in r.json()["error"]["message"]


# -- a second server: one row, one waiting place, an API key, no chat template ------------------


@pytest.fixture(scope="module")
def small():
    # a long context: a request that is not cancelled runs for many seconds
    model = build_model("llama", layers=2, vocab_size=TINY_VOCAB, max_position_embeddings=LONG)
    pipe = MTPPipeline(model, _tokenizer(chat=False), strategy="ngram")
    handle = start_server(pipe, port=0, batch_size=1, max_queue=1, model_name="tiny", api_key="sesame")
    yield handle
    handle.stop()


AUTH = {"Authorization": "Bearer sesame"}
LONG = 16384


def _health(url):
    return httpx.get(url + "/health").json()


def _wait(cond, what, limit=60.0):
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_api_key_is_required_but_not_for_health(small):
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": 2}
    assert httpx.post(small.url + "/v1/completions", json=body).status_code == 401
    r = httpx.post(small.url + "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(small.url + "/v1/completions", json=body, headers=AUTH).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        _client(small.url, "wrong").models.list()
    assert _client(small.url, "sesame").models.list().data[0].id == "tiny"
    assert httpx.get(small.url + "/health").status_code == 200


def test_no_chat_template_is_a_clear_error(small):
    r = httpx.post(small.url + "/v1/chat/completions", headers=AUTH,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"


def _long_stream(url, n=LONG - 16):
    return httpx.stream("POST", url + "/v1/completions", headers=AUTH, timeout=60,
                        json={"model": "tiny", "prompt": "the cat", "max_tokens": n, "stream": True,
                              "ignore_eos": True, "strategy": "none"})


def _metric(url, name) -> float:
    text = httpx.get(url + "/metrics", headers=AUTH).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))


def test_full_queue_gets_429_and_a_disconnect_frees_the_slot(small):
    before = _metric(small.url, "lightspec:request_cancelled_total")
    with _long_stream(small.url) as resp:  # takes the only row
        lines = resp.iter_lines()
        next(ln for ln in lines if ln.startswith("data: "))
        waiting = threading.Thread(target=lambda: httpx.post(
            small.url + "/v1/completions", headers=AUTH, timeout=60,
            json={"model": "tiny", "prompt": "the dog", "max_tokens": 3}))
        waiting.start()  # takes the only waiting place
        _wait(lambda: _health(small.url)["waiting"] == 1, "the second request to wait")
        r = httpx.post(small.url + "/v1/completions", headers=AUTH, json={"model": "tiny", "prompt": "a", "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    # the client closed its stream: its row leaves at the next step, the waiting request runs
    waiting.join(timeout=60)
    _wait(lambda: _health(small.url)["running"] == 0 and _health(small.url)["waiting"] == 0, "the slot to be freed")
    assert _metric(small.url, "lightspec:request_cancelled_total") == before + 1  # the long request left early
    r = httpx.post(small.url + "/v1/completions", headers=AUTH, json={"model": "tiny", "prompt": "a", "max_tokens": 2})
    assert r.status_code == 200


def test_a_plain_request_whose_client_leaves_frees_its_slot(small):
    before = _metric(small.url, "lightspec:request_cancelled_total")
    body = {"model": "tiny", "prompt": "the cat", "max_tokens": LONG - 16, "ignore_eos": True, "strategy": "none"}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(small.url + "/v1/completions", headers=AUTH, json=body, timeout=httpx.Timeout(60, read=1.0))
    _wait(lambda: _metric(small.url, "lightspec:request_cancelled_total") == before + 1, "the row to be dropped")
    _wait(lambda: _health(small.url)["running"] == 0, "the slot to be freed")


def test_server_serves_the_live_dashboard_fed_by_its_own_requests(served):
    """The server mounts lightspec_core.dashboard: the page, and data whose step events come from its requests."""
    handle, _, _ = served
    page = httpx.get(handle.url + "/dashboard", timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    before = httpx.get(handle.url + "/dashboard/data", timeout=30).json()
    _client(handle.url).completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0)
    after = httpx.get(handle.url + "/dashboard/data", params={"since": before["cursor"]}, timeout=30).json()
    assert after["cursor"] > before["cursor"]
    assert any(e.get("kind") == "step" for e in after["events"])
