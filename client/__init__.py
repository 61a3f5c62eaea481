"""The Python client: producer, consumer group member, reader and admin.

    from tidelog.client import Client
    with Client("127.0.0.1:9701") as client:
        client.admin().create_topic("orders", queues=4)
        receipt = client.producer().send("orders", b"hello", key="customer-1")
        with client.consumer(group="billing", topic="orders") as consumer:
            for message in consumer.poll(max_messages=100, timeout=1.0):
                ...
            consumer.commit()

The synchronous API runs the asyncio implementation (`tidelog.client.aio`) on one background
event loop per Client (`client.runner`, a `tidelog.client.runner.LoopThread`): every method of the
sync objects is the async method, run there. Code that already runs an event loop uses
`tidelog.client.aio.AsyncClient` directly. The ledger API builds on this package (never the other
way round): `tidelog.ledger.Ledgers(client)` and `tidelog.ledger.SegmentedLog(client, name)`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them
    from tidelog.client.aio import (
        AsyncAdmin,
        AsyncClient,
        AsyncConsumer,
        AsyncProducer,
        AsyncReader,
        ConsumedMessage,
        OutMessage,
        RebalanceListener,
        Receipt,
    )
    from tidelog.client.runner import LoopThread, SyncFacade
    from tidelog.client.sync import Admin, Client, Consumer, Producer, Reader

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "Client",
    "ConsumedMessage",
    "Consumer",
    "LoopThread",
    "OutMessage",
    "Producer",
    "Reader",
    "RebalanceListener",
    "Receipt",
    "SyncFacade",
]

# The package holds layers apart (docs/ARCHITECTURE.md §2.2): the broker imports the transport
# below the clients (tidelog.client.transport, .controllers, .modes), and importing those must not
# load the clients above it. The names of the client API load on first use.
_LAZY = {
    "Client": "tidelog.client.sync",
    "Producer": "tidelog.client.sync",
    "Consumer": "tidelog.client.sync",
    "Reader": "tidelog.client.sync",
    "Admin": "tidelog.client.sync",
    "AsyncAdmin": "tidelog.client.aio",
    "AsyncClient": "tidelog.client.aio",
    "AsyncConsumer": "tidelog.client.aio",
    "AsyncProducer": "tidelog.client.aio",
    "AsyncReader": "tidelog.client.aio",
    "ConsumedMessage": "tidelog.client.aio",
    "OutMessage": "tidelog.client.aio",
    "RebalanceListener": "tidelog.client.aio",
    "Receipt": "tidelog.client.aio",
    "LoopThread": "tidelog.client.runner",
    "SyncFacade": "tidelog.client.runner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
