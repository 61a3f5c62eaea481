"""The controller's Raft snapshot file, written by a thread of its own rather than the Raft thread.

PySyncObj writes a log compaction's snapshot in its Raft thread: with a million ledgers that took
6.6 s, during which the controller applied no command (a ledger's recovery open, an election, a
SyncStateSet change all waited). Forking to write it, PySyncObj's other way, is unsafe in a
process running gRPC's threads (the child died of a segmentation fault). Through PySyncObj's
serializer hooks (`SyncObjConf`'s `serializer`, `deserializer`, `serializeChecker`), this module
owns the file instead:

- `SnapshotWriter.serialize` runs in the Raft thread when PySyncObj compacts, at the log index the
  snapshot covers: it captures the state (controller/snapshot.py `capture`: the small fields
  encoded, references to the rest; tens of milliseconds at a million ledgers) and starts a thread
  that encodes the capture in pieces into `<snapshot>.writing`, syncing it at the end.
- `SnapshotWriter.check` runs in the Raft thread at every tick: SERIALIZING while the thread
  writes; once it is done, the synced file is renamed over the snapshot (the directory synced)
  and it answers SUCCESS, upon which PySyncObj cuts the journal below the snapshot: the order
  PySyncObj's own writer has (controller/raftdisk.py aligns a journal left uncut by a stop
  between the two). A failed write answers FAILED; PySyncObj tries again later.
- `SnapshotWriter.load` reads a snapshot (at a start, or one a leader sent): this format, or
  PySyncObj's own (gzip of a pickle) that earlier versions wrote; it restores the machine's state
  and returns Raft's part (the last two entries the snapshot covers, and the cluster).

PySyncObj renames `<snapshot>.tmp` over the snapshot right after `serialize` returns; `serialize`
leaves no such file (it removes a stale one), so that rename fails, harmlessly: the status comes
from `check`.

The file: `MAGIC`, then frames, each a 4-byte big-endian length and the zlib stream (level 1) of
one pickled piece of plain data: first Raft's part, then the state's pieces (`snapshot.parts`),
last `{"end": pieces}`. A file without its end frame, or with a frame that does not decode, is
refused: it is torn.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.config import SERIALIZER_STATE

from tidelog.controller import snapshot
from tidelog.controller.raftdisk import durable_replace
from tidelog.controller.state import ControllerState

log = logging.getLogger(__name__)

MAGIC = b"tidelog controller snapshot 1\n"
_LENGTH = struct.Struct(">I")
GZIP_MAGIC = b"\x1f\x8b"  # PySyncObj's own format (versions before this file)
LEGACY_FORMATS = (1, 2)  # the consumer data earlier versions stored: 1 plain, 2 packed

RaftPart = tuple[Any, Any, Any]  # the last entry, the entry before it, the cluster's nodes


# Entries per piece, and how long the writing thread rests after each piece, as a share of the
# time the piece took. A thread that encodes without rest takes the interpreter from the Raft and
# gRPC threads for a switch interval (5 ms) at each of their turns: a recovery open at a million
# ledgers took 45 ms while a snapshot was written, 16 ms otherwise (bench/RESULTS.md). Resting as
# long as it works halves its share, and the write takes twice as long.
PIECE_ENTRIES = 5_000
REST_SHARE = 1.0


def write(path: Path, raft: RaftPart, capture: snapshot.Capture, rest_share: float = 0.0) -> int:
    """Write `capture` with Raft's part to `path`, synced; the file's size. With `rest_share`,
    the caller sleeps that share of each piece's time after it (see REST_SHARE)."""
    with open(path, "wb") as f:
        f.write(MAGIC)
        count = 0
        _frame(f, {"raft": raft})
        started = time.perf_counter()
        for piece in snapshot.parts(capture, PIECE_ENTRIES):
            _frame(f, piece)
            count += 1
            if rest_share:
                now = time.perf_counter()
                time.sleep((now - started) * rest_share)
                started = time.perf_counter()
        _frame(f, {"end": count})
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _frame(f: BinaryIO, piece: dict[str, Any]) -> None:
    blob = zlib.compress(pickle.dumps(piece, protocol=5), 1)
    f.write(_LENGTH.pack(len(blob)))
    f.write(blob)


