"""CRC32C (Castagnoli): the one checksum function of records, checkpoints, frames and replies.

`crc32c(data, value=0)` is the C module's (commitlog/_speedups.c: the CPU's CRC32 instruction where
it has one, else tables; the interpreter lock released over large buffers) when it is built, else
the crc32c package's, which computes the same function. The package is not imported when the C
module serves: its `__init__` reads its own version through importlib.metadata, about 30 ms of the
start of every process that imported it (every broker, controller and `tide` command).
`TIDELOG_PURE_PYTHON` does not apply here: it selects the per-record loops, and both choices for the
checksum are C.
"""

from __future__ import annotations

from collections.abc import Callable

try:
    from tidelog.commitlog._speedups import crc32c as _crc32c
except ImportError:  # no compiler where it was installed
    from crc32c import crc32c as _crc32c

#: CRC32C of a bytes-like `data`, continued from `value` (the CRC32C of what came before it).
crc32c: Callable[..., int] = _crc32c

__all__ = ["crc32c"]
