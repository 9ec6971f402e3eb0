"""The repository's shared test helpers (``tests/models.py``: ToyTokenizer, tiny models) and
this plugin's fixtures are importable from the plugin's tests."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parents[2] / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
