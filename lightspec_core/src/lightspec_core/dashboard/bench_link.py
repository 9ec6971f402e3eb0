"""``lightspec bench``'s per-step statistics: the step events of its LightSpec methods'
timed runs, written as one stats file (each event labelled with its method and workload)
next to the bench report, and that file's report page."""

from __future__ import annotations

import json
import os

from .page import write_report


def stats_paths(json_out: str | None, md_out: str | None) -> tuple[str, str] | None:
    """``(stats JSONL, report page)``: ``<stem>_stats.jsonl`` and ``<stem>_stats.html``
    beside the Markdown report (else the JSON one); ``None`` when bench writes neither."""
    base = md_out or json_out
    if not base:
        return None
    stem = os.path.splitext(base)[0]
    return f"{stem}_stats.jsonl", f"{stem}_stats.html"


def start(path: str) -> None:
    """Empty ``path`` (events are appended workload by workload)."""
    with open(path, "w", encoding="utf-8"):
        pass


def append_step_events(path: str, results, workload: str) -> int:
    """Append the step events of ``results`` (``MethodResult``s; HF methods have none) to
    ``path``, each with ``"label": "<method> | <workload>"``; returns how many."""
    n = 0
    with open(path, "a", encoding="utf-8") as fh:
        for r in results:
            if r.error:
                continue
            for event in r.step_events:
                fh.write(json.dumps({**event.to_dict(), "label": f"{r.name} | {workload}"}) + "\n")
                n += 1
    return n


def write_page(jsonl: str, html: str, title: str) -> dict:
    """The report page of bench's stats file (``page.write_report``)."""
    return write_report(jsonl, html, title)
