"""The plugin's tests also use the repository's shared test helpers (``tests/stat_tests.py``)."""

import sys
from pathlib import Path

_SHARED = str(Path(__file__).resolve().parents[3] / "tests")  # the repository's shared test helpers (stat_tests)
if _SHARED not in sys.path:
    sys.path.append(_SHARED)
