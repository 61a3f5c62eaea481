"""A small tmpfs mounted for one test: a disk that really fills up (ENOSPC), and frees on demand.

Needs root (CI and the development machines run as root); elsewhere the test is skipped with
the reason. The mount is always removed by the test that made it (lazy unmount if still busy).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill a disk needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size_bytes: int) -> None:
    """Give the tmpfs mounted at `path` more room (as an operator frees or adds disk)."""
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(path)], check=True, capture_output=True)


def fill(path: Path, leave_bytes: int = 0) -> Path:
    """Write a filler file until the filesystem holding `path` has about `leave_bytes` free."""
    filler = path / "filler"
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize - leave_bytes
    with open(filler, "ab") as f:
        chunk = b"\0" * (64 << 10)
        while free > 0:
            try:
                f.write(chunk[: min(len(chunk), free)])
                f.flush()
            except OSError:
                break
            free -= len(chunk)
    return filler


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
