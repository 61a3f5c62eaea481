"""Fuzzing what a commit log reads back from its own files at open: the checkpoint
(commitlog/checkpoint.py), the epoch file (commitlog/epochs.py) and the segments recovery scans
(commitlog/recovery.py), then the reads of whatever it recovered (commitlog/reads.py).

Contract:
- the checkpoint reader returns None or a Checkpoint that one of its slots holds (magic and CRC
  intact), whatever the file's bytes;
- the epoch file reader returns epochs in the file's own order rule (epochs strictly ascending,
  starts never going back, none negative) or raises CorruptRecordError naming the file;
- an open either recovers, or raises CorruptRecordError naming a file of the log and an offset
  (damage below the flushed offset); after an open every queue it indexed reads back, or the
  read raises a typed error; reading raw chunks from the start answers whole records.

Every input is written to a fresh directory (a temporary one; put TMPDIR on a tmpfs for speed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator

from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import FUZZ, Check, Fuzzer, inputs, plain
from tests.fuzz.test_records import records
from tidelog.commitlog import CommitLog, checkpoint, epochs
from tidelog.commitlog import record as rec
from tidelog.errors import CorruptRecordError, TidelogError

SEG = 4096
_OFFSETS = struct.Struct(">qqq")  # flushed, confirm and consume-queue offsets of the checkpoint
_SLOT = checkpoint._SLOT
i64 = st.integers(-(2**63), 2**63 - 1)


# --- checkpoint ---------------------------------------------------------------------------


def _slot(magic: int, clean: int, seq: int, flushed: int, confirm: int, cq: int) -> bytes:
    body = _SLOT.pack(magic, 1, clean, seq, flushed, confirm, cq, 0)
    return (body + checkpoint._CRC.pack(crc32c(body))).ljust(checkpoint._SLOT_BYTES, b"\0")


slots = st.builds(
    _slot,
    st.sampled_from([checkpoint._MAGIC, checkpoint._MAGIC, 0]),
    st.integers(0, 1),
    st.integers(0, 2**64 - 1),
    i64,
    i64,
    i64,
)
checkpoint_files = st.lists(slots, min_size=1, max_size=2).map(b"".join)


def _slot_values(data: bytes) -> list[checkpoint.Checkpoint]:
    """What each intact slot of the file holds (the reference the reader is checked against)."""
    out = []
    for at in (0, checkpoint._SLOT_BYTES):
        raw = data[at : at + _SLOT.size + 4]
        if len(raw) == _SLOT.size + 4 and checkpoint._CRC.unpack_from(raw, _SLOT.size)[0] == crc32c(
            raw[: _SLOT.size]
        ):
            magic, _, clean, seq, flushed, confirm, cq, _ = _SLOT.unpack_from(raw)
            if magic == checkpoint._MAGIC:
                out.append(checkpoint.Checkpoint(flushed, confirm, cq, bool(clean), seq))
    return out


@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="tidelog-fuzz-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _checkpoint_check() -> Iterator[Check]:
    with _scratch() as root:

        def check(data: bytes) -> None:
            with open(os.path.join(root, checkpoint.CheckpointFile.FILE_NAME), "wb") as f:
                f.write(data)
            cp = checkpoint.CheckpointFile(root)
            try:
                intact = _slot_values(data)
                if not intact:
                    assert cp.loaded is None
                else:
                    assert cp.loaded == max(intact, key=lambda c: c.seq)
            finally:
                cp.close()

        yield check


# --- epoch file ---------------------------------------------------------------------------


def _epoch_doc(entries: list[list[object]], crc_ok: bool, extra: object) -> bytes:
    canonical = ";".join(f"{e}-{s}" for e, s in entries).encode() if entries else b""
    crc = crc32c(canonical) if crc_ok else 7
    doc = {"version": 1, "entries": entries, "crc": crc}
    if extra is not None:
        doc["entries"] = extra
    return json.dumps(doc).encode()


numbers = st.one_of(st.integers(-3, 2**64), st.sampled_from([1.5, "1", True, None]))
entries = st.lists(st.lists(numbers, min_size=2, max_size=2), max_size=4)
epoch_files = st.builds(
    _epoch_doc,
    entries,
    st.booleans(),
    st.none() | st.sampled_from([[], {}, 1, "x", [[1]], [[1, 2, 3]], [[float("inf"), 0]], [[1e300, 0]]]),
)


@contextlib.contextmanager
def _epoch_check() -> Iterator[Check]:
    with _scratch() as root:
        path = os.path.join(root, epochs.EpochFile.FILE_NAME)

        def check(data: bytes) -> None:
            with open(path, "wb") as f:
                f.write(data)
            try:
                pairs = epochs.EpochFile(root, lambda: 0).pairs()
            except CorruptRecordError as exc:
                assert exc.path == path
                return
            assert all(isinstance(e, int) and isinstance(s, int) and e >= 0 and s >= 0 for e, s in pairs)
            for (e1, s1), (e2, s2) in zip(pairs, pairs[1:], strict=False):
                assert e2 > e1 and s2 >= s1, f"out of order: {pairs}"

        yield check


# --- recovery -----------------------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    """A checkpoint's offsets and a segment's bytes: records (each naming its own offset), then
    maybe a torn tail or a blank marker."""
    data = b""
    for _ in range(draw(st.integers(0, 5))):
        data += draw(records(phys=len(data)))
    data = data[: SEG - 8]
    tail = draw(st.sampled_from([b"", b"\0" * 16, rec.blank_marker(SEG - len(data)), b"\x7d\xe1"]))
    flushed = draw(st.sampled_from([0, len(data), len(data) // 2, -1, 2**62]))
    confirm = draw(st.sampled_from([0, len(data), -5]))
    return _OFFSETS.pack(flushed, confirm, draw(st.sampled_from([0, len(data), 2**40]))) + data + tail


def _write_log(root: str, data: bytes) -> None:
    flushed, confirm, cq = _OFFSETS.unpack_from(data.ljust(_OFFSETS.size, b"\0"))
    body = data[_OFFSETS.size :]
    seg_dir = os.path.join(root, "commitlog")
    os.makedirs(seg_dir)
    for i in range(0, max(len(body), 1), SEG):
        with open(os.path.join(seg_dir, f"{i:020d}"), "wb") as f:
            f.write(body[i : i + SEG])
    cp = checkpoint.CheckpointFile(root)
    cp.write(flushed, confirm, cq)
    cp.close()


def _read_back(log: CommitLog) -> None:
    """Every indexed queue reads, and raw chunks from the start are whole records."""
    for topic, queue in list(log._core.queues.by_key):
        with contextlib.suppress(TidelogError):
            log.read(topic, queue, 0, 1000, confirmed_only=False)
    offset = log.min_offset
    while offset < log.max_offset:
        chunk, nxt = log.read_raw_chunk(offset, 1024)
        assert nxt > offset, "a raw read made no progress"
        offset = nxt


@contextlib.contextmanager
def _recovery_check() -> Iterator[Check]:
    with _scratch() as scratch:
        count = iter(range(1 << 62))

        def check(data: bytes) -> None:
            root = os.path.join(scratch, str(next(count)))
            try:
                _write_log(root, data)
                try:
                    log = CommitLog.open(root, segment_bytes=SEG, flush="async", flush_interval_ms=10**6)
                except CorruptRecordError as exc:
                    assert exc.path.startswith(root) and exc.offset >= 0, exc
                    return
                try:
                    _read_back(log)
                finally:
                    log.close()
            finally:
                shutil.rmtree(root, ignore_errors=True)

        yield check


FUZZERS = [
    Fuzzer("commitlog.checkpoint", checkpoint_files, _checkpoint_check),
    Fuzzer("commitlog.epochs", epoch_files, _epoch_check),
    Fuzzer("commitlog.recovery", logs(), _recovery_check),
]


@FUZZ
@given(inputs(checkpoint_files, max_random=1100))
def test_checkpoint_reader(data: bytes) -> None:
    with _checkpoint_check() as check:
        check(data)


@FUZZ
@given(inputs(epoch_files))
def test_epoch_file_reader(data: bytes) -> None:
    with _epoch_check() as check:
        check(data)


@FUZZ
@given(inputs(logs()))
def test_recovery(data: bytes) -> None:
    with _recovery_check() as check:
        check(data)


del plain  # every check here needs a directory
