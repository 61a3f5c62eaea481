"""Delayed and half messages on a master (broker/rocketmqtx.py), on one in-process replica: each
reaches its topic once, not before its time or its commit, also when a predecessor's copy was
written without its state (the look-back); refused ends change nothing; orphans are checked, then
rolled back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.fuzz.replica import TOPIC, Master, master
from tidelog.broker import rocketmqrules as rules
from tidelog.broker import rocketmqtx
from tidelog.broker import txstate as tx
from tidelog.broker.rocketmqtx import DELAY_TOPIC, HALF_TOPIC, Scheduled
from tidelog.commitlog import Message, StoredMessage
from tidelog.errors import InvalidArgumentError, UnavailableError

STORED = rules.to_stored(
    message_id="client-1",
    message_type="DELAY",
    tag="t1",
    keys=["k1"],
    message_group="",
    born_host="h",
    user_properties={"p": "v"},
)


def in_topic(m: Master) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    for q in range(4):
        out += m.replica.log.read(TOPIC, q, 0, 100, confirmed_only=False)
    return out


def scheduled(m: Master, checks: list[tuple[str, StoredMessage, str]] | None = None) -> Scheduled:
    m.replica.queue_offsets(TOPIC, 0)  # served first: its generation marker goes before the messages
    return Scheduled(m.replica, lambda *a: (checks if checks is not None else []).append(a))


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_delayed_message_moves_once_at_its_time_with_its_fields() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> tuple[str, int, int, int]:
            at = now_ms() + 400
            message_id, _, _ = await s.store_delayed(TOPIC, b"later", STORED, at, 123)
            early = await s.move_due()
            await asyncio.sleep(0.5)
            moved = await s.move_due()
            again = await s.move_due()
            return message_id, early, moved, again

        message_id, early, moved, again = m.run(go(), 20.0)
        assert (early, moved, again) == (0, 1, 0)
        (copy,) = in_topic(m)
        assert (copy.body, copy.key, copy.tags, copy.born_ts) == (b"later", "k1", "t1", 123)
        assert copy.properties[rules.PROP_ORIGIN_ID] == message_id
        assert copy.properties["p"] == "v" and rules.PROP_TARGET_TOPIC not in copy.properties
        assert copy.store_ts >= int(copy.properties[rules.PROP_DELIVER_AT])


def test_a_long_delay_does_not_hold_back_a_short_one() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> None:
            await s.store_delayed(TOPIC, b"long", STORED, now_ms() + 3_600_000, 0)
            await s.store_delayed(TOPIC, b"short", STORED, now_ms() + 200, 0)
            await asyncio.sleep(0.3)
            await s.move_due()

        m.run(go(), 20.0)
        assert [c.body for c in in_topic(m)] == [b"short"]


def test_a_delay_beyond_the_bound_is_refused_and_nothing_is_stored() -> None:
    with master() as m:
        s = scheduled(m)
        with pytest.raises(ValueError, match="at most"):
            m.run(s.store_delayed(TOPIC, b"x", STORED, now_ms() + s.max_delay_ms() + 60_000, 0), 5.0)
        assert all(m.replica.log.queue_offsets(DELAY_TOPIC, b).max == 0 for b in range(23))


def test_a_recalled_delayed_message_is_never_delivered_and_a_delivered_one_cannot_be_recalled() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> dict[str, Any]:
            recalled_id, _, recalled = await s.store_delayed(TOPIC, b"recalled", STORED, now_ms() + 300, 0)
            _, _, delivered = await s.store_delayed(TOPIC, b"delivered", STORED, now_ms() + 300, 0)
            out: dict[str, Any] = {"id": await s.recall(TOPIC, rules.decode_recall_handle(recalled))}
            await asyncio.sleep(0.4)
            out["moved"] = await s.move_due()
            codes = {}
            for name, (topic, handle) in {
                "again": (TOPIC, recalled),
                "delivered": (TOPIC, delivered),
                "other_topic": ("elsewhere", delivered),
                "other_set": (TOPIC, rules.encode_recall_handle("broker-z", 0, 0)),
            }.items():
                with pytest.raises(InvalidArgumentError) as err:
                    await s.recall(topic, rules.decode_recall_handle(handle))
                codes[name] = err.value.details["rocketmq"]
            out["codes"] = codes
            return out

        out = m.run(go(), 20.0)
        assert out["id"].startswith("broker-a:") and out["moved"] == 1
        assert [c.body for c in in_topic(m)] == [b"delivered"]
        assert out["codes"] == {
            "again": "INTERNAL_SERVER_ERROR",
            "delivered": "INTERNAL_SERVER_ERROR",
            "other_topic": "BAD_REQUEST",
            "other_set": "BAD_REQUEST",
        }


def _predecessor_copy(m: Master, kept: StoredMessage) -> Message:
    """The copy a master that died before its state record made."""
    p = dict(kept.properties)
    topic, queue = p.pop(rules.PROP_TARGET_TOPIC), int(p.pop(rules.PROP_TARGET_QUEUE))
    p[rules.PROP_ORIGIN] = f"{kept.topic}/{kept.queue_id}/{kept.queue_offset}"
    return Message(topic, queue, kept.body, kept.key, kept.tags, p)


def test_a_new_master_does_not_copy_a_delayed_message_its_predecessor_copied() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> int:
            await s.store_delayed(TOPIC, b"once", STORED, now_ms() + 100, 0)
            await asyncio.sleep(0.2)
            b = next(b for b in range(23) if m.replica.log.queue_offsets(DELAY_TOPIC, b).max)
            (kept,) = m.replica.log.read(DELAY_TOPIC, b, 0, 1, confirmed_only=False)
            await m.replica.write([_predecessor_copy(m, kept)])  # no progress record with it
            return await scheduled(m).move_due()  # the new master's first move

        assert m.run(go(), 20.0) == 1, "the message counts as moved"
        assert [c.body for c in in_topic(m)] == [b"once"]


def test_commit_delivers_once_rollback_never_and_bad_ends_change_nothing() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> dict[str, Any]:
            _, committed, _ = await s.store_half(TOPIC, b"yes", STORED, 0)
            _, rolled, _ = await s.store_half(TOPIC, b"no", STORED, 0)
            codes = {}
            await s.end(TOPIC, committed, True)
            await s.end(TOPIC, rolled, False)
            for name, (topic, txid, commit) in {
                "again": (TOPIC, committed, True),
                "flip": (TOPIC, rolled, True),
                "unknown": (TOPIC, rules.encode_transaction_id("broker-a", 99), True),
                "other_set": (TOPIC, rules.encode_transaction_id("broker-b", 0), True),
                "not_an_id": (TOPIC, "x", True),
            }.items():
                try:
                    await s.end(topic, txid, commit)
                    codes[name] = "OK"
                except InvalidArgumentError as exc:
                    codes[name] = exc.details["rocketmq"]
            _, other, _ = await s.store_half(TOPIC, b"other", STORED, 0)
            with pytest.raises(InvalidArgumentError, match="not one of topic"):
                await s.end("another-topic", other, True)
            return codes

        codes = m.run(go(), 20.0)
        assert set(codes.values()) == {"INVALID_TRANSACTION_ID"}, codes
        assert [c.body for c in in_topic(m)] == [b"yes"]
        assert m.replica.log.read(HALF_TOPIC, 0, 0, 10, confirmed_only=False)[2].body == b"other"


def test_a_committed_half_message_its_predecessor_copied_is_not_copied_again() -> None:
    with master() as m:
        s = scheduled(m)

        async def go() -> None:
            _, txid, offset = await s.store_half(TOPIC, b"once", STORED, 0)
            (kept,) = m.replica.log.read(HALF_TOPIC, 0, offset, 1, confirmed_only=False)
            await m.replica.write([_predecessor_copy(m, kept)])
            await scheduled(m).end(TOPIC, txid, True)

        m.run(go(), 20.0)
        assert [c.body for c in in_topic(m)] == [b"once"]


def test_an_orphan_is_checked_each_interval_then_rolled_back() -> None:
    with master() as m:
        checks: list[tuple[str, StoredMessage, str]] = []
        s = scheduled(m, checks)
        s.policy = tx.Policy(check_interval_ms=100, max_checks=2)

        async def go() -> str:
            _, txid, _ = await s.store_half(TOPIC, b"orphan", STORED, 0)
            for _ in range(8):
                await s.check_orphans()
                await asyncio.sleep(0.06)
            with pytest.raises(InvalidArgumentError, match="ended already"):
                await s.end(TOPIC, txid, True)
            return txid

        txid = m.run(go(), 20.0)
        assert [(topic, half.body, t) for topic, half, t in checks] == [(TOPIC, b"orphan", txid)] * 2
        assert in_topic(m) == [], "rolled back after its checks: never delivered"


def test_a_replica_relays_each_check_its_master_made_once() -> None:
    # The relay reads the replicated state: here the master's own log stands in for its slave's.
    with master() as m:
        checks: list[tuple[str, StoredMessage, str]] = []
        relayed: list[tuple[str, StoredMessage, str]] = []
        s = scheduled(m, checks)
        s.policy = tx.Policy(check_interval_ms=100, max_checks=3)
        relay = scheduled(m, relayed)

        async def go() -> str:
            _, txid, _ = await s.store_half(TOPIC, b"orphan", STORED, 0)
            relay.relay_checks()  # open, never checked yet: nothing to pass on
            assert relayed == []
            for _ in range(3):
                await asyncio.sleep(0.12)
                await s.check_orphans()
                relay.relay_checks()
                relay.relay_checks()  # no new check since: not sent again
            return txid

        txid = m.run(go(), 20.0)
        assert len(checks) == 3
        assert [(topic, half.body, t) for topic, half, t in relayed] == [(TOPIC, b"orphan", txid)] * 3


def test_open_transactions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocketmqtx, "MAX_OPEN", 2)
    with master() as m:
        s = scheduled(m)

        async def go() -> None:
            _, first, _ = await s.store_half(TOPIC, b"1", STORED, 0)
            await s.store_half(TOPIC, b"2", STORED, 0)
            with pytest.raises(UnavailableError) as refused:
                await s.store_half(TOPIC, b"3", STORED, 0)
            assert refused.value.details["rocketmq"] == "TOO_MANY_REQUESTS"
            await s.end(TOPIC, first, False)
            await s.store_half(TOPIC, b"3", STORED, 0)

        m.run(go(), 20.0)
        bodies = [h.body for h in m.replica.log.read(HALF_TOPIC, 0, 0, 10, confirmed_only=False)]
        assert bodies == [b"1", b"2", b"3"], "the refused one was not stored"
