"""Files and directories only their owner can read: the one helper every writer of state uses.

Owns how tidelog creates what it keeps on disk (data directories, state files, configs, keys,
the Raft journal and snapshots, segments, indexes, logs) and the start-up check that refuses a
data directory, secret or key file other local accounts could read:

- `private_dir(path)`: create a directory (and its missing parents) mode 0700.
- `open_private(path, flags)`: `os.open` with mode 0600, and the mode set again on a file that
  already existed, whatever the umask.
- `write_private(path, data)`: replace a file's content atomically (temporary file, fsync,
  rename), mode 0600.
- `restrict_umask()`: a process's umask 077, so that files a library creates for us (PySyncObj's
  journal, a log handler's rotation) are private too.
- `require_private(path, what)`: `InsecurePermissionsError` when group or others have any
  access, naming the path and the command that fixes it (as OpenSSH does for a key file, and
  PostgreSQL for its data directory). An *empty* directory is tightened instead of refused, as
  `initdb` does for an existing directory: nothing is in it to have leaked yet.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from tidelog.errors import InsecurePermissionsError

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "open_private",
    "private_dir",
    "require_private",
    "restrict_umask",
    "write_private",
]

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def restrict_umask() -> int:
    """Make every file this process creates from now on private (umask 077); the old umask."""
    return os.umask(0o077)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """`path` as a directory, created with its missing parents mode 0700 whatever the umask.

    A directory that exists keeps its mode: `require_private` is the check that refuses it."""
    p = Path(path)
    missing: list[Path] = []
    cur = p
    while not cur.exists():
        missing.append(cur)
        if cur.parent == cur:
            break
        cur = cur.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:  # another process made it between the check and here
            continue
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask
    return p


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """`os.open(path, flags, 0o600)`, and mode 0600 on a file that existed with another."""
    fd = os.open(path, flags, FILE_MODE)
    if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
        except OSError:
            os.close(fd)
            raise
    return fd


def write_private(path: str | os.PathLike[str], data: bytes | str, *, sync: bool = True) -> None:
    """Replace the content of `path` with `data` atomically, mode 0600."""
    target = os.fspath(path)
    tmp = f"{target}.tmp"
    raw = data.encode() if isinstance(data, str) else data
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    if sync:
        dfd = os.open(os.path.dirname(target) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def require_private(path: str | os.PathLike[str], what: str) -> None:
    """Refuse (`InsecurePermissionsError`) a file or directory group or others may access.

    `what` names it for the message ("data directory", "tls.key", ...). A missing path passes
    (the process creates it private); an empty directory is made 0700 and passes."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if not mode & _OTHERS:
        return
    if stat.S_ISDIR(st.st_mode) and not any(os.scandir(p)):
        os.chmod(p, DIR_MODE)
        log.info("made the empty %s %s private (mode 0700)", what, p)
        return
    fix = f"chmod {'700' if stat.S_ISDIR(st.st_mode) else '600'} {p}"
    if stat.S_ISDIR(st.st_mode):
        fix = f"chmod -R go-rwx {p}"
    raise InsecurePermissionsError(
        f"the {what} {p} has mode {mode:04o}: other local accounts can read it",
        hint=f"run `{fix}` as its owner, then start again",
        path=str(p),
    )
