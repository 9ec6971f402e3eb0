"""Dashboard records: the compact, JSON-ready form of one statistics event that the live
dashboard and the report page draw from, and reading a ``--stats-out`` file into them.

A record is a plain dict (the format is documented in docs/user-guide.md, "Dashboard and
reports"): ``kind`` ("step" or "request"), ``t`` (seconds on the run's clock), the event's
fields the charts need and, for a file written by ``lightspec bench``, ``label`` (the method
and workload the event belongs to).  Non-finite floats become ``None`` so that every record
is valid JSON for a browser's ``JSON.parse``.
"""

from __future__ import annotations

import json
import math
import os

from ..errors import LightSpecError

# a step event's fields the dashboard keeps: (name, default when an older file lacks it)
STEP_LISTS = ("row_ids", "drafted", "accepted", "emitted", "sources", "budget_k")
STEP_NUMBERS = ("step_time_s", "target_forward_s", "draft_forward_s", "overhead_s", "bubble_ratio")
STEP_REQUIRED = ("row_ids", "drafted", "accepted", "emitted", "step_time_s")
REQUEST_NUMBERS = ("prompt_tokens", "new_tokens", "steps", "drafted", "accepted", "wall_time_s", "prefill_time_s")
REQUEST_REQUIRED = ("new_tokens", "wall_time_s")


def _num(x) -> float | int | None:
    """A finite int or float as it is; anything else (NaN, inf, None, a string) -> None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _numbers(d) -> dict[str, float]:
    return {str(k): n for k, v in (d or {}).items() if (n := _num(v)) is not None}


def compact(event, t: float) -> dict | None:
    """The record of ``event`` (a ``StepStats`` / ``RequestSummary`` or its ``to_dict()``)
    at time ``t``; ``None`` for a kind the dashboard does not draw.  Lists and dicts are
    copied: the engine may reuse its own."""
    get = event.get if isinstance(event, dict) else (lambda k, default=None: getattr(event, k, default))
    kind = get("kind")
    if kind == "step":
        rec = {"kind": "step", "t": t, "step": get("step", 0)}
        for k in STEP_LISTS:
            rec[k] = list(get(k) or [])
        for k in STEP_NUMBERS:
            rec[k] = _num(get(k, 0.0))
        rec["stage_s"] = _numbers(get("stage_s"))
        rec["budget_reason"] = str(get("budget_reason") or "")
        rec["budget_estimates"] = _numbers(get("budget_estimates"))
        failure = get("failure")
        rec["failure"] = str(failure) if failure else None
    elif kind == "request":
        rec = {"kind": "request", "t": t, "request": get("request", 0)}
        for k in REQUEST_NUMBERS:
            rec[k] = _num(get(k, 0))
        rec["finish_reason"] = str(get("finish_reason") or "")
        rec["failures"] = len(get("failures") or [])
        wall, new = rec["wall_time_s"], rec["new_tokens"]
        rec["tokens_per_s"] = new / wall if wall and new is not None else None
    else:
        return None
    label = get("label")
    if label is not None:
        rec["label"] = str(label)
    return rec


def read_stats(path: str) -> tuple[list[dict], int]:
    """The records of a statistics file (one JSON object per line, as ``--stats-out``,
    ``JsonlSink`` and ``lightspec bench`` write them) and how many lines had a kind the
    dashboard does not draw.  ``t`` is the decode time so far: the sum of the step times
    of the same label before the event.  Raises one ``LightSpecError`` naming the file (and
    line) for a missing or unreadable file, a line that is not a JSON object, a step or
    request without its required fields, or a file without any step event."""
    if not os.path.exists(path):
        raise LightSpecError(f"stats file {path!r} does not exist; give a JSONL file written by "
                             "`lightspec run --stats-out FILE`")
    if os.path.isdir(path):
        raise LightSpecError(f"stats file {path!r} is a directory; give a JSONL file written by "
                             "`lightspec run --stats-out FILE`")
    records: list[dict] = []
    clock: dict[str | None, float] = {}
    skipped = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                event = _parse_line(path, n, line)
                label = event.get("label")
                t = clock.get(label, 0.0)
                if event.get("kind") == "step":
                    _require(path, n, event, STEP_REQUIRED)
                    t += _num(event["step_time_s"]) or 0.0
                    clock[label] = t
                elif event.get("kind") == "request":
                    _require(path, n, event, REQUEST_REQUIRED)
                rec = compact(event, t)
                if rec is None:
                    skipped += 1
                else:
                    records.append(rec)
    except UnicodeDecodeError as exc:
        raise LightSpecError(f"stats file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                             "give a JSONL file written by --stats-out") from None
    except OSError as exc:
        raise LightSpecError(f"stats file {path!r} cannot be read: {exc.strerror or exc}") from None
    if not any(r["kind"] == "step" for r in records):
        what = "is empty" if not records and not skipped else "has no step events (\"kind\": \"step\")"
        raise LightSpecError(f"stats file {path!r} {what}; give a JSONL file written by "
                             "`lightspec run --stats-out FILE` after a generation")
    return records, skipped


def _parse_line(path: str, n: int, line: str) -> dict:
    try:
        event = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LightSpecError(f"stats file {path!r}, line {n} is not JSON ({exc.msg}); a stats file has one JSON "
                             "object per line (`lightspec run --stats-out FILE`)") from None
    if not isinstance(event, dict):
        raise LightSpecError(f"stats file {path!r}, line {n} is a JSON {type(event).__name__}, not an object; "
                             "a stats file has one JSON object per line (`lightspec run --stats-out FILE`)")
    if "kind" not in event:
        raise LightSpecError(f"stats file {path!r}, line {n} has no \"kind\"; a stats event has \"kind\": "
                             "\"step\" or \"request\"")
    return event


def _require(path: str, n: int, event: dict, fields: tuple[str, ...]) -> None:
    missing = [k for k in fields if k not in event]
    if missing:
        raise LightSpecError(f"stats file {path!r}, line {n}: a {event['kind']} event without "
                             f"{', '.join(repr(k) for k in missing)}; it needs {', '.join(fields)}")
    lists = [k for k in fields if k in STEP_LISTS and not isinstance(event[k], list)]
    if lists:
        raise LightSpecError(f"stats file {path!r}, line {n}: {lists[0]!r} is {event[lists[0]]!r}; use a list "
                             "(one value per row)")
