"""The live dashboard's data side: ``DashboardFeed`` (a bounded, thread-safe window of
records with cursor snapshots) fed by a real generation, and its FastAPI routes served by
uvicorn on a loopback port.  The page itself is tested in a browser in
test_dashboard_browser.py."""

from __future__ import annotations

import json
import math
import sys
import threading
import urllib.request

import pytest
from dashboard_server import get, get_json, need_server_stack, serve_dashboard, tiny_pipeline
from lightspec_core.dashboard import DashboardFeed, add_dashboard_routes, compact

from lightspec_core import InvalidValueError, LightSpecError, RequestSummary, StepStats

PROMPTS = ["the cat the cat the cat", "one two three one two three"]


def step_event(step: int, drafted=(2,), accepted=(1,), **kw) -> StepStats:
    fields = dict(kind="step", step=step, row_ids=list(range(len(drafted))), step_time_s=0.01, device_time_s=None,
                  peak_memory_bytes=0, drafted=list(drafted), accepted=list(accepted),
                  emitted=[a + 1 for a in accepted], sources=["ngram"] * len(drafted),
                  confidence=[None] * len(drafted), entropy=[None] * len(drafted),
                  stage_s={"budget": 1e-5, "draft": 1e-4, "verify_forward": 5e-3, "verify": 1e-5, "commit": 1e-5},
                  target_forward_s=5e-3, draft_forward_s=1e-4, overhead_s=1e-4, verify_tokens=3,
                  budget_k=[2] * len(drafted), budget_reason="model", budget_estimates={"acceptance": 0.7})
    fields.update(kw)
    return StepStats(**fields)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_feed_records_a_real_generation_and_agrees_with_the_request_summaries():
    feed = DashboardFeed()
    pipe = tiny_pipeline(feed, k=3)
    results = pipe.generate(PROMPTS, max_new_tokens=12, ignore_eos=True)
    snap = feed.snapshot()
    json.dumps(snap, allow_nan=False)  # JSON-ready, as the route sends it
    steps = [e for e in snap["events"] if e["kind"] == "step"]
    requests = [e for e in snap["events"] if e["kind"] == "request"]
    assert [e["seq"] for e in snap["events"]] == list(range(1, len(snap["events"]) + 1))
    assert snap["cursor"] == len(snap["events"]) and not snap["reset"] and snap["dropped"] == 0
    assert len(requests) == len(PROMPTS)
    # the records carry what the charts draw, and add up to what generate() reports
    for r in results:
        rid = r.stats.request
        mine = [(s["drafted"][b], s["accepted"][b]) for s in steps for b, x in enumerate(s["row_ids"]) if x == rid]
        assert sum(d for d, _ in mine) == r.stats.drafted and sum(a for _, a in mine) == r.stats.accepted
    assert sum(sum(s["emitted"]) for s in steps) + len(PROMPTS) == sum(len(r.token_ids) for r in results)
    assert any(max(s["budget_k"]) == 3 for s in steps) and all(s["budget_reason"] for s in steps)
    assert any(s["drafted"] and max(s["drafted"]) > 0 and s["sources"][0] == "draft_model" for s in steps)
    assert all({"draft", "verify_forward"} <= set(s["stage_s"]) and s["step_time_s"] > 0 for s in steps)
    assert snap["totals"]["steps"] == len(steps) and snap["totals"]["requests"] == len(PROMPTS)
    assert snap["totals"]["accepted"] == sum(r.stats.accepted for r in results)
    assert {q["new_tokens"] for q in requests} == {12}


def test_snapshot_since_a_cursor_returns_only_newer_records():
    feed = DashboardFeed(clock=FakeClock())
    for i in range(3):
        feed.lightspec_on_stats(event=step_event(i + 1))
    first = feed.snapshot()
    assert first["cursor"] == 3 and [e["step"] for e in first["events"]] == [1, 2, 3]
    assert feed.snapshot(first["cursor"])["events"] == []
    feed.lightspec_on_stats(event=step_event(4))
    later = feed.snapshot(first["cursor"])
    assert [e["seq"] for e in later["events"]] == [4] and later["cursor"] == 4 and not later["reset"]


def test_window_is_bounded_and_a_slow_reader_is_told_what_it_missed():
    feed = DashboardFeed(window=5)
    for i in range(12):
        feed.lightspec_on_stats(event=step_event(i + 1))
    snap = feed.snapshot(2)
    assert [e["seq"] for e in snap["events"]] == [8, 9, 10, 11, 12]
    assert snap["dropped"] == 5 and snap["window"] == 5  # seq 3..7 left the window unread
    assert snap["totals"]["steps"] == 12  # totals count everything since the feed was made


def test_a_cursor_from_another_feed_resets_the_reader():
    feed = DashboardFeed()
    for i in range(2):
        feed.lightspec_on_stats(event=step_event(i + 1))
    snap = feed.snapshot(since=50)  # e.g. the server restarted under an open page
    assert snap["reset"] and [e["seq"] for e in snap["events"]] == [1, 2] and snap["dropped"] == 0


def test_records_are_timed_by_the_feed_clock_and_copied_from_the_event():
    clock = FakeClock()
    feed = DashboardFeed(clock=clock)
    event = step_event(1, drafted=(3, 1), accepted=(2, 0))
    clock.now += 2.5
    feed.lightspec_on_stats(event=event)
    event.drafted[0] = 99  # the engine may reuse its lists: the record keeps what it saw
    (rec,) = feed.snapshot()["events"]
    assert rec["t"] == 2.5 and rec["drafted"] == [3, 1] and rec["emitted"] == [3, 1]
    assert rec["budget_estimates"] == {"acceptance": 0.7} and rec["sources"] == ["ngram", "ngram"]


