"""The dashboard and report pages in a real headless browser (Debian's chromium driven by
Selenium): the page loads, every chart draws real data (the chart objects hold the series
computed here from the same records, and the canvas has the series' colours where the
chart put its points, bars and cells), nothing is logged to the console at error level,
and a screenshot is saved (in pytest's tmp dir and, when LIGHTSPEC_ARTIFACTS is set,
there).

Skipped, with the reason, when no chromium / chromedriver / selenium is found, except in
CI (CI=true), where that is a failure: ``.ci/run`` installs them (scripts/dev.sh)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from dashboard_server import serve_dashboard, tiny_pipeline
from helpers import cached_tiny
from lightspec_core.dashboard import DashboardFeed, read_stats, write_report

from lightspec_core import MTPPipeline

CHARTS = ("heatmap", "budget", "position", "latency", "throughput")


def _find(names: tuple[str, ...]) -> str | None:
    for n in names:
        found = shutil.which(n) or (n if os.path.isabs(n) and os.access(n, os.X_OK) else None)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    chromium = _find((os.environ.get("LIGHTSPEC_CHROMIUM", ""), "chromium", "/usr/bin/chromium", "chromium-browser",
                      "google-chrome"))
    driver_bin = _find((os.environ.get("LIGHTSPEC_CHROMEDRIVER", ""), "chromedriver", "/usr/bin/chromedriver"))
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    missing = [what for what, ok in (("chromium", chromium), ("chromedriver", driver_bin), ("selenium", webdriver))
               if not ok]
    if missing:
        reason = (f"browser tests need {', '.join(missing)} (apt-get install chromium chromium-driver; "
                  "pip install selenium; scripts/dev.sh setup installs them)")
        if os.environ.get("CI") == "true":
            pytest.fail("CI: " + reason)
        pytest.skip(reason)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1200", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(driver_bin))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def save_screenshot(driver, tmp_path: Path, name: str) -> Path:
    """The page as a PNG in ``tmp_path`` and, when LIGHTSPEC_ARTIFACTS is set, there too."""
    # the whole page: a viewport as tall as the document (the charts redraw on resize)
    height = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]["height"]
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1400, "height": int(height) + 1, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(0.3)
    path = tmp_path / name
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert path.stat().st_size > 20_000, "the screenshot is (nearly) empty"
    artefacts = os.environ.get("LIGHTSPEC_ARTIFACTS")
    if artefacts:
        os.makedirs(artefacts, exist_ok=True)
        shutil.copy(path, os.path.join(artefacts, name))
    return path


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def wait_for(driver, script: str, timeout: float = 30.0):
    """Poll ``script`` (a JS expression) until it is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script("try { return (" + script + "); } catch (e) { return null; }")
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {script}; console: {driver.get_log('browser')}")
        time.sleep(0.1)


# For every chart: sample up to 60 of its drawn elements (matrix cells, bars, line points
# with a value > 0) and read the canvas pixel under each: drawn when it is painted in the
# colour of one of the chart's series (series may cover each other where they meet, e.g.
# the mean and the most k of a step).  Also the chart's series as plain data.
CHECK_CHARTS = """
var d = LightSpecDashboard.instances[0], out = {};
var probe = document.createElement('canvas').getContext('2d', {willReadFrequently: true});
function rgb(color) { probe.clearRect(0, 0, 1, 1); probe.fillStyle = color; probe.fillRect(0, 0, 1, 1);
  var p = probe.getImageData(0, 0, 1, 1).data; return [p[0], p[1], p[2]]; }
for (var name in d.charts) {
  var ch = d.charts[name], dpr = ch.currentDevicePixelRatio || 1;
  var img = ch.canvas.getContext('2d').getImageData(0, 0, ch.canvas.width, ch.canvas.height);
  var els = [], colors = [];
  ch.data.datasets.forEach(function (ds, i) {
    var meta = ch.getDatasetMeta(i);
    meta.data.forEach(function (el, j) {
      colors.push(rgb(el.options.backgroundColor));
      var raw = ds.data[j], v = raw !== null && typeof raw === 'object' ? raw.y : raw;
      if (v === null || v === undefined || el.skip || (meta.type !== 'matrix' && !(v > 0))) return;
      els.push(el);
    });
  });
  var step = Math.max(1, Math.floor(els.length / 60)), sampled = 0, drawn = 0;
  for (var k = 0; k < els.length; k += step) {
    var el = els[k], x = Math.round(el.x * dpr), y = Math.round(el.y * dpr);
    if (el.width !== undefined && el.height !== undefined && ch.config.type === 'matrix') {
      x = Math.round((el.x + el.width / 2) * dpr); y = Math.round((el.y + el.height / 2) * dpr);
    }
    var at = (y * img.width + x) * 4;
    var px = [img.data[at], img.data[at + 1], img.data[at + 2], img.data[at + 3]];
    sampled++;
    if (px[3] > 0 && colors.some(function (want) {
      return Math.max(Math.abs(px[0] - want[0]), Math.abs(px[1] - want[1]), Math.abs(px[2] - want[2])) < 60;
    })) drawn++;
  }
  var painted = 0;
  for (var i = 3; i < img.data.length; i += 4) if (img.data[i] > 0) painted++;
  out[name] = {sampled: sampled, drawn: drawn, painted: painted / (img.width * img.height),
               labels: (ch.data.labels || []).slice(),
               datasets: ch.data.datasets.map(function (ds) {
                 return {label: ds.label, data: ds.data.map(function (p) { return p !== null && typeof p === 'object'
                   ? {x: p.x, y: p.y, d: p.d, a: p.a, src: p.src} : p; })}; })};
}
return out;
"""


