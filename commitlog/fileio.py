"""Writes that either put every byte in place or raise: the store never counts a short write.

`os.pwrite` and `os.write` may write fewer bytes than asked (a full disk, a quota, a signal);
ignoring the count let the log believe in bytes its files did not hold, and a checkpoint then
claimed them. Here a short write is continued, and a write that makes no progress raises
OSError(ENOSPC). `store_error` turns an OSError into the typed error the broker answers with.
`sync_filesystem` makes everything written to one filesystem durable in one call (syncfs).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re

from tidelog.errors import DiskFullError, StoreError, TidelogError

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, f"no progress writing {len(view) - done} bytes at {offset + done}")
        done += n


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.write(fd, view[done:])
        if n <= 0:
            raise OSError(errno.ENOSPC, f"no progress writing {len(view) - done} bytes")
        done += n


def _kernel_at_least(major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return m is not None and (int(m[1]), int(m[2])) >= (major, minor)


# syncfs(2) reports writeback errors only from Linux 5.8 on: before, it returned 0 after pages
# were lost, so it is used only where it says so
_syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None) if _kernel_at_least(5, 8) else None
if _syncfs is not None:
    _syncfs.argtypes = [ctypes.c_int]
    _syncfs.restype = ctypes.c_int
#: errors that say syncfs cannot be used here (a sandbox's filter), not that a write was lost
_UNUSABLE = {errno.ENOSYS, errno.EPERM, errno.EINVAL}


def sync_filesystem(fd: int) -> bool:
    """syncfs(2): write every dirty page and the metadata of the filesystem holding `fd` and wait
    for them (Linux waits for the I/O, and its filesystems end with a cache flush). False where
    it cannot be used (before Linux 5.8, or refused as a call: the caller syncs file by file);
    OSError when it fails. A writeback error on that filesystem since `fd` was opened fails it,
    whichever file it hit: open `fd` before the writes it is to cover, and keep the data
    directory on a filesystem of its own."""
    global _syncfs
    if _syncfs is None:
        return False
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        if err in _UNUSABLE:
            _syncfs = None
            return False
        raise OSError(err, f"syncfs failed: {os.strerror(err)}")
    return True


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL


def store_error(why: str, exc: BaseException | None = None) -> TidelogError:
    """DISK_FULL for a full disk or quota, STORE_ERROR for any other I/O failure."""
    if exc is not None and is_disk_full(exc):
        return DiskFullError(why)
    return StoreError(why)
