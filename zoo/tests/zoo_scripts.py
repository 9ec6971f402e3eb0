"""Load a ``zoo/scripts/<name>.py`` script as a module, for the tests (the scripts are not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """The module ``zoo/scripts/<name>.py``; the scripts folder goes on ``sys.path`` first,
    because some scripts import their neighbours (``prepare_data``)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
