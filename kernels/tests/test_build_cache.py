"""The CPU kernels' build cache (``_cpu_build``): damaged entries are rebuilt, never loaded;
a hanging compiler is given up on within the build budget; "kernels off" is said once.

Every load runs in a fresh interpreter (``probe``), with its own temporary cache folder
(``LIGHTSPEC_CACHE_DIR``): loading a truncated library can kill the process with SIGBUS,
which must not take pytest down, and the once-per-process state must start clean.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time

import pytest
from lightspec_kernels import _cpu_build

needs_compiler = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or _cpu_build.compiler() is None,
    reason="the CPU kernels build only on x86-64 with a C compiler",
)

# cpu_norm_rope is the smallest source: the quickest to rebuild
PROBE = """
import json
from lightspec_kernels import cpu_norm_rope as m
print(json.dumps({"on": m.available(), "reason": m.reason()}))
"""
PROBE_ALL = """
import json, logging
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
from lightspec_kernels import cpu_attention, cpu_decoder, cpu_linear, cpu_norm_rope
for _ in range(2):
    for m in (cpu_linear, cpu_attention, cpu_norm_rope, cpu_decoder):
        m.available(), m.reason()
print(json.dumps({"on": cpu_decoder.available(), "reason": cpu_decoder.reason()}))
"""
BUILDING = "building LightSpec's CPU kernels (first run"
OFF = "LightSpec's CPU kernels are off: "


def probe(cache, code=PROBE, **env) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run ``code`` in a fresh interpreter with the cache folder ``cache``; returns the
    process and the JSON its last stdout line holds (None if there is none)."""
    full = dict(os.environ, LIGHTSPEC_CACHE_DIR=str(cache))
    full.pop("LIGHTSPEC_CPU_KERNEL", None)
    full.pop("LIGHTSPEC_KERNEL_BUILD_TIMEOUT", None)
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if proc.returncode == 0 and lines else None)


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A cache folder holding a good build of cpu_norm_rope (built once for the module)."""
    cache = tmp_path_factory.mktemp("kernel-cache")
    proc, result = probe(cache)
    assert result == {"on": True, "reason": None}, proc.stderr
    return cache


@pytest.fixture
def cache(built_cache, tmp_path):
    """A private copy of the good cache, for one test to damage."""
    return shutil.copytree(built_cache, tmp_path / "cache")


def the_library(cache):
    [so] = cache.glob("cpu_norm_rope-*.so")
    return so


@needs_compiler
def test_valid_cache_entry_is_reused(cache):
    so = the_library(cache)
    stamp = so.stat().st_mtime_ns
    proc, result = probe(cache)
    assert result == {"on": True, "reason": None}, proc.stderr
    assert BUILDING not in proc.stderr and OFF not in proc.stderr
    assert so.stat().st_mtime_ns == stamp


def _damage(so, how):
    good = so.read_bytes()
    if how == "truncated":  # in place, as an interrupted copy or a full disk leaves it
        with open(so, "r+b") as f:
            f.truncate(len(good) // 2)
    elif how == "zero_length":
        with open(so, "r+b") as f:
            f.truncate(0)
    elif how == "no_record":  # the build record lost (a crash between the two renames; an old cache)
        _cpu_build.record_path(so).unlink()
    elif how == "same_size_other_bytes":
        mid = len(good) // 2
        so.write_bytes(good[:mid] + bytes(b ^ 0xFF for b in good[mid : mid + 64]) + good[mid + 64 :])
    else:
        raise ValueError(how)


@needs_compiler
@pytest.mark.parametrize("how", ["truncated", "zero_length", "no_record", "same_size_other_bytes"])
def test_damaged_cache_entry_is_rebuilt(cache, how):
    so = the_library(cache)
    _damage(so, how)
    assert _cpu_build.check_cached(so) is not None
    proc, result = probe(cache)
    assert proc.returncode == 0, f"the loader died (status {proc.returncode}; -7 is SIGBUS): {proc.stderr}"
    assert result == {"on": True, "reason": None}, proc.stderr
    assert BUILDING in proc.stderr
    assert _cpu_build.check_cached(so) is None and so.stat().st_size > 0
    assert not list(cache.glob(".build-*")), "a temporary build folder was left behind"


def _fake_compiler(tmp_path, hang_on_version: bool):
    """A "compiler" that answers ``--version`` (unless ``hang_on_version``) and otherwise
    starts a child that sleeps for 10 minutes and waits for it; every call appends its pid
    (and its child's) to ``pids``."""
    pids = tmp_path / "pids"
    script = tmp_path / "slowcc"
    version = "" if hang_on_version else 'if [ "$1" = "--version" ]; then echo "slowcc 1.0"; exit 0; fi\n'
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\n{version}sleep 600 &\necho $! >> {pids}\nwait\n")
    script.chmod(0o755)
    return script, pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has finished
    except FileNotFoundError:
        return False


@needs_compiler
@pytest.mark.parametrize("hang_on_version", [False, True], ids=["hangs_compiling", "hangs_on_version"])
def test_hanging_compiler_is_given_up_within_the_budget(tmp_path, hang_on_version):
    """CC points at a compiler that never finishes: start-up gives up within the build
    budget (here 2 s), says so, kills the compiler's whole process group, and every kernel
    reports off with the reason; a process that did not give up would stop this test at
    subprocess.run's timeout."""
    cc, pids = _fake_compiler(tmp_path, hang_on_version)
    proc, result = probe(tmp_path / "cache", PROBE_ALL, CC=str(cc), LIGHTSPEC_KERNEL_BUILD_TIMEOUT="2")
    assert result is not None, proc.stderr
    assert result["on"] is False and result["reason"].startswith("gave up building the CPU kernels")
    assert ("--version" in result["reason"]) == hang_on_version
    assert "LIGHTSPEC_KERNEL_BUILD_TIMEOUT" in result["reason"]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("DEBUG")]
    assert sum(OFF in ln for ln in lines) == 1, proc.stderr
    assert sum(BUILDING in ln for ln in lines) == (0 if hang_on_version else 1), proc.stderr
    [off] = [ln for ln in lines if OFF in ln]
    assert "gave up" in off and "did not finish" in off
    assert any(ln.startswith("DEBUG lightspec.kernels: " + OFF) for ln in proc.stderr.splitlines())
    started = [int(p) for p in pids.read_text().split()]
    # hangs_on_version: the version shell and its sleep; else also the version call before them
    assert len(started) == (2 if hang_on_version else 3), "the compiler was called again after the process gave up"
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in started), "the compiler (or its child) was left running"


