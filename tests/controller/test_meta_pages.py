"""MetaList a page at a time (controller/service.py, client/controllers.py `meta_list`): a
million ledgers' entries in one reply passed gRPC's message limit. Over a real node's gRPC port:
the raw call answers a page and where the next starts; the client's listing asks page after page
and gets every entry in key order; limit 0 is the whole listing, as before pages; a bad limit is
refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.controller.inproc import single_node
from tidelog.errors import InvalidArgumentError
from tidelog.proto import controller_pb2 as pb


def test_metadata_is_listed_a_page_at_a_time(tmp_path: Path) -> None:
    async def go() -> None:
        async with single_node(tmp_path) as (_node, client):
            keys = [f"k/{i:02d}" for i in range(25)]
            for k in reversed(keys):
                await client.meta_create(k, b"v")
            await client.meta_create("other/1", b"v")

            first = await client.call("admin", "MetaList", pb.MetaListRequest(prefix="k/", limit=10))
            assert [e.key for e in first.entries] == keys[:10] and first.next_start_after == "k/09"
            last = await client.call(
                "admin", "MetaList", pb.MetaListRequest(prefix="k/", start_after="k/19", limit=10)
            )
            assert [e.key for e in last.entries] == keys[20:] and last.next_start_after == ""
            whole = await client.call("admin", "MetaList", pb.MetaListRequest(prefix="k/"))
            assert [e.key for e in whole.entries] == keys and whole.next_start_after == ""

            assert [e.key for e in await client.meta_list("k/", page=7)] == keys
            assert [e.key for e in await client.meta_list("", page=4)] == [*keys, "other/1"]

            with pytest.raises(InvalidArgumentError, match="limit must be in"):
                await client.call("admin", "MetaList", pb.MetaListRequest(prefix="k/", limit=-1))

    asyncio.run(go())
