"""Fault-injection plugins: real distributions, installed for the tests that use them.

Three distributions (each a folder here, built like ``tests/example_plugin``):

* ``lightspec-fault-import``   entry point ``fault_import``: its module raises
  ``SystemExit(0)`` at import (``LIGHTSPEC_FAULT_IMPORT_RAISES`` picks another class);
* ``lightspec-fault-sink``     entry point ``fault_sink``: a ``lightspec_on_stats`` that
  raises ``RuntimeError`` on every event;
* ``lightspec-fault-drafters`` entry point ``fault_drafters``: the strategies
  ``raises_midway``, ``float_ids``, ``mutates_sequences``, ``zero_probs``, ``out_of_vocab``
  (see its ``plugin.py``).

They are NOT installed into the running environment (every test would then meet them):
``fault_site(which)`` pip-installs all three (no dependencies, no build isolation) into a
folder of the system's temporary directory named by a hash of their sources, one
sub-folder per distribution, once per machine and source version, and returns the
sub-folder of ``which``.  ``use_fault_plugins(monkeypatch, ...)`` puts the chosen ones on
``sys.path`` for one test (and by default allow-lists just them); ``fault_env(...)`` gives
the environment for a subprocess (a CLI run) that should see them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = ("import", "sink", "drafters")  # folder names; distribution lightspec-fault-<name>, entry point fault_<name>


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (HERE / pkg).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p) and "build" not in p.parts)


def _source_hash() -> str:
    h = hashlib.sha256(b"layout 2: one folder per distribution\0")
    for p in _sources():
        h.update(str(p.relative_to(HERE)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _install_all() -> Path:
    """Install the three distributions (once per source version); returns the root folder,
    which holds one sub-folder per distribution (its package and its ``.dist-info``)."""
    root = Path(tempfile.gettempdir()) / f"lightspec-fault-plugins-{_source_hash()}"
    if (root / ".complete").exists():
        return root
    with tempfile.TemporaryDirectory(prefix="lightspec-fault-build-") as tmp:
        # build from a copy, so that setuptools' build/ and *.egg-info stay out of the repository
        stage = Path(tmp) / "src"
        for pkg in PACKAGES:
            shutil.copytree(HERE / pkg, stage / pkg, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        target = Path(tmp) / "target"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
               "--target", str(target), *(str(stage / pkg) for pkg in PACKAGES)]
        # offline first (the environment's setuptools); else let pip fetch the build backend
        if subprocess.run(cmd[:4] + ["--no-build-isolation"] + cmd[4:]).returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run(cmd, check=True)
        partial = Path(tmp) / "root"
        for pkg in PACKAGES:  # one folder per distribution, so a test can put just one on the path
            module = f"lightspec_fault_{pkg}"
            (partial / pkg).mkdir(parents=True)
            for entry in target.iterdir():
                if entry.name == module or entry.name.startswith(module + "-"):
                    entry.rename(partial / pkg / entry.name)
        (partial / ".complete").write_text("ok\n")
        try:
            os.replace(partial, root)  # atomic; another process may have finished first
        except OSError:
            if not (root / ".complete").exists():
                raise
    return root


def fault_site(which: str) -> Path:
    """The folder to put on ``sys.path`` for the distribution ``which`` (``"import"``,
    ``"sink"`` or ``"drafters"``); installed on first use."""
    entry_points(which)
    return _install_all() / which


def entry_points(*which: str) -> list[str]:
    """Entry-point names of the chosen packages (``"import"``, ``"sink"``, ``"drafters"``)."""
    for w in which:
        if w not in PACKAGES:
            raise ValueError(f"unknown fault plugin {w!r}; allowed: {', '.join(PACKAGES)}")
    return [f"fault_{w}" for w in which]


def use_fault_plugins(monkeypatch, *which: str, allow_list: bool = True) -> None:
    """For one test: the fault plugins ``which`` importable and allow-listed
    (``LIGHTSPEC_PLUGINS``; ``allow_list=False`` lets every installed plugin load too), no
    strict mode, and the next ``get_registry()`` a fresh discovery."""
    from helpers import forget_discovered_plugins

    from lightspec_core import plugins

    for w in which:
        monkeypatch.syspath_prepend(str(fault_site(w)))
    if allow_list:
        monkeypatch.setenv("LIGHTSPEC_PLUGINS", ",".join(entry_points(*which)))
    else:
        monkeypatch.delenv("LIGHTSPEC_PLUGINS", raising=False)
    monkeypatch.delenv("LIGHTSPEC_STRICT_PLUGINS", raising=False)
    monkeypatch.setattr(plugins, "_registry", None)
    forget_discovered_plugins()


def fault_env(*which: str, allow_list: bool = True, **extra: str) -> dict[str, str]:
    """The environment for a subprocess that should see the fault plugins ``which`` (and,
    with the default ``allow_list=True``, no other plugin), plus ``extra`` variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(fault_site(w)) for w in which), *filter(None, [env.get("PYTHONPATH")])])
    if allow_list:
        env["LIGHTSPEC_PLUGINS"] = ",".join(entry_points(*which))
    else:
        env.pop("LIGHTSPEC_PLUGINS", None)
    env.pop("LIGHTSPEC_STRICT_PLUGINS", None)
    env.update(extra)
    return env
