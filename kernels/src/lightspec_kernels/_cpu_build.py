"""Compile a CPU kernel's C source on first use, cache it, and load it with ctypes.

The kernels are C files shipped inside the package (``cpu_*.c``).  Each is compiled once
per machine with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``; ``-O3
-march=native``) into ``$LIGHTSPEC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lightspec`` or
``~/.cache/lightspec``), under a name keyed by the source, the flags, the compiler's
version and the CPU's feature flags, so a cache shared between machines never hands one
CPU another's instructions.

The cache is checked before it is trusted.  A build writes ``NAME.so`` and a record
``NAME.json`` (the library's size and SHA-256): the library is compiled into a temporary
file, flushed to disk (fsync) and renamed into place, then the record is written the same
way.  A library whose record is missing or does not match (a truncated file: loading it
crashes the process with SIGBUS; an empty one; other bytes) is rebuilt, never loaded.

Builds are bounded in time: all compiler calls of a process together get
``LIGHTSPEC_KERNEL_BUILD_TIMEOUT`` seconds (default 30), one call at most half of that;
a call past its limit is killed (its whole process group) and the process gives up on
the kernels.  When a build starts, one line on stderr says so; when the kernels are off
in a process (no compiler, another architecture, a failed or abandoned build,
``LIGHTSPEC_CPU_KERNEL=0``), one line on stderr says why, once per process (also logged
at debug level).  Nothing here raises: the callers run their PyTorch references.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("lightspec.kernels")

FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11"]
DEFAULT_BUDGET_S = 30.0
EXPECTED_BUILD_S = 5  # all four sources on a 2-core VM: ~2.5 s (docs: kernels/README.md, "Build")
SOURCES = tuple(sorted(Path(__file__).parent.glob("cpu_*.c")))

_lock = threading.RLock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str | None]] = {}


class _ProcessState:
    """What this process has done so far: compiler seconds spent, whether it gave up, and
    which one-time messages it printed."""

    def __init__(self) -> None:
        self.spent_s = 0.0
        self.gave_up: str | None = None
        self.announced = False
        self.off_reported = False


_state = _ProcessState()


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def cache_dir() -> Path:
    explicit = os.environ.get("LIGHTSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightspec"


def build_budget_s() -> float:
    """Seconds all compiler calls of this process may take together (``LIGHTSPEC_KERNEL_BUILD_TIMEOUT``)."""
    raw = os.environ.get("LIGHTSPEC_KERNEL_BUILD_TIMEOUT")
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        value = DEFAULT_BUDGET_S
    return value if value > 0 else DEFAULT_BUDGET_S


class _TimedOut(Exception):
    pass


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run one compiler call within this process's build budget.

    Raises ``_TimedOut`` (and records that the process gave up) when it runs past its
    limit: half the budget, or what is left of it.  The call runs in a session of its own
    so that a timeout kills its children too (a compiler driver's ``cc1``/``as``, a
    wrapper script's ``sleep``): they would otherwise hold its output pipes open."""
    budget = build_budget_s()
    limit = min(budget / 2, budget - _state.spent_s)
    if limit <= 0:
        raise _TimedOut(_give_up(f"the {budget:g} s build budget was spent before {what}"))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=hasattr(os, "killpg"))
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise _TimedOut(_give_up(
            f"{what} did not finish within {limit:.3g} s ({cmd[0]!r}; the build budget is {budget:g} s in all, "
            "LIGHTSPEC_KERNEL_BUILD_TIMEOUT)"
        )) from None
    except BaseException:  # Ctrl-C: the call's own session does not get the SIGINT
        _kill(proc)
        raise
    finally:
        _state.spent_s += time.monotonic() - start
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except OSError:
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a child that left the session still holds a pipe
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


def _give_up(why: str) -> str:
    _state.gave_up = f"gave up building the CPU kernels: {why}"
    log.debug(_state.gave_up)
    return _state.gave_up