def check_drawn(charts: dict) -> None:
    for name in CHARTS:
        c = charts[name]
        assert c["sampled"] >= 3 and c["drawn"] >= 0.75 * c["sampled"], (name, c["sampled"], c["drawn"])
        assert c["painted"] > 0.02, (name, c["painted"])


def expected_positions(steps: list[dict]) -> tuple[dict, list[float]]:
    """From the records: {(first step no., position): (drafted, accepted)} for groups of one
    step, and the acceptance per draft position over all rows (%)."""
    cells, pos = {}, {}
    for n, s in enumerate(steps, 1):
        for d, a in zip(s["drafted"], s["accepted"]):
            for p in range(d):
                c = cells.setdefault((n, p + 1), [0, 0])
                c[0] += 1
                c[1] += p < a
                q = pos.setdefault(p, [0, 0])
                q[0] += 1
                q[1] += p < a
    return {k: tuple(v) for k, v in cells.items()}, [100 * pos[p][1] / pos[p][0] for p in sorted(pos)]


def heatmap_cells(chart: dict) -> dict:
    return {(c["x"], c["y"]): (c["d"], c["a"]) for ds in chart["datasets"] for c in ds["data"]}


def test_report_page_draws_a_real_run(browser, tmp_path):
    stats = tmp_path / "run.jsonl"
    model, tok = cached_tiny()
    # hybrid: n-gram lookup extended by the draft model, so cells of several components
    pipe = MTPPipeline(model, tok, strategy="hybrid", draft_model=model, budget={"type": "static", "k": 4},
                       stats_out=str(stats))
    pipe.generate(["the cat the cat the cat the cat", "one two three one two three one two",
                   "def x ( ) : return x"], max_new_tokens=40, ignore_eos=True)
    pipe.jsonl.close()
    write_report(str(stats), str(tmp_path / "report.html"))
    browser.get((tmp_path / "report.html").as_uri())
    wait_for(browser, "LightSpecDashboard.instances[0].renders >= 1")
    charts = browser.execute_script(CHECK_CHARTS)
    steps = [r for r in read_stats(str(stats))[0] if r["kind"] == "step"]
    cells, per_position = expected_positions(steps)
    assert heatmap_cells(charts["heatmap"]) == cells  # every step's drafted and accepted rows per position
    assert len({ds["label"] for ds in charts["heatmap"]["datasets"]}) >= 2  # coloured by component
    (all_rows,) = [ds for ds in charts["position"]["datasets"] if ds["label"] == "all rows"]
    assert all_rows["data"] == pytest.approx(per_position)
    (k_mean,) = [ds for ds in charts["budget"]["datasets"] if ds["label"] == "k, mean over rows"]
    assert [p["y"] for p in k_mean["data"]] == pytest.approx([sum(s["budget_k"]) / len(s["budget_k"]) for s in steps])
    stages = {ds["label"].split(" (")[0] for ds in charts["latency"]["datasets"]}
    assert {"draft", "verify_forward", "whole step"} <= stages
    (line, requests) = charts["throughput"]["datasets"]
    groups = [steps[i:i + 4] for i in range(0, len(steps), 4)]  # tokens/s over groups of 4 steps
    assert [p["y"] for p in line["data"]] == pytest.approx(
        [sum(sum(s["emitted"]) for s in g) / sum(s["step_time_s"] for s in g) for g in groups])
    assert len(requests["data"]) == 3
    check_drawn(charts)
    assert console_errors(browser) == []
    save_screenshot(browser, tmp_path, "report.png")


