"""``DashboardFeed``: a statistics sink that keeps a bounded window of recent events for
the live dashboard, written by the decode loop's thread and read by request handlers."""

from __future__ import annotations

import threading
import time
from collections import deque
from itertools import islice

from ..errors import InvalidValueError
from ..hookspecs import hookimpl
from .records import compact


class DashboardFeed:
    """A sink (``lightspec_on_stats``) that keeps the last ``window`` events as dashboard
    records (``records.compact``), each numbered with ``seq`` = 1, 2, ... in arrival order,
    plus running totals since the feed was made.  ``t`` of a record is the seconds since
    the feed was made (``clock``, monotonic by default) when the event arrived.

    Thread-safe: one thread (the engine's) calls ``lightspec_on_stats`` while others call
    ``snapshot``.  Pass it to a pipeline as a sink: ``MTPPipeline(..., sinks=[feed])``."""

    name = "dashboard"

    def __init__(self, window: int = 4096, clock=time.monotonic):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise InvalidValueError(f"window={window!r} is invalid: use an integer >= 1 (events kept)")
        self.window = window
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._events: deque[dict] = deque(maxlen=window)
        self._seq = 0
        self._totals = {"steps": 0, "tokens": 0, "drafted": 0, "accepted": 0, "requests": 0, "failures": 0}

    @hookimpl
    def lightspec_on_stats(self, event) -> None:
        rec = compact(event, round(self._clock() - self._t0, 6))
        if rec is None:
            return
        with self._lock:
            self._seq += 1
            rec["seq"] = self._seq
            self._events.append(rec)
            tot = self._totals
            if rec["kind"] == "step":
                tot["steps"] += 1
                tot["tokens"] += sum(rec["emitted"])
                tot["drafted"] += sum(rec["drafted"])
                tot["accepted"] += sum(rec["accepted"])
                tot["failures"] += rec["failure"] is not None
            else:
                tot["requests"] += 1

    def snapshot(self, since: int = 0) -> dict:
        """The records after ``since`` (a ``cursor`` from an earlier snapshot; 0: all kept)
        as a JSON-ready dict::

            {"cursor": int,     # seq of the newest record: the next call's ``since``
             "reset": bool,     # since > cursor: this is a new feed; drop what you have
             "dropped": int,    # records after ``since`` that left the window unread
             "window": int, "uptime_s": float,
             "totals": {"steps", "tokens", "drafted", "accepted", "requests", "failures"},
             "events": [record, ...]}   # oldest first, each with its "seq"

        With ``reset`` the events are every record kept.  Records are shared, never
        changed after they are made."""
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise InvalidValueError(f"since={since!r} is invalid: use an integer >= 0 (the cursor of the last snapshot)")
        with self._lock:
            seq, kept = self._seq, len(self._events)
            reset = since > seq
            wanted = seq if reset else seq - since
            n = min(wanted, kept)
            events = list(islice(self._events, kept - n, kept))
            totals = dict(self._totals)
            uptime = self._clock() - self._t0
        return {"cursor": seq, "reset": reset, "dropped": wanted - n, "window": self.window,
                "uptime_s": round(uptime, 3), "totals": totals, "events": events}
