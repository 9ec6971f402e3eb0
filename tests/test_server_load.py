"""A short run of ``scripts/load_test.py`` (20 requests on a tiny model, no transformers
serve): mixed plain and streaming requests, malformed bodies, early disconnects and a
drafter that raises; every valid answer equals offline greedy, the server ends idle
with its RSS within 10% of the warm baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import save_tiny

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "load_test.py"


def test_short_load_and_fault_run(tmp_path):
    model = save_tiny(tmp_path / "model")
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--requests", "20", "--model", str(model), "--strategy",
                           "ngram", "--max-tokens", "16", "--no-hf", "--json", str(out), "--seed", "3",
                           "--deadline-s", "600"], capture_output=True, text=True, env=dict(os.environ), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == []
    kinds = report["fault_round"]["kinds"]
    assert kinds["malformed"] and kinds["disconnect"] and kinds["flaky"]  # every fault was in the mix
    assert report["fault_round"]["flaky_step_failures"] > 0
    for label in ("speculation_on", "speculation_off"):
        assert report[label]["ok"] == 20
    assert report["rss"]["ratio"] <= 1.10