def test_kernels_off_is_said_once_per_process(tmp_path):
    proc, result = probe(tmp_path / "cache", PROBE_ALL, LIGHTSPEC_CPU_KERNEL="0")
    assert result == {"on": False, "reason": "disabled by LIGHTSPEC_CPU_KERNEL=0"}, proc.stderr
    off = [ln for ln in proc.stderr.splitlines() if ln.startswith(OFF)]
    assert off == [OFF + "disabled by LIGHTSPEC_CPU_KERNEL=0; PyTorch's operations run instead"], proc.stderr
    assert sum("DEBUG lightspec.kernels: " + OFF in ln for ln in proc.stderr.splitlines()) == 1


def test_failed_compile_is_reported_and_not_cached(tmp_path):
    """A compiler that exits 0 without writing a library: off, said why, nothing cached."""
    script = tmp_path / "nocc"
    script.write_text('#!/bin/sh\n[ "$1" = "--version" ] && echo "nocc 1.0"\nexit 0\n')
    script.chmod(0o755)
    cache = tmp_path / "cache"
    proc, result = probe(cache, CC=str(script))
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the kernels are not built on this architecture")
    assert result["on"] is False and "produced no shared library" in result["reason"], proc.stderr
    assert not list(cache.glob("*.so")) and not list(cache.glob("*.json"))


def test_stale_temporary_build_folders_are_removed(tmp_path):
    old, new = tmp_path / ".build-old", tmp_path / ".build-new"
    old.mkdir()
    new.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    _cpu_build._remove_stale_build_dirs(tmp_path)
    assert not old.exists() and new.exists()
