"""The controller snapshot codec (controller/snapshot.py): `pack`, the form versions before
controller/snapshotfile.py stored the state in (the plain data pickled and compressed under
PySyncObj's own gzip), round trips and refuses what it did not write; a node restarts from a
snapshot file of that earlier kind; the metadata columns round trip through JSON."""

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
from tidelog.controller import snapshot, snapshotfile
from tidelog.controller.model import MetaEntry, Topic
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


def test_unpack_refuses_what_is_not_a_packed_snapshot() -> None:
    for blob in (b"", b"not zlib", snapshot.pack({"a": 1})[:-3]):
        with pytest.raises(ValueError, match="not a packed controller snapshot"):
            snapshot.unpack(blob)

    with pytest.raises(ValueError, match="not a mapping"):
        snapshot.unpack(zlib.compress(pickle.dumps([1, 2])))


@pytest.mark.slow
def test_a_node_restarts_from_a_snapshot_of_the_format_before(tmp_path: Path) -> None:
    opts = compacting()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 12)

    asyncio.run(first_life())
    path = tmp_path / "data" / "c1" / "raft.snapshot"
    state, (last, before, cluster) = snapshotfile.read(path, 1 << 20)
    # rewritten as versions before controller/snapshotfile.py wrote it: PySyncObj's gzip of the
    # pickled consumers' data, format 1 (the plain data itself)
    data = [[{}, {"format": 1, "state": state.to_dict()}], last, before, cluster]
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
