"""Importing this module raises ``SystemExit(0)``: a plugin that would end the process
silently, with exit status 0, unless the loader catches it.

``LIGHTSPEC_FAULT_IMPORT_RAISES`` picks another exception class by name (``GeneratorExit``,
``AssertionError``, ``RuntimeError``, ...); ``SystemExit`` is raised with code 0.
"""

import builtins
import os

_name = os.environ.get("LIGHTSPEC_FAULT_IMPORT_RAISES", "SystemExit")
_cls = getattr(builtins, _name)
raise _cls(0) if _cls is SystemExit else _cls(f"{_name} raised by lightspec_fault_import at import")
