"""Ahead-of-time compile every Triton kernel for sm_90 (Hopper) without a GPU.

The interpreter runs kernels as Python, so it cannot catch code that the real compiler
rejects (control-flow typing, unsupported ops).  Triton ships the CUDA backend and
ptxas, so the whole pipeline down to a cubin runs on a CPU machine; it has to run in a
process without TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_all_kernels_compile_for_sm90():
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia import compiler as _nv  # noqa: F401
    except ImportError:
        pytest.skip("triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_compile_check.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout[-5000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ok ") >= 30
