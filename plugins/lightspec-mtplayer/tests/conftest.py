import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fixtures.py
_SHARED = str(Path(__file__).resolve().parents[3] / "tests")  # the repository's shared test helpers (stat_tests)
if _SHARED not in sys.path:
    sys.path.append(_SHARED)
