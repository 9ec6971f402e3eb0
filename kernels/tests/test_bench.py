"""bench.py smoke tests (CPU): the no-CUDA message and the tiny interpreter mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench.py"


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, str(BENCH), *args], env=env, capture_output=True, text=True, timeout=300)


def test_without_cuda_exits_cleanly():
    proc = _run()
    assert proc.returncode == 0
    assert "no CUDA device" in proc.stdout


def test_cpu_mode_checks_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run("--cpu", "--only", "compact_kv,compact_kv_layers,tree_attention_mask,chain_verify", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    kernels = {r["kernel"] for r in data["results"]}
    assert kernels == {"compact_kv", "compact_kv_layers", "tree_attention_mask", "chain_verify"}
    assert all(r["correct"] for r in data["results"]) and data["meta"]["failures"] == 0