def _announce() -> None:
    if not _state.announced:
        _state.announced = True
        msg = (f"building LightSpec's CPU kernels (first run, ~{EXPECTED_BUILD_S} s; "
               f"at most {build_budget_s():g} s)…")
        log.debug(msg)
        print(msg, file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_path(library_path: Path) -> Path:
    """The build record kept next to a cached library (``NAME.so`` → ``NAME.json``)."""
    return library_path.with_suffix(".json")


def check_cached(library_path: Path) -> str | None:
    """``None`` when ``library_path`` matches its build record (size and SHA-256), else why not."""
    try:
        size = library_path.stat().st_size
    except OSError:
        return "not built yet"
    try:
        rec = json.loads(record_path(library_path).read_text())
        want_size, want_hash = int(rec["size"]), str(rec["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "it has no readable build record"
    if size != want_size:
        return f"it is {size} bytes, the build recorded {want_size}"
    if _sha256(library_path) != want_hash:
        return "its content differs from the build's (SHA-256)"
    return None


def _write_durably(path: Path, data: bytes | None = None, source: Path | None = None) -> None:
    """Put ``data`` (or the file ``source``) at ``path`` atomically: flushed to disk, then renamed."""
    if source is None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the record from other users of a shared cache
        with os.fdopen(fd, "wb") as f:
            f.write(data or b"")
            f.flush()
            os.fsync(f.fileno())
        source = Path(tmp)
    else:
        with open(source, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(source, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_build_dirs(cache: Path, older_than_s: float = 3600.0) -> None:
    """Temporary build folders left by a process that was killed mid-build."""
    now = time.time()
    for d in cache.glob(".build-*"):
        try:
            if now - d.stat().st_mtime > older_than_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


def _compile(cc: str, source: Path, target: Path, key: str) -> str | None:
    """Build ``source`` into ``target`` (and its record); ``None`` or why it failed."""
    cache = target.parent
    _announce()
    log.debug("compiling %s into %s", source.name, target)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        _remove_stale_build_dirs(cache)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
            out = Path(tmp) / target.name
            run = _run([cc, *FLAGS, "-o", str(out), str(source), "-lm", "-lpthread"], f"compiling {source.name}")
            if run.returncode != 0:
                return f"compiling {source.name} with {cc} failed: {run.stderr.strip()[-500:]}"
            try:
                with open(out, "rb") as f:
                    magic = f.read(4)
            except OSError:
                magic = b""
            if magic != b"\x7fELF":
                return f"compiling {source.name} with {cc} produced no shared library (exit status 0, no ELF file)"
            size, digest = out.stat().st_size, _sha256(out)
            # library first, record second: a crash in between leaves a library without a
            # record, which the next load rebuilds; concurrent builds of one key are harmless
            _write_durably(target, source=out)
            record = {"size": size, "sha256": digest, "source": source.name, "key": key, "compiler": cc,
                      "flags": FLAGS}
            _write_durably(record_path(target), json.dumps(record, indent=1).encode())
            _fsync_dir(cache)
    except _TimedOut as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot build {source.name} in {cache}: {exc}"
    return None


def build(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """Compile (or reuse a verified cached build of) ``source`` and load it; returns
    ``(library, None)`` or ``(None, why)``.  The library's ``ls_isa()`` must report
    AVX2+F16C+FMA or AVX-512."""
    if os.environ.get("LIGHTSPEC_CPU_KERNEL", "1") == "0":
        return None, "disabled by LIGHTSPEC_CPU_KERNEL=0"
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, f"the CPU kernels are written for x86-64, this machine is {platform.machine()}"
    cc = compiler()
    if cc is None:
        return None, "no C compiler found (set CC, or install gcc)"
    if _state.gave_up:
        return None, _state.gave_up
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    try:
        version = _run([cc, "--version"], f"{cc} --version").stdout
    except _TimedOut as exc:
        return None, str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"C compiler {cc!r} does not run: {exc}"
    key = hashlib.sha256(text + " ".join(FLAGS).encode() + version.encode() + cpu_flags().encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    why_not_cached = check_cached(target)
    if why_not_cached is not None:
        if why_not_cached != "not built yet":
            log.debug("cached %s is not used (%s); rebuilding", target, why_not_cached)
        failed = _compile(cc, source, target, key)
        if failed is not None:
            return None, failed
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"cannot load {target}: {exc}"
    if lib.ls_isa() < 1:
        return None, "this CPU lacks AVX2, F16C and FMA (the CPU kernels need them or AVX-512)"
    return lib, None


def _report_off(why: str) -> None:
    """Say once per process (stderr, and the debug log) that the kernels are off, and why."""
    if _state.off_reported:
        return
    _state.off_reported = True
    msg = f"LightSpec's CPU kernels are off: {why}; PyTorch's operations run instead"
    log.debug(msg)
    print(msg, file=sys.stderr, flush=True)


def library(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """``build(source)`` once per process (thread-safe); the first failure is reported on stderr."""
    name = str(source)
    if name not in _loaded:
        with _lock:
            if name not in _loaded:
                result = build(source)
                _loaded[name] = result
                if result[1] is not None:
                    _report_off(result[1])
    return _loaded[name]


def status() -> dict:
    """Whether every CPU kernel can run in this process (building them if needed):
    ``{"on": bool, "reason": None or why not, "cache_dir": str}``."""
    reason = next((why for why in (library(s)[1] for s in SOURCES) if why is not None), None)
    return {"on": reason is None, "reason": reason, "cache_dir": str(cache_dir())}


class Kernel:
    """A kernel library whose ctypes signatures are set once, on first use.

    ``signatures``: ``{function name: (argtypes, restype)}``.  ``get()`` returns the loaded
    library, or ``None`` when it cannot be built here (``library``'s reason says why);
    ``lib`` is the library once ``get()`` succeeded (for hot paths that checked before)."""

    def __init__(self, source: Path, signatures: dict[str, tuple[list, object]]):
        self.source, self.signatures = source, signatures
        self.lib: ctypes.CDLL | None = None
        self.configured = False

    def get(self) -> ctypes.CDLL | None:
        if self.configured:
            return self.lib
        lib, _ = library(self.source)
        if lib is not None:
            for name, (argtypes, restype) in self.signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, restype
        self.lib, self.configured = lib, True
        return lib


def forget() -> None:
    """Drop the loaded libraries' records and the process's build state (tests: rebuild
    under another environment)."""
    global _state
    with _lock:
        _loaded.clear()
        _state = _ProcessState()
