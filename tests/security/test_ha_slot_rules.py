"""The HA port's slot rules alone (ha/master.py `HaSlots`), in process with stand-in transports:
which unproven connection a new one displaces, that proven ones are counted apart, and that an
unproven one is closed at its handshake deadline."""

from __future__ import annotations

import asyncio

from tidelog.ha.master import HaSlots
from tidelog.tasks import within


class _Transport:
    def __init__(self) -> None:
        self.aborted = asyncio.Event()

    def abort(self) -> None:
        self.aborted.set()


def test_a_new_connection_displaces_the_oldest_silent_one_first() -> None:
    async def go() -> None:
        slots = HaSlots(max_unproven=3, max_proven=2, handshake_timeout=60)
        t = [_Transport() for _ in range(6)]
        a, b, c = (slots.admit(x) for x in t[:3])  # type: ignore[arg-type]
        a.hello()  # the oldest is trying: a silent one goes before it
        slots.admit(t[3])  # type: ignore[arg-type]
        assert [x.aborted.is_set() for x in t[:4]] == [False, True, False, False]
        c.hello()
        e = slots.admit(t[4])  # type: ignore[arg-type]
        assert t[3].aborted.is_set()  # the only silent one left
        e.hello()
        slots.admit(t[5])  # type: ignore[arg-type]
        assert t[0].aborted.is_set()  # every one has spoken: the oldest goes
        assert b.proven() is False  # displaced: it cannot prove any more
        assert slots.evicted == 3 and len(slots.unproven) == 3

    asyncio.run(go())


def test_proven_connections_are_counted_apart_and_bounded() -> None:
    async def go() -> None:
        slots = HaSlots(max_unproven=1, max_proven=1, handshake_timeout=60)
        first, second = _Transport(), _Transport()
        one = slots.admit(first)  # type: ignore[arg-type]
        assert not one.is_proven
        assert one.proven()
        assert one.is_proven  # its closing is logged as a slave's, not rate-limited as a stranger's
        two = slots.admit(second)  # type: ignore[arg-type]
        assert not first.aborted.is_set()  # a proven connection is never displaced
        assert not two.proven()  # past max_proven: the caller closes it
        assert not two.is_proven
        one.release()
        one.release()  # idempotent
        assert not slots.proven and not slots.unproven

    asyncio.run(go())


def test_an_unproven_connection_is_closed_at_its_deadline_a_proven_one_is_not() -> None:
    async def go() -> None:
        slots = HaSlots(max_unproven=4, max_proven=4, handshake_timeout=0.05)
        late, quick = _Transport(), _Transport()
        slots.admit(late)  # type: ignore[arg-type]
        proven = slots.admit(quick)  # type: ignore[arg-type]
        assert proven.proven() and proven.timer is None  # no deadline left to close it
        await within(late.aborted.wait(), 5)
        assert not quick.aborted.is_set()

    asyncio.run(go())
