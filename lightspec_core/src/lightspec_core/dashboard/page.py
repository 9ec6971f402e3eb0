"""The dashboard page's HTML: the live page (scripts and data from the server's routes) and
the self-contained report (``lightspec report``: libraries, script and data inlined)."""

from __future__ import annotations

import html
import json
import os
from importlib import resources

from ..errors import LightSpecError
from .records import read_stats

# in load order: Chart.js, its matrix (heat-map) chart type, then the dashboard's own script
SCRIPTS = ("chart.umd.min.js", "chartjs-chart-matrix.min.js", "dashboard.js")
STYLE = "dashboard.css"
# every file the live page may ask for, with its media type (the server serves nothing else)
STATIC_TYPES = {
    "chart.umd.min.js": "text/javascript", "chartjs-chart-matrix.min.js": "text/javascript",
    "dashboard.js": "text/javascript", "dashboard.css": "text/css",
    "chart.js.LICENSE.md": "text/plain", "chartjs-chart-matrix.LICENSE": "text/plain", "VENDORED.md": "text/plain",
}


def static_text(name: str) -> str:
    """A shipped static file's text (package data under ``dashboard/static``)."""
    if name not in STATIC_TYPES and name != "page.html":
        raise LightSpecError(f"dashboard file {name!r} is not shipped; files: {', '.join(sorted(STATIC_TYPES))}")
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _fill(title: str, subtitle: str, head: str, boot: str) -> str:
    page = static_text("page.html")
    for marker, value in (("__TITLE__", html.escape(title)), ("__SUBTITLE__", html.escape(subtitle)),
                          ("<!--HEAD-->", head), ("<!--BOOT-->", boot)):
        page = page.replace(marker, value)
    return page


def live_page(prefix: str = "/dashboard", interval_ms: int = 1000) -> str:
    """The live page: loads its assets from ``{prefix}/static/`` and polls
    ``{prefix}/data?since=N`` every ``interval_ms``."""
    head = f'<link rel="stylesheet" href="{prefix}/static/{STYLE}">\n' + "\n".join(
        f'<script src="{prefix}/static/{name}"></script>' for name in SCRIPTS)
    opts = json.dumps({"url": f"{prefix}/data", "intervalMs": interval_ms})
    boot = f"<script>LightSpecDashboard.live(document.getElementById('ls-root'), {opts});</script>"
    return _fill("LightSpec dashboard", "live", head, boot)


def _inline_script(code: str, name: str) -> str:
    # a literal "</script" would end the element early; none of the shipped files has one
    if "</script" in code.lower():
        raise LightSpecError(f"{name} contains '</script' and cannot be inlined")
    return f"<script>/* {name} */\n{code}\n</script>"


def report_page(records: list[dict], title: str, subtitle: str) -> str:
    """One self-contained page drawing ``records`` (``records.compact``): the libraries (with
    their licence headers), the script, the style and the data are inlined."""
    head = f"<style>\n{static_text(STYLE)}\n</style>\n" + "\n".join(
        _inline_script(static_text(name), name) for name in SCRIPTS)
    # "<" escaped: no "</script>" (or "<!--") inside the data block can end it early
    data = json.dumps({"events": records}, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    boot = (f'<script type="application/json" id="lightspec-data">{data}</script>\n'
            "<script>LightSpecDashboard.report(document.getElementById('ls-root'), "
            "JSON.parse(document.getElementById('lightspec-data').textContent));</script>")
    return _fill(title, subtitle, head, boot)


def write_report(stats_path: str, out_path: str, title: str | None = None) -> dict:
    """Read ``stats_path`` (``records.read_stats``) and write its report page to
    ``out_path``; returns ``{"path", "steps", "requests", "labels", "skipped", "bytes"}``."""
    records, skipped = read_stats(stats_path)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise LightSpecError(f"-o {out_path!r}: folder {out_dir!r} does not exist; create it or pick another path")
    steps = sum(r["kind"] == "step" for r in records)
    labels = sorted({r["label"] for r in records if "label" in r})
    subtitle = (f"{os.path.basename(stats_path)}: {steps} steps, "
                f"{sum(r['kind'] == 'request' for r in records)} requests"
                + (f", {len(labels)} runs" if labels else ""))
    page = report_page(records, title or "LightSpec report", subtitle)
    try:
        with open(out_path, "w", encoding="utf-8") as fh:
            fh.write(page)
    except OSError as exc:
        raise LightSpecError(f"-o {out_path!r} cannot be written: {exc.strerror or exc}") from None
    return {"path": out_path, "steps": steps, "requests": sum(r["kind"] == "request" for r in records),
            "labels": labels, "skipped": skipped, "bytes": len(page.encode("utf-8"))}
