"""Compile a CPU kernel's C source on first use and load it with ctypes.

The kernels are C files shipped inside the package (``cpu_linear.c``, ``cpu_attention.c``).
Each is compiled once per machine with the system C compiler (``cc -O3 -march=native``)
into ``$LIGHTSPEC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lightspec`` or
``~/.cache/lightspec``), under a name keyed by the source, the flags, the compiler's
version and the CPU's feature flags, so a cache shared between machines never hands one
CPU another's instructions.  Any failure is returned as a reason, never raised: the
callers then run their PyTorch references.  ``LIGHTSPEC_CPU_KERNEL=0`` disables them all.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11"]
_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str | None]] = {}


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


def build(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """Compile (or reuse) and load ``source``; returns ``(library, None)`` or ``(None, why)``.
    The library's ``ls_isa()`` must report AVX2+F16C+FMA or AVX-512."""
    if os.environ.get("LIGHTSPEC_CPU_KERNEL", "1") == "0":
        return None, "disabled by LIGHTSPEC_CPU_KERNEL=0"
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, f"the CPU kernels are written for x86-64, this machine is {platform.machine()}"
    cc = compiler()
    if cc is None:
        return None, "no C compiler found (set CC, or install gcc)"
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"C compiler {cc!r} does not run: {exc}"
    key = hashlib.sha256(text + " ".join(FLAGS).encode() + version.encode() + cpu_flags().encode()).hexdigest()[:16]
    cache = cache_dir()
    target = cache / f"{source.stem}-{key}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                out = Path(tmp) / target.name
                run = subprocess.run([cc, *FLAGS, "-o", str(out), str(source), "-lm", "-lpthread"], capture_output=True, text=True,
                                     timeout=300)
                if run.returncode != 0:
                    return None, f"compiling {source.name} with {cc} failed: {run.stderr.strip()[-500:]}"
                os.replace(out, target)  # atomic: a concurrent build of the same key is harmless
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cannot build {source.name} in {cache}: {exc}"
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"cannot load {target}: {exc}"
    if lib.ls_isa() < 1:
        return None, "this CPU lacks AVX2, F16C and FMA (the CPU kernels need them or AVX-512)"
    return lib, None


def library(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """``build(source)`` once per process (thread-safe)."""
    name = str(source)
    if name not in _loaded:
        with _lock:
            if name not in _loaded:
                _loaded[name] = build(source)
    return _loaded[name]


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
    """Drop the loaded libraries' records (tests: rebuild under another environment)."""
    with _lock:
        _loaded.clear()
