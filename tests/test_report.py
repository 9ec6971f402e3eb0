"""``lightspec report STATS.jsonl -o page.html``: reading a run's statistics file (one clear
error for bad input), the self-contained page, and ``lightspec bench`` writing its step
events and their page next to its report.  The page is drawn in a browser in
test_dashboard_browser.py."""

from __future__ import annotations

import json
import re

import pytest
from helpers import cached_tiny, run_cli, save_tiny
from lightspec_core.dashboard import read_stats, write_report

from lightspec_core import MTPPipeline


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    """A real run's ``--stats-out`` file: the tiny model drafting for itself (k = 3), two prompts."""
    path = tmp_path_factory.mktemp("stats") / "run.jsonl"
    model, tok = cached_tiny()
    pipe = MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget={"type": "static", "k": 3},
                       stats_out=str(path))
    pipe.generate(["the cat the cat the cat", "one two three one two three"], max_new_tokens=16, ignore_eos=True)
    pipe.jsonl.close()
    return path


def embedded_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="lightspec-data">(.*?)</script>', page, re.S)
    assert m, "the page has no data block"
    return json.loads(m.group(1))


def test_read_stats_gives_step_and_request_records_on_the_decode_clock(stats_file):
    records, skipped = read_stats(str(stats_file))
    lines = [json.loads(x) for x in stats_file.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert skipped == 0 and len(records) == len(lines)
    assert len(steps) == sum(x["kind"] == "step" for x in lines) and sum(r["kind"] == "request" for r in records) == 2
    # t: the decode time so far, the running sum of the step times
    total = 0.0
    for rec, line in zip(records, lines):
        if line["kind"] == "step":
            total += line["step_time_s"]
            assert rec["drafted"] == line["drafted"] and rec["budget_k"] == line["budget_k"]
        assert rec["t"] == pytest.approx(total)


def test_cli_report_writes_one_self_contained_page(stats_file, tmp_path, capsys):
    out = tmp_path / "report.html"
    rc, _, err = run_cli(["report", str(stats_file), "-o", str(out)], capsys)
    assert rc == 0, err
    page = out.read_text(encoding="utf-8")
    # nothing is fetched: no src= / href= to scripts or styles, the libraries are inlined with their licence header
    assert not re.search(r"<script[^>]+src=", page) and 'rel="stylesheet"' not in page
    assert "Chart.js v4.6.1" in page and "Released under the MIT License" in page and "chartjs-chart-matrix v3.1.0" in page
    assert "LightSpecDashboard.report(" in page
    data = embedded_data(page)
    assert data["events"] == read_stats(str(stats_file))[0]
    assert f"wrote {out}" in err
    rc, js, _ = run_cli(["report", str(stats_file), "-o", str(out), "--json", "--title", "My run"], capsys)
    info = json.loads(js)
    assert rc == 0 and info["steps"] == sum(e["kind"] == "step" for e in data["events"]) and info["requests"] == 2
    assert "<title>My run</title>" in out.read_text(encoding="utf-8")


def test_cli_report_defaults_to_the_stats_file_name_with_html(stats_file, tmp_path, capsys):
    src = tmp_path / "copy.jsonl"
    src.write_text(stats_file.read_text())
    rc, _, err = run_cli(["report", str(src)], capsys)
    assert rc == 0, err
    assert (tmp_path / "copy.html").exists() and "copy.jsonl: " in (tmp_path / "copy.html").read_text()


def test_text_that_looks_like_markup_cannot_break_out_of_the_data_block(stats_file, tmp_path):
    line = json.loads(stats_file.read_text().splitlines()[0])
    line["label"] = "</script><script>alert(1)</script>"
    line["budget_reason"] = "<!-- x"
    src = tmp_path / "odd.jsonl"
    src.write_text(json.dumps(line) + "\n")
    write_report(str(src), str(tmp_path / "odd.html"))
    page = (tmp_path / "odd.html").read_text(encoding="utf-8")
    assert "alert(1)</script>" not in page
    (rec,) = embedded_data(page)["events"]
    assert rec["label"] == line["label"] and rec["budget_reason"] == "<!-- x"


STEP = {"kind": "step", "row_ids": [0], "drafted": [1], "accepted": [1], "emitted": [2], "step_time_s": 0.01}


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist; give a JSONL file written by `lightspec run --stats-out FILE`"),
    ("", "is empty"),
    ("\n\n", "is empty"),
    ("hello\n", "line 1 is not JSON"),
    (json.dumps(STEP) + "\n{\"kind\": \"st", "line 2 is not JSON"),
    ("[1, 2]\n", "line 1 is a JSON list, not an object"),
    ('{"step": 1}\n', "line 1 has no \"kind\""),
    (json.dumps({**STEP, "emitted": None, "drafted": 3}) + "\n", "'drafted' is 3; use a list"),
    (json.dumps({k: v for k, v in STEP.items() if k != "step_time_s"}) + "\n", "a step event without 'step_time_s'"),
    ('{"kind": "request", "new_tokens": 3}\n', "a request event without 'wall_time_s'"),
    ('{"kind": "request", "new_tokens": 3, "wall_time_s": 1.0}\n', "has no step events"),
    ('{"kind": "heartbeat"}\n', "has no step events"),
])
def test_bad_stats_files_are_one_clear_error(tmp_path, capsys, content, needle):
    src = tmp_path / "s.jsonl"
    if content is not None:
        src.write_text(content)
    rc, out, err = run_cli(["report", str(src), "-o", str(tmp_path / "r.html")], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("error: stats file ") and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.html").exists()


def test_bad_paths_are_one_clear_error(stats_file, tmp_path, capsys):
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe{}\n")
    cases = [
        (["report", str(tmp_path)], "is a directory"),
        (["report", str(tmp_path / "bin.jsonl")], "is not UTF-8 text"),
        (["report", str(stats_file), "-o", str(tmp_path / "no" / "r.html")], "does not exist; create it"),
        (["report", str(stats_file), "-o", str(stats_file)], "is the stats file itself"),
    ]
    for args, needle in cases:
        rc, _, err = run_cli(args, capsys)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)


