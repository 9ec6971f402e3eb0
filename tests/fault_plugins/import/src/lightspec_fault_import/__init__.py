"""lightspec-fault-import: a plugin module that raises SystemExit(0) (or another BaseException) at import (tests only)."""