def test_request_records_and_unknown_kinds():
    feed = DashboardFeed()
    feed.lightspec_on_stats(event=RequestSummary(request=7, new_tokens=20, wall_time_s=0.5, steps=10,
                                                 failures=["propose: boom"]))

    class Other:
        kind = "heartbeat"

    feed.lightspec_on_stats(event=Other())  # kinds the dashboard does not draw are ignored
    (rec,) = feed.snapshot()["events"]
    assert rec["kind"] == "request" and rec["request"] == 7 and rec["tokens_per_s"] == 40.0 and rec["failures"] == 1


def test_non_finite_numbers_become_null_so_browsers_can_parse_the_json():
    rec = compact(step_event(1, bubble_ratio=math.nan, budget_estimates={"gain": math.inf, "beta": 0.5, "x": "s"},
                             stage_s={"draft": math.nan, "verify": 1e-3}), t=0.0)
    assert rec["bubble_ratio"] is None and rec["budget_estimates"] == {"beta": 0.5} and rec["stage_s"] == {"verify": 1e-3}
    json.dumps(rec, allow_nan=False)


def test_a_reader_and_a_writer_on_two_threads_see_every_record_once_in_order():
    feed = DashboardFeed(window=100_000)
    n = 3000

    def write():
        for i in range(n):
            feed.lightspec_on_stats(event=step_event(i + 1))

    writer = threading.Thread(target=write)
    writer.start()
    seen, cursor = [], 0
    while writer.is_alive() or cursor < n:
        snap = feed.snapshot(cursor)
        seen += [e["seq"] for e in snap["events"]]
        assert snap["dropped"] == 0 and (not snap["events"] or snap["events"][-1]["seq"] == snap["cursor"])
        cursor = snap["cursor"]
    writer.join()
    assert seen == list(range(1, n + 1))


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_bad_since_is_one_clear_error(bad):
    with pytest.raises(InvalidValueError, match=r"since=.* is invalid: use an integer >= 0"):
        DashboardFeed().snapshot(bad)


@pytest.mark.parametrize("bad", [0, -3, 2.0, "10", False])
def test_bad_window_is_one_clear_error(bad):
    with pytest.raises(InvalidValueError, match=r"window=.* is invalid: use an integer >= 1"):
        DashboardFeed(window=bad)


def test_routes_serve_the_page_the_data_and_the_vendored_assets():
    feed = DashboardFeed()
    for i in range(4):
        feed.lightspec_on_stats(event=step_event(i + 1))
    with serve_dashboard(feed) as base:
        status, ctype, body = get(base + "/dashboard")
        page = body.decode()
        assert status == 200 and ctype.startswith("text/html")
        assert '"url": "/dashboard/data"' in page and "LightSpecDashboard.live" in page
        for name in ("chart.umd.min.js", "chartjs-chart-matrix.min.js", "dashboard.js", "dashboard.css"):
            assert f"/dashboard/static/{name}" in page
            status, ctype, body = get(f"{base}/dashboard/static/{name}")
            assert status == 200 and len(body) > 1000 and ctype.split(";")[0] in ("text/javascript", "text/css")
        status, _, body = get(base + "/dashboard/static/chart.js.LICENSE.md")
        assert status == 200 and b"MIT License" in body
        status, snap = get_json(base + "/dashboard/data?since=2")
        assert status == 200 and [e["seq"] for e in snap["events"]] == [3, 4] and snap["cursor"] == 4
        status, err = get_json(base + "/dashboard/data?since=-1")
        assert status == 400 and "since=-1 is invalid" in err["error"]["message"]
        assert get(base + "/dashboard/data?since=abc")[0] == 422
        status, err = get_json(base + "/dashboard/static/nope.js")
        assert status == 404 and "'nope.js' does not exist" in err["error"]["message"]
        assert get(base + "/dashboard/static/..%2Fpage.py")[0] == 404
        assert get(base + "/dashboard/static/page.html")[0] == 404  # only the listed assets are served


def test_routes_under_another_prefix_and_with_the_servers_dependencies():
    need_server_stack()
    from fastapi import Depends, Header, HTTPException

    def api_key(authorization: str = Header(default="")):
        if authorization != "Bearer k":
            raise HTTPException(status_code=401, detail="no key")

    with serve_dashboard(DashboardFeed(), prefix="/ops/dash", dependencies=[Depends(api_key)]) as base:
        assert get(base + "/ops/dash/data")[0] == 401
        req = urllib.request.Request(base + "/ops/dash/data", headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["cursor"] == 0
        assert get(base + "/dashboard")[0] == 404


@pytest.mark.parametrize("kwargs,needle", [
    ({"prefix": "dashboard"}, "prefix='dashboard' is invalid"),
    ({"prefix": "/dashboard/"}, "prefix='/dashboard/' is invalid"),
    ({"interval_ms": 10}, "interval_ms=10 is invalid"),
])
def test_bad_route_options_are_one_clear_error(kwargs, needle):
    need_server_stack()
    from fastapi import FastAPI

    with pytest.raises(LightSpecError, match=needle):
        add_dashboard_routes(FastAPI(), DashboardFeed(), **kwargs)
    with pytest.raises(LightSpecError, match="feed=.* is invalid: use a lightspec_core.dashboard.DashboardFeed"):
        add_dashboard_routes(FastAPI(), object())


def test_without_fastapi_the_feed_works_and_the_routes_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the serve extra were not installed
    monkeypatch.setitem(sys.modules, "fastapi.responses", None)
    feed = DashboardFeed()
    feed.lightspec_on_stats(event=step_event(1))
    assert feed.snapshot()["cursor"] == 1
    with pytest.raises(LightSpecError, match=r"needs FastAPI: pip install 'lightspec-core\[serve\]'"):
        add_dashboard_routes(object(), feed)