def _blobs(data: bytes, path: Path) -> Iterator[tuple[int, bytes]]:
    """Each frame of a file of this format as (its byte offset, its zlib stream), not decoded;
    ValueError where a frame is cut off."""
    at = len(MAGIC)
    while at < len(data):
        if at + _LENGTH.size > len(data):
            raise ValueError(f"{path}: torn at byte {at} (a frame's length cut off)")
        (n,) = _LENGTH.unpack_from(data, at)
        if at + _LENGTH.size + n > len(data):
            raise ValueError(f"{path}: torn at byte {at} (a frame of {n} bytes cut off)")
        yield at, data[at + _LENGTH.size : at + _LENGTH.size + n]
        at += _LENGTH.size + n


def _decoded(at: int, blob: bytes, path: Path) -> dict[str, Any]:
    try:
        piece = pickle.loads(zlib.decompress(blob))
    except (zlib.error, pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"{path}: the frame at byte {at} does not decode: {exc}") from None
    if not isinstance(piece, dict):
        raise ValueError(f"{path}: the frame at byte {at} is not a mapping")
    return piece


def _frames(data: bytes, path: Path) -> Iterator[dict[str, Any]]:
    """The pieces of a file of this format, the end frame checked; ValueError when torn."""
    count = -1
    for at, blob in _blobs(data, path):
        piece = _decoded(at, blob, path)
        count += 1
        if "end" in piece:
            if piece["end"] != count - 1 or at + _LENGTH.size + len(blob) != len(data):
                raise ValueError(f"{path}: its end frame does not match its {count - 1} pieces")
            return
        yield piece
    raise ValueError(f"{path}: torn (no end frame)")


def _contents(path: Path) -> tuple[bytes, bool]:
    """A snapshot file's bytes, and whether they are of PySyncObj's format (earlier versions');
    ValueError when neither format's."""
    data = path.read_bytes()
    legacy = data.startswith(GZIP_MAGIC)
    if not legacy and not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a controller snapshot")
    return data, legacy


def _raft_first(pieces: Iterator[dict[str, Any]], path: Path) -> RaftPart:
    first = next(pieces, None)
    if first is None or "raft" not in first:
        raise ValueError(f"{path}: no Raft part first")
    return tuple(first["raft"])  # type: ignore[return-value]


def read(path: Path, max_meta_value_bytes: int) -> tuple[ControllerState, RaftPart]:
    """The state and Raft's part a snapshot file holds (either format); ValueError when the file
    is not a whole controller snapshot."""
    data, legacy = _contents(path)
    if legacy:
        return _read_legacy(data, path, max_meta_value_bytes)
    pieces = _frames(data, path)
    raft = _raft_first(pieces, path)
    state = ControllerState(max_meta_value_bytes=max_meta_value_bytes)
    snapshot.restore_parts(state, pieces)
    state.check_invariants()
    return state, raft


def read_raft(path: Path) -> RaftPart:
    """Only Raft's part of a snapshot file (either format): the last two entries it covers and
    the cluster. This format's first frame is decoded alone; an earlier format is read whole."""
    data, legacy = _contents(path)
    if legacy:
        return _read_legacy(data, path, 1 << 62)[1]
    return _raft_first(_frames(data, path), path)


def _read_legacy(data: bytes, path: Path, max_meta_value_bytes: int) -> tuple[ControllerState, RaftPart]:
    try:
        whole = pysyncobj_pickle.loads(gzip.decompress(data))
        consumer = whole[0][1]
    except Exception as exc:  # noqa: BLE001 - whatever a torn gzip or pickle raises
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(consumer, dict) or consumer.get("format") not in LEGACY_FORMATS:
        raise ValueError(f"{path}: not a controller snapshot")
    doc = consumer["state"] if consumer["format"] == 1 else snapshot.unpack(consumer["packed"])
    state = ControllerState.from_dict(doc, max_meta_value_bytes=max_meta_value_bytes)
    return state, (whole[1], whole[2], whole[3])


def check(path: Path) -> None:
    """ValueError unless `path` (when it exists) is a whole snapshot: every frame there and the
    end frame last (read, not decoded, for this format; an earlier format is decoded whole)."""
    if not path.exists():
        return
    data, legacy = _contents(path)
    if legacy:
        _read_legacy(data, path, 1 << 62)
        return
    last = collections.deque(_blobs(data, path), maxlen=1)  # every frame walked, the last kept
    if not last or "end" not in _decoded(*last[0], path):
        raise ValueError(f"{path}: torn (no end frame)")


