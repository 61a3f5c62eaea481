"""The controller snapshot as the Raft node stores it (controller/snapshot.py `pack`): the state's
plain data pickled and compressed before PySyncObj's own level-9 gzip, which spent seconds on
100,000 topics in the Raft thread; snapshots of the format before (the plain data itself) still
restore."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import pickle
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj import pickle as pysyncobj_pickle

from tests.controller.inproc import compacting, create_keys, single_node
from tidelog.controller import snapshot
from tidelog.controller.model import MetaEntry, Topic
from tidelog.controller.raft import _Machine
from tidelog.controller.state import ControllerState


def big_state(topics: int = 3000) -> ControllerState:
    s = ControllerState()
    for i in range(topics):
        s.topics[f"t-{i:05d}"] = Topic(f"t-{i:05d}", {"broker-a": 8}, created_ms=i, generation=i + 1)
        s.metadata[f"k/{i}"] = MetaEntry(f"k/{i}", b"value %d" % i, 1, i)
    s.next_topic_generation = topics + 1
    return s


def test_a_packed_snapshot_restores_the_same_state() -> None:
    s = big_state()
    assert ControllerState.from_dict(snapshot.unpack(snapshot.pack(s.to_dict()))) == s


def test_what_pysyncobj_gzips_is_already_small() -> None:
    """PySyncObj pickles and gzips what `_serialize` returns: a packed blob, not the plain data
    (7.4 MB at 100,000 topics), so level 9 has little to do."""
    machine = _Machine(max_meta_value_bytes=1 << 20)
    machine.state = big_state()
    out = machine._serialize()
    assert out["format"] == 2 and isinstance(out["packed"], bytes)
    plain = len(pysyncobj_pickle.dumps({"format": 1, "state": machine.state.to_dict()}))
    # (the plain data is itself more compact since format 4's metadata columns)
    assert len(pysyncobj_pickle.dumps(out)) * 4 < plain


def test_unpack_refuses_what_is_not_a_packed_snapshot() -> None:
    for blob in (b"", b"not zlib", snapshot.pack({"a": 1})[:-3]):
        with pytest.raises(ValueError, match="not a packed controller snapshot"):
            snapshot.unpack(blob)

    with pytest.raises(ValueError, match="not a mapping"):
        snapshot.unpack(zlib.compress(pickle.dumps([1, 2])))


def test_both_formats_restore_into_the_machine() -> None:
    s = big_state(50)
    for data in ({"format": 1, "state": s.to_dict()}, {"format": 2, "packed": snapshot.pack(s.to_dict())}):
        machine = _Machine(max_meta_value_bytes=1 << 20)
        machine._deserialize(data)
        assert machine.state == s


@pytest.mark.slow
def test_a_node_restarts_from_a_snapshot_of_the_format_before(tmp_path: Path) -> None:
    opts = compacting()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 12)

    asyncio.run(first_life())
    path = tmp_path / "data" / "c1" / "raft.snapshot"
    with gzip.open(path, "rb") as f:
        data = pysyncobj_pickle.load(f)
    consumer = data[0][1]
    assert consumer["format"] == 2
    # rewritten as the version before wrote it: the plain data itself
    data[0][1] = {"format": 1, "state": snapshot.unpack(consumer["packed"])}
    with gzip.open(path, "wb") as f:
        pysyncobj_pickle.dump(data, f)

    async def second_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            entries = await client.meta_list("k/")
            assert [e.key for e in entries] == [f"k/{i:02d}" for i in range(12)]

    asyncio.run(second_life())


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.tuples(st.binary(max_size=40), st.integers(1, 9), st.integers(0, 2**40)),
        max_size=30,
    )
)
def test_metadata_columns_round_trip_through_json(entries: dict[str, tuple[bytes, int, int]]) -> None:
    s = ControllerState()
    for key, (value, version, modified) in entries.items():
        s.metadata[key] = MetaEntry(key, value, version, modified)
    doc = json.loads(json.dumps(s.to_dict()))
    assert doc["format"] == snapshot.SNAPSHOT_FORMAT == 4
    assert ControllerState.from_dict(doc) == s


def test_a_format_3_snapshot_with_an_entry_per_dict_still_restores() -> None:
    s = big_state(40)
    doc = s.to_dict()
    doc["format"] = 3
    doc["metadata"] = [
        {
            "key": e.key,
            "value": base64.b64encode(e.value).decode(),
            "version": e.version,
            "modified_ms": e.modified_ms,
        }
        for _, e in sorted(s.metadata.items())
    ]
    assert ControllerState.from_dict(doc) == s


def test_metadata_columns_that_disagree_are_refused() -> None:
    doc = big_state(5).to_dict()
    doc["metadata"]["lengths"][0] += 1
    with pytest.raises(ValueError, match="metadata columns do not agree"):
        ControllerState.from_dict(doc)
