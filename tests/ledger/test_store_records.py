"""The ledger's add records (ledger/store.py): the one-step properties block every add pays for
is the block `encode_properties` lays out for the same fields, and the index a master folds from
the entries it just appended (`note_adds`) is the index a replica reads back from its log."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog import record as rec
from tidelog.dataport_frames import LedgerEntry
from tidelog.errors import InvalidArgumentError
from tidelog.ledger.metadata import new_ledger_metadata
from tidelog.ledger.store import (
    KIND_ADD,
    KIND_RECOVERY_ADD,
    LEDGER_TOPIC,
    LedgerIndex,
    add_message,
    add_properties,
    create_message,
)

ids = st.integers(min_value=-1, max_value=2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from([KIND_ADD, KIND_RECOVERY_ADD]),
    ledger_id=st.integers(min_value=0, max_value=2**64 - 1),
    entry_id=ids,
    lac=ids,
    length=st.integers(min_value=0, max_value=2**63 - 1),
    digest=st.binary(max_size=64),
)
def test_an_add_records_properties_are_the_dicts_layout(
    kind: str, ledger_id: int, entry_id: int, lac: int, length: int, digest: bytes
) -> None:
    fields = {
        "k": kind,
        "l": str(ledger_id),
        "e": str(entry_id),
        "lac": str(lac),
        "len": str(length),
        "d": digest.hex(),
    }
    block = add_properties(kind, ledger_id, entry_id, lac, length, digest)
    assert block == rec.encode_properties(None, None, fields)
    assert rec.decode_properties(block) == fields


def open_log(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=1 << 20, flush="async", flush_interval_ms=10**6)


def entries(first: int, n: int) -> list[LedgerEntry]:
    return [
        LedgerEntry(i, i - 1, 100 * (i + 1), i.to_bytes(4, "big"), bytes([i % 251]) * 100)
        for i in range(first, first + n)
    ]


def test_the_index_folded_from_the_entries_is_the_index_read_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    try:
        log.append([create_message(new_ledger_metadata(7, "a", [0, 1], 2, password=b"pw"))])
        master = LedgerIndex(log)
        # the view as the CREATE made it; asking `view` again would read the log (refresh)
        folded = master.view(7)
        assert folded is not None and not folded.entries
        for first, n, kind in ((0, 5, KIND_ADD), (5, 1, KIND_RECOVERY_ADD), (6, 30, KIND_ADD)):
            batch = entries(first, n)
            placed = log.append([add_message(7, e, kind) for e in batch])
            master.note_adds(7, kind, placed, batch)
        read_back = LedgerIndex(log).view(7)
        assert read_back is not None
        assert folded.entries == read_back.entries and len(folded.entries) == 36
        assert (
            (folded.last_entry, folded.carried_lac)
            == (read_back.last_entry, read_back.carried_lac)
            == (35, 34)
        )
        for e in entries(0, 36):
            assert log.read_at(folded.entries[e.entry_id].offset).body == e.data
            assert folded.entries[e.entry_id].digest == e.digest
    finally:
        log.close()


def test_adds_not_folded_in_order_are_read_back_instead(tmp_path: Path) -> None:
    """A record appended but not noted (another writer's) makes `note_adds` read the log."""
    log = open_log(tmp_path)
    try:
        log.append([create_message(new_ledger_metadata(7, "a", [0, 1], 2, password=b"pw"))])
        index = LedgerIndex(log)
        index.view(7)
        unnoted = entries(0, 1)[0]
        log.append([add_message(7, unnoted)])
        batch = entries(1, 3)
        placed = log.append([add_message(7, e) for e in batch])
        index.note_adds(7, KIND_ADD, placed, batch)
        view = index.view(7)
        assert view is not None and sorted(view.entries) == [0, 1, 2, 3]
    finally:
        log.close()


@pytest.mark.parametrize(
    "extra",
    [{"key": "k"}, {"tags": "t"}, {"properties": {"a": "b"}}],
    ids=["key", "tags", "properties"],
)
def test_encoded_properties_come_alone(tmp_path: Path, extra: dict) -> None:
    log = open_log(tmp_path)
    try:
        block = add_properties(KIND_ADD, 1, 0, -1, 1, b"")
        with pytest.raises(InvalidArgumentError, match="alone"):
            log.append([Message(LEDGER_TOPIC, 0, b"x", encoded_properties=block, **extra)])
        assert log.max_offset == 0  # nothing of the batch was written
    finally:
        log.close()