class SnapshotWriter:
    """PySyncObj's serializer hooks (`serialize`, `load`, `check`) over one snapshot path.

    `capture_state` is called in the Raft thread and returns the state's capture (taken under the
    machine's lock); `restore_state` installs a state read from a snapshot.

    Once `serialize` has returned, PySyncObj serializes nothing more and sends no snapshot to a
    follower until `check` answers SUCCESS or FAILED, so every path answers one of them: a capture
    or a thread that fails to start is a FAILED write. A snapshot loaded meanwhile (one a leader
    sent) makes the write under way stale: its file would put an older state over the one just
    loaded, with a journal that no longer starts where it ends, so it is dropped (FAILED). After a
    failed write `check` answers SERIALIZING for `RETRY_AFTER_S` before FAILED, so that a full
    disk is not written to again at every tick."""

    RETRY_AFTER_S = 10.0

    def __init__(
        self,
        path: Path,
        capture_state: Callable[[], snapshot.Capture],
        restore_state: Callable[[ControllerState], None],
        max_meta_value_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.writing = path.with_name(path.name + ".writing")
        self._capture_state = capture_state
        self._restore_state = restore_state
        self._max_meta_value_bytes = max_meta_value_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = False  # from `serialize` until `check` reports its outcome
        self._thread: threading.Thread | None = None
        self._outcome: bool | None = None  # the write's, once it ended
        self._failed_at = 0.0
        self._generation = 0  # moved by every load: a write begun before one is stale
        self._write_generation = 0

    def serialize(self, tmp_path: str, raft: RaftPart) -> None:
        """Start writing a snapshot of the state now (Raft thread, at the index `raft` ends at)."""
        with self._lock:
            if self._busy:
                return  # PySyncObj asks only when `check` said NOT_SERIALIZING
            self._busy, self._outcome = True, None
            self._write_generation = self._generation
        # PySyncObj renames this over the snapshot once we return: it must not exist
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp_path)
        try:
            started = self._clock()
            captured = self._capture_state()
            took_ms = (self._clock() - started) * 1000
            thread = threading.Thread(
                target=self._write, args=(raft, captured, took_ms), name="raft-snapshot", daemon=True
            )
            thread.start()
        except Exception:  # noqa: BLE001 - reported by `check` as a failed write
            log.exception("starting the controller snapshot of entry %s failed", raft[0][1])
            self._ended(False)
            return
        with self._lock:
            self._thread = thread

    def _write(self, raft: RaftPart, captured: snapshot.Capture, capture_ms: float) -> None:
        started = time.monotonic()
        try:
            size = write(self.writing, raft, captured, REST_SHARE)
        except Exception:  # noqa: BLE001 - a disk error: reported by `check`, tried again later
            log.exception("writing the controller snapshot %s failed", self.writing)
            self._ended(False)
            return
        log.info(
            "controller snapshot of entry %s written: %d topics, %d metadata entries, %d bytes "
            "(captured in %.0f ms in the Raft thread, written in %.2f s beside it)",
            raft[0][1],
            len(captured.topics),
            len(captured.metadata),
            size,
            capture_ms,
            time.monotonic() - started,
        )
        self._ended(True)

    def _ended(self, ok: bool) -> None:
        with self._lock:
            if not ok:
                self._failed_at = self._clock()
            self._outcome = ok

    def check(self) -> int:
        """PySyncObj's serializer status (Raft thread); on a finished write, its file put in place."""
        with self._lock:
            if not self._busy:
                return SERIALIZER_STATE.NOT_SERIALIZING  # type: ignore[no-any-return]
            ok = self._outcome
            if ok is None or (not ok and self._clock() - self._failed_at < self.RETRY_AFTER_S):
                return SERIALIZER_STATE.SERIALIZING  # type: ignore[no-any-return]
            if ok and self._write_generation != self._generation:
                # `load` and `check` both run in the Raft thread: no load comes between this and
                # the rename below
                log.warning("a snapshot was loaded while one was written: the written one is dropped")
                ok = False
        if ok:
            try:
                durable_replace(str(self.writing), str(self.path))
            except OSError:
                log.exception("putting the controller snapshot %s in place failed", self.writing)
                ok = False
        if not ok:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.writing)
        with self._lock:
            self._busy, self._thread, self._outcome = False, None, None
        return SERIALIZER_STATE.SUCCESS if ok else SERIALIZER_STATE.FAILED  # type: ignore[no-any-return]

    def load(self, path: str) -> RaftPart:
        """PySyncObj's deserializer: restore the state a snapshot file holds; Raft's part. A write
        under way is stale from here on (see the class's docstring)."""
        with self._lock:
            self._generation += 1
        state, raft = read(Path(path), self._max_meta_value_bytes)
        self._restore_state(state)
        return raft

    def wait(self, timeout: float) -> bool:
        """Whether a write under way (if any) ended within `timeout` seconds (for a clean stop)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True
