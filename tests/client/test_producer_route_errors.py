"""A send whose route lookup fails with something other than a tidelog error (a bug, a library's
exception) answers with that error instead of waiting forever (client/aio.py::AsyncProducer._enqueue).
Unit level: the client below the producer is a stub whose route lookup raises."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import pytest

from tidelog.client.aio import AsyncProducer
from tidelog.errors import TopicNotFoundError
from tidelog.tasks import within


class _RouteFails:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def cached_route(self, topic: str) -> None:
        return None

    async def route(self, topic: str, **_: Any) -> Any:
        raise self.exc


@pytest.mark.parametrize("exc", [RuntimeError("a bug in the lookup"), TopicNotFoundError("no topic orders")])
def test_a_keyed_send_gets_the_route_lookups_error_instead_of_hanging(exc: BaseException) -> None:
    async def scenario() -> None:
        producer = AsyncProducer(_RouteFails(exc), send_timeout=5.0)  # type: ignore[arg-type]
        fut = producer.send("orders", b"body", key="customer-1")
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            await within(fut, 10)
        with contextlib.suppress(BaseException):
            await producer.flush()  # the lookup task itself ends (loudly, for the bug)

    asyncio.run(scenario())
