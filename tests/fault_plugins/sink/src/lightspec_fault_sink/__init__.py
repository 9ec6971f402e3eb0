"""lightspec-fault-sink: a statistics sink (module-level lightspec_on_stats) that raises RuntimeError on every event (tests only)."""
