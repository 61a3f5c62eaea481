"""The ledger tests' real cluster: one `deploy/local.yaml` cluster per module.

A ledger's ensemble is every replica of its broker set (E = WQ = 2 here), so a cluster is ready
for ledgers only once both brokers are registered and alive; `tide cluster up` returns as soon
as each broker set has a master, which on a loaded machine can be before the second broker has
registered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.client.conftest import LocalCluster, start_cluster, stop_cluster
from tidelog.client.controllers import ControllerClient

REPLICAS = 2  # deploy/local.yaml


async def _replicas_alive(controllers: str, replicas: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with ControllerClient(controllers, rpc_timeout=1.0, total_timeout=2.0) as client:
        while True:
            reply = await client.describe_broker_sets()
            if (
                reply.liveness_known
                and reply.broker_sets
                and all(
                    b.role.has_master and sum(m.alive for m in b.members) >= replicas
                    for b in reply.broker_sets
                )
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not every broker set had {replicas} live replicas within {timeout:.0f}s"
                )
            await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    try:
        asyncio.run(_replicas_alive(c.controllers, REPLICAS, timeout=60.0))
        yield c
    finally:
        stop_cluster(c)
