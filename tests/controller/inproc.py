"""An in-process single controller node for fast service tests (same event loop as the test)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.procs import free_address
from tidelog.client.controllers import ControllerClient
from tidelog.controller.config import parse
from tidelog.controller.node import ControllerNode
from tidelog.tasks import within


@contextlib.asynccontextmanager
async def single_node(
    tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[ControllerNode, ControllerClient]]:
    raw: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "heartbeat_interval_ms": 300,
        "heartbeat_timeout_ms": 1500,
        "nodes": [{"id": "c1", "raft": free_address(), "grpc": free_address()}],
    }
    raw.update(overrides)
    cfg = parse(raw)
    node = ControllerNode(cfg)
    stop = asyncio.Event()
    task = asyncio.ensure_future(node.serve(stop))
    client = ControllerClient(cfg.self_node.grpc, total_timeout=10.0)
    try:
        # Serving once a write goes through: leader elected and barrier committed.
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            status = await client.cluster_status()
            if status.raft_state == "leader" and status.ready:
                break
            assert asyncio.get_running_loop().time() < deadline, "single node never became leader"
            await asyncio.sleep(0.05)
        yield node, client
    finally:
        await client.close()
        stop.set()
        await within(task, 15)


def compacting(entries: int = 4) -> dict[str, Any]:
    """`single_node` options of a node that compacts its Raft log every `entries` entries, so
    that a restart reads the snapshot and then the journal's tail."""
    nodes = [{"id": "c1", "raft": free_address(), "grpc": free_address()}]
    return {"nodes": nodes, "raft": {"log_compaction_min_entries": entries}}


async def create_keys(client: ControllerClient, count: int) -> None:
    """Metadata keys k/00, k/01, ... with values v0, v1, ..."""
    for i in range(count):
        await client.meta_create(f"k/{i:02d}", f"v{i}".encode())
