"""The plugin's tests use the repository's tiny-model helpers (``tests/models.py``); no
test may reach the network (as in ``tests/conftest.py``)."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
_SHARED = str(Path(__file__).resolve().parents[3] / "tests")
if _SHARED not in sys.path:
    sys.path.insert(0, _SHARED)
