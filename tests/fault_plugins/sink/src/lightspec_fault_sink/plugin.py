"""A statistics sink that raises ``RuntimeError`` on every event it is given.

``CALLS`` counts the events it received (so a test can tell that it was called at all).
"""

from lightspec_core import hookimpl

CALLS = {"events": 0}


@hookimpl
def lightspec_on_stats(event):
    CALLS["events"] += 1
    raise RuntimeError(f"lightspec_fault_sink fails on every event (event {CALLS['events']})")
