"""The child process of the commit-log crash test: append, await durability, acknowledge.

Run as a script: `python crash_writer.py LOG_DIR SHADOW_DIR SEED`. It opens a CommitLog with
flush="sync" and small segments in LOG_DIR and runs a few concurrent asyncio appenders. Each
appends a batch of messages whose bodies are a pure function of (seed, sequence number) — see
`body_for` — awaits `log.flushed(end)`, and only then prints one "ACK <seq>" line per message and
flushes stdout. The parent kills it with SIGKILL at a moment of its choosing.

A SIGKILL alone cannot show a missing fsync: the page cache outlives the process. So this process
also keeps SHADOW_DIR, a copy of LOG_DIR as a power cut at that moment would leave it: only bytes
covered by a completed fsync/fdatasync are in it. `os.fsync` and `os.fdatasync` are wrapped so
that, before returning, they copy the synced file (atomically, by rename) into the shadow; a
directory fsync makes the shadow directory's names match (new files appear empty until their own
fsync); renames are mirrored. The parent recovers and checks both directories.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

from tidelog.commitlog import CommitLog, Message

TOPIC = "crash"
QUEUES = 2
SEGMENT_BYTES = 64 * 1024
APPENDERS = 4
MAX_BODY_EXTRA = 3000


def body_for(seed: int, seq: int) -> bytes:
    """The body of message `seq`: its number first (recognisable), then seeded random bytes."""
    r = random.Random(f"{seed}:{seq}")
    return f"seq={seq:08d};".encode() + r.randbytes(r.randint(0, MAX_BODY_EXTRA))


def queue_for(seq: int) -> int:
    return seq % QUEUES


def seq_of(body: bytes) -> int:
    """The sequence number a body starts with."""
    if not body.startswith(b"seq=") or body[12:13] != b";":
        raise ValueError(f"not a crash-test body: {body[:16]!r}")
    return int(body[4:12])


class Shadow:
    """Mirror of what has been made durable under `root`, kept in `shadow`."""

    def __init__(self, root: str, shadow: str) -> None:
        self.root = os.path.realpath(root)
        self.shadow = os.path.realpath(shadow)
        self._lock = threading.Lock()  # the flusher thread and the event loop both sync
        self._fsync = os.fsync
        self._fdatasync = os.fdatasync
        self._replace = os.replace
        self._rename = os.rename

    def install(self) -> None:
        os.makedirs(self.shadow, exist_ok=True)
        os.fsync = self._wrap(self._fsync)
        os.fdatasync = self._wrap(self._fdatasync)
        os.replace = self._wrap_rename(self._replace)
        os.rename = self._wrap_rename(self._rename)

    def _mirror_path(self, path: str) -> str | None:
        path = os.path.realpath(path)
        if path != self.root and not path.startswith(self.root + os.sep):
            return None
        return os.path.join(self.shadow, os.path.relpath(path, self.root))

    def _wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def synced(fd: int) -> None:
            real(fd)
            # After the real sync: everything written before the call is now in the shadow.
            self._record(fd)

        return synced

    def _wrap_rename(self, real: Callable[..., None]) -> Callable[..., None]:
        def renamed(src: str, dst: str, *args: Any, **kwargs: Any) -> None:
            real(src, dst, *args, **kwargs)
            s, d = self._mirror_path(os.fspath(src)), self._mirror_path(os.fspath(dst))
            with self._lock:
                if s is not None and d is not None and os.path.exists(s):
                    self._replace(s, d)

        return renamed

    def _record(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        target = self._mirror_path(path)
        if target is None:
            return
        with self._lock:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self._sync_names(path, target)
                return
            # Read by path: some files are opened write-only.
            with open(path, "rb") as f:
                data = f.read()
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = target + ".shadow-tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            self._replace(tmp, target)

    def _sync_names(self, real_dir: str, shadow_dir: str) -> None:
        os.makedirs(shadow_dir, exist_ok=True)
        names = set(os.listdir(real_dir))
        for name in os.listdir(shadow_dir):
            if name not in names and os.path.isfile(os.path.join(shadow_dir, name)):
                os.unlink(os.path.join(shadow_dir, name))
        for name in names:
            src = os.path.join(real_dir, name)
            dst = os.path.join(shadow_dir, name)
            if os.path.isfile(src) and not os.path.exists(dst):
                open(dst, "wb").close()  # the name is durable, its contents are not yet


async def run(directory: str, seed: int) -> None:
    log = CommitLog.open(directory, segment_bytes=SEGMENT_BYTES, flush="sync")
    rng = random.Random(seed)
    next_seq = 0
    out = sys.stdout

    async def appender() -> None:
        nonlocal next_seq
        while True:
            n = rng.randint(1, 6)
            seqs = range(next_seq, next_seq + n)
            next_seq += n
            placed = log.append([Message(TOPIC, queue_for(s), body_for(seed, s)) for s in seqs])
            await log.flushed(placed[-1].phys_offset + placed[-1].size)
            # Acknowledge only now: every message printed here must survive the kill.
            out.write("".join(f"ACK {s}\n" for s in seqs))
            out.flush()

    await asyncio.gather(*(appender() for _ in range(APPENDERS)))


def main(argv: list[str]) -> None:
    directory, shadow, seed = argv[0], argv[1], int(argv[2])
    os.makedirs(directory, exist_ok=True)
    Shadow(directory, shadow).install()
    asyncio.run(run(directory, seed))


if __name__ == "__main__":
    main(sys.argv[1:])
