"""Which implementation runs the per-record loops of the record-batch path: the C module
`_speedups` (commitlog/_speedups.c, built by `pip install` where a compiler exists) or the Python
code beside each call site, which stays the reference.

Each C function returns exactly what its Python twin returns, or None where the twin would
raise; the caller then runs the twin, so errors and their messages come from one place.
`TIDELOG_PURE_PYTHON=1` in the environment (read at import) turns the C module off, and
`use(False)` does so for one process (the tests run both ways).
"""

from __future__ import annotations

import os
from types import ModuleType

try:
    from tidelog.commitlog import _speedups as _native
except ImportError:  # no compiler where it was installed: the Python loops serve
    _native = None

#: The C module when it is built and not turned off, else None. Call sites read it per call.
native: ModuleType | None = None if os.environ.get("TIDELOG_PURE_PYTHON") == "1" else _native

#: Largest value a u64 field takes; arguments outside a C parameter's range go to the Python twin.
U64 = (1 << 64) - 1
I64 = (1 << 63) - 1


def available() -> bool:
    """Whether the C module was built (whatever `use` chose)."""
    return _native is not None


def use(on: bool) -> None:
    """Run the C loops (when built) or the Python ones, from now on in this process."""
    global native
    native = _native if on else None