def test_unknown_event_kinds_are_skipped_and_counted(stats_file, tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text('{"kind": "heartbeat", "x": 1}\n' + stats_file.read_text())
    info = write_report(str(src), str(tmp_path / "m.html"))
    assert info["skipped"] == 1 and info["steps"] == len(read_stats(str(stats_file))[0]) - 2


def test_bench_writes_its_step_events_and_their_page_and_links_them(capsys, tmp_path):
    model_dir = save_tiny(tmp_path / "model")
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat the cat\none two three one two three\n")
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    rc, _, err = run_cli(["bench", "--model", str(model_dir), "--prompts", str(prompts), "--strategy", "none",
                          "--strategy", "ngram", "--no-hf", "--max-new-tokens", "6", "--json", str(out_json),
                          "--markdown", str(out_md)], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    assert report["stats_report"] == {"jsonl": "b_stats.jsonl", "html": "b_stats.html"}
    assert "[b_stats.html](b_stats.html)" in out_md.read_text()
    records, _ = read_stats(str(tmp_path / "b_stats.jsonl"))
    labels = {r["label"] for r in records}
    assert labels == {"none | p.txt b1 t0.0", "ngram | p.txt b1 t0.0"}
    # the timed runs' steps only: as many tokens as the report counts (minus each prompt's prefill token)
    for name in ("none", "ngram"):
        (res,) = [r for r in report["runs"][0]["workloads"]["p.txt"]["results"] if r["name"] == name]
        mine = [r for r in records if r["label"].startswith(name + " |")]
        assert sum(sum(r["emitted"]) for r in mine) + 2 == res["tokens"]
    page = (tmp_path / "b_stats.html").read_text(encoding="utf-8")
    assert {e["label"] for e in embedded_data(page)["events"]} == labels


def test_bench_without_report_files_writes_no_stats(capsys, tmp_path, monkeypatch):
    model_dir = save_tiny(tmp_path / "model")
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat the cat\n")
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["bench", "--model", str(model_dir), "--prompts", str(prompts), "--strategy", "ngram",
                          "--no-hf", "--max-new-tokens", "4"], capsys)
    assert rc == 0, err
    assert not list(tmp_path.glob("*_stats.*"))


def test_report_needs_neither_torch_nor_fastapi(stats_file, tmp_path):
    """`lightspec report` works where only the core's light dependencies are installed."""
    import subprocess
    import sys

    code = ("import sys; from lightspec_core.cli import main; "
            f"rc = main(['report', {str(stats_file)!r}, '-o', {str(tmp_path / 'r.html')!r}]); "
            "print(rc, sorted(m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 []"