def test_report_page_of_a_bench_file_switches_between_runs(browser, tmp_path):
    """A file with labelled events (as bench writes): one run is drawn at a time, picked in a menu."""
    src = tmp_path / "labelled.jsonl"
    feed_lines = []
    model, tok = cached_tiny()
    for strategy in ("ngram", "draft_model"):
        path = tmp_path / f"{strategy}.jsonl"
        pipe = MTPPipeline(model, tok, strategy=strategy, draft_model=model, budget={"type": "static", "k": 2},
                           stats_out=str(path))
        pipe.generate(["the cat the cat the cat"], max_new_tokens=12, ignore_eos=True)
        pipe.jsonl.close()
        feed_lines += [json.dumps({**json.loads(line), "label": f"{strategy} | p b1"})
                       for line in path.read_text().splitlines()]
    src.write_text("\n".join(feed_lines) + "\n")
    write_report(str(src), str(tmp_path / "labelled.html"))
    browser.get((tmp_path / "labelled.html").as_uri())
    wait_for(browser, "LightSpecDashboard.instances[0].renders >= 1")
    options = browser.execute_script("return Array.from(document.querySelectorAll('#ls-label option')).map(o => o.value)")
    assert options == ["ngram | p b1", "draft_model | p b1"]
    records = read_stats(str(src))[0]
    for label in options:
        browser.execute_script("var s = document.getElementById('ls-label'); s.value = arguments[0];"
                               "s.dispatchEvent(new Event('change'));", label)
        steps = [r for r in records if r["kind"] == "step" and r["label"] == label]
        charts = browser.execute_script(CHECK_CHARTS)
        assert heatmap_cells(charts["heatmap"]) == expected_positions(steps)[0]
        assert len(charts["throughput"]["datasets"][0]["data"]) == -(-len(steps) // 4)
    assert console_errors(browser) == []


def test_live_dashboard_shows_a_generation_as_it_arrives(browser, tmp_path):
    feed = DashboardFeed()
    pipe = tiny_pipeline(feed, k=3)
    with serve_dashboard(feed, interval_ms=200) as base:
        browser.get(base + "/dashboard")
        wait_for(browser, "LightSpecDashboard.instances[0].polls >= 2")
        assert browser.execute_script("return LightSpecDashboard.instances[0].records.length") == 0
        # a generation on another thread while the page polls, as the server's model thread does
        worker = threading.Thread(target=pipe.generate, args=(["the cat the cat the cat", "one two three one two"],),
                                  kwargs={"max_new_tokens": 30, "ignore_eos": True})
        worker.start()
        worker.join()
        first = feed.snapshot()["cursor"]
        wait_for(browser, f"LightSpecDashboard.instances[0].records.length === {first}")
        charts = browser.execute_script(CHECK_CHARTS)
        steps = [e for e in feed.snapshot()["events"] if e["kind"] == "step"]
        assert heatmap_cells(charts["heatmap"]) == expected_positions(steps)[0]
        check_drawn(charts)
        before = charts["heatmap"]["datasets"][0]["data"][-1]["x"]
        # new data arrive: a second generation is appended, nothing is drawn twice
        pipe.generate(["red green blue red green blue"], max_new_tokens=30, ignore_eos=True)
        total = feed.snapshot()["cursor"]
        assert total > first
        wait_for(browser, f"LightSpecDashboard.instances[0].records.length === {total}")
        charts = browser.execute_script(CHECK_CHARTS)
        steps = [e for e in feed.snapshot()["events"] if e["kind"] == "step"]
        assert heatmap_cells(charts["heatmap"]) == expected_positions(steps)[0]
        assert charts["heatmap"]["datasets"][0]["data"][-1]["x"] > before
        assert len(charts["throughput"]["datasets"][1]["data"]) == 3  # three finished requests
        status = browser.execute_script("return document.getElementById('ls-status').textContent")
        assert status.startswith("live · ") and "events shown" in status
        assert console_errors(browser) == []
        save_screenshot(browser, tmp_path, "dashboard_live.png")
        browser.get("about:blank")  # stop polling before the server goes


def test_a_long_run_is_drawn_in_groups_of_steps(browser, tmp_path):
    """1000 steps: at most 300 heat-map columns, each adding up its steps' drafts."""
    src = tmp_path / "long.jsonl"
    lines = []
    for i in range(1000):
        d, a = [1 + i % 4, i % 3], [min(1 + i % 4, i % 5), 0]
        lines.append(json.dumps({"kind": "step", "step": i + 1, "row_ids": [0, 1], "drafted": d, "accepted": a,
                                 "emitted": [x + 1 for x in a], "sources": ["ngram", "draft_model" if i % 3 else ""],
                                 "step_time_s": 0.002, "stage_s": {"draft": 0.0005, "verify_forward": 0.0012},
                                 "budget_k": [4, 2], "budget_reason": "model", "budget_estimates": {"gain": 1.5}}))
    src.write_text("\n".join(lines) + "\n")
    write_report(str(src), str(tmp_path / "long.html"))
    browser.get((tmp_path / "long.html").as_uri())
    wait_for(browser, "LightSpecDashboard.instances[0].renders >= 1")
    charts = browser.execute_script(CHECK_CHARTS)
    cells = [c for ds in charts["heatmap"]["datasets"] for c in ds["data"]]
    assert len({c["x"] for c in cells}) == 250  # groups of 4 steps
    steps = [json.loads(x) for x in lines]
    assert sum(c["d"] for c in cells) == sum(sum(s["drafted"]) for s in steps)
    assert sum(c["a"] for c in cells) == sum(sum(s["accepted"]) for s in steps)
    first = [c for c in cells if c["x"] == 2.5]  # steps 1-4
    assert sum(c["d"] for c in first) == sum(sum(s["drafted"]) for s in steps[:4])
    assert len(charts["budget"]["datasets"][0]["data"]) == 250
    check_drawn(charts)
    assert console_errors(browser) == []
