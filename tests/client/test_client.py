"""Scenario: an application uses the Python client against a real local cluster (real processes,
real sockets): produce and read back, keys and order, a consumer group that shares the queues,
hand-over when a member leaves, offsets that survive a consumer restart, the reader, the async API.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterator

import pytest

from tests.client.conftest import LocalCluster
from tidelog.client import AsyncClient, Client, ConsumedMessage, OutMessage, Receipt
from tidelog.errors import InvalidArgumentError, MessageTooLargeError, TopicNotFoundError

pytestmark = pytest.mark.slow

Pos = tuple[int, int]  # (queue, queue offset); every topic here lives in the one broker set


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.controllers, send_timeout=20.0) as c:
        yield c


def read_queue(
    client: Client, topic: str, queue: int, start: int, count: int, timeout: float = 20.0
) -> list[ConsumedMessage]:
    """`count` messages of one queue from `start`, waiting (bounded) for them to be confirmed."""
    reader = client.reader(topic, queue, start)
    out: list[ConsumedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(reader.read(max_messages=count - len(out), timeout=0.5))
    return out


def at(receipt: Receipt) -> Pos:
    return receipt.queue, receipt.queue_offset


def poll_until(
    members: list,
    seen: collections.Counter[Pos],
    done: Callable[[], bool],
    timeout: float,
    bodies: dict[Pos, bytes] | None = None,
    what: str = "condition",
) -> None:
    """Poll every member in turn (0.2 s each) until `done()`; count every (queue, offset) seen."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        for m in members:
            for msg in m.poll(max_messages=200, timeout=0.2):
                seen[(msg.queue, msg.offset)] += 1
                if bodies is not None:
                    bodies[(msg.queue, msg.offset)] = msg.body


def settled(members: list, queues: set[Pos]) -> bool:
    """Every queue owned by exactly one member, and every member owns some."""
    owned = [{q for _, q in m.assignment} for m in members]
    return all(owned) and sum(len(o) for o in owned) == len(queues) and set().union(*owned) == queues


def test_round_trip_keeps_body_key_tags_and_properties(client: Client) -> None:
    client.admin().create_topic("roundtrip", queues=4)
    producer = client.producer()
    sent: dict[Pos, OutMessage] = {}
    singles = [
        OutMessage(bytes(range(256)) * 3, "k-bin", "a", {"n": "1", "unicode": "é ✓"}),
        OutMessage(b"", "k-empty", "empty-body", {}),
        OutMessage(b"no key, no tags"),
        OutMessage(b"\x00\xff" * 500, None, "tag-only", {"x": ""}),
    ]
    for m in singles:
        sent[at(producer.send("roundtrip", m.body, key=m.key, tags=m.tags, properties=m.properties))] = m
    batch = [
        OutMessage(f"batch {i}".encode(), f"key-{i % 5}" if i % 3 else None, f"t{i % 2}", {"i": str(i)})
        for i in range(60)
    ]
    receipts = producer.send_batch("roundtrip", batch)
    assert len(receipts) == len(batch)
    sent.update((at(r), m) for r, m in zip(receipts, batch, strict=True))
    assert len(sent) == len(singles) + len(batch), "two messages were given the same (queue, offset)"

    by_queue = collections.defaultdict(list)
    for q, off in sent:
        by_queue[q].append(off)
    got: dict[Pos, ConsumedMessage] = {}
    for q, offs in by_queue.items():
        for msg in read_queue(client, "roundtrip", q, 0, max(offs) + 1):
            got[(msg.queue, msg.offset)] = msg
    for pos, m in sent.items():
        assert pos in got, f"acknowledged message at {pos} was not read back"
        g = got[pos]
        assert (g.body, g.key, g.tags, g.properties) == (m.body, m.key, m.tags, dict(m.properties or {})), pos
        assert g.topic == "roundtrip" and g.broker_set == "broker-a"


def test_unknown_topic_is_a_typed_error(client: Client) -> None:
    with pytest.raises(TopicNotFoundError):
        client.producer().send("no-such-topic", b"x")


def test_same_key_lands_in_one_queue_in_send_order(client: Client) -> None:
    client.admin().create_topic("keyed", queues=8)
    producer = client.producer()
    keys = [f"customer-{i}" for i in range(12)]
    sent: dict[str, list[tuple[Pos, bytes]]] = {k: [] for k in keys}
    for round_ in range(6):
        for k in keys:  # interleaved single sends ...
            body = f"{k} single {round_}".encode()
            sent[k].append((at(producer.send("keyed", body, key=k)), body))
        batch = [OutMessage(f"{k} batch {round_} {j}".encode(), k) for j in range(3) for k in keys]
        for r, m in zip(producer.send_batch("keyed", batch), batch, strict=True):  # ... and batches
            assert m.key is not None
            sent[m.key].append((at(r), m.body))
    used = set()
    for k, items in sent.items():
        queues = {q for (q, _), _ in items}
        assert len(queues) == 1, f"key {k} was spread over queues {queues}"
        offsets = [off for (_, off), _ in items]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), f"key {k} out of send order"
        used |= queues
    assert len(used) > 1, "every key mapped to the same queue: the test would prove nothing"
    # Read back: in each queue, each key's messages appear in the order they were sent.
    for q in used:
        n = max(off for items in sent.values() for (qq, off), _ in items if qq == q) + 1
        msgs = read_queue(client, "keyed", q, 0, n)
        assert [m.offset for m in msgs] == list(range(n))
        for k, items in sent.items():
            if items[0][0][0] == q:
                assert [m.body for m in msgs if m.key == k] == [b for _, b in items]


def test_consumer_group_shares_queues_and_hands_over_when_a_member_leaves(client: Client) -> None:
    topic, group = "shared", "three"
    client.admin().create_topic(topic, queues=6)
    queues = {q for q in range(6)}
    producer = client.producer()
    sent: dict[Pos, bytes] = {}

    def produce(n: int, tag: str) -> set[Pos]:
        batch = [OutMessage(f"{tag} {i}".encode(), f"k{i % 40}") for i in range(n)]
        new = {at(r): m.body for r, m in zip(producer.send_batch(topic, batch), batch, strict=True)}
        sent.update(new)
        return set(new)

    first = produce(240, "first")
    assert {q for q, _ in first} == queues, "the keys did not reach every queue"
    members = [client.consumer(group=group, topic=topic, heartbeat_interval=0.3) for _ in range(3)]
    try:
        seen: collections.Counter[Pos] = collections.Counter()
        bodies: dict[Pos, bytes] = {}
        poll_until(members, seen, lambda: settled(members, queues), 60, bodies, "the group to settle")
        poll_until(members, seen, lambda: first <= set(seen), 60, bodies, "every message of the first batch")
        assert all(bodies[p] == sent[p] for p in first)

        # Settled membership: each queue has one owner, and what is produced now is read exactly once.
        owners = {q: i for i, m in enumerate(members) for _, q in m.assignment}
        assert set(owners) == queues
        seen.clear()
        second = produce(120, "second")
        poll_until(
            members, seen, lambda: second <= set(seen), 60, bodies, "every message of the second batch"
        )
        assert settled(members, queues)
        assert {p: c for p, c in seen.items() if c > 1} == {}, "duplicates without any rebalance"
        assert all(bodies[p] == sent[p] for p in second)

        # One member leaves: the other two take over its queues and read what is produced afterwards.
        leaving = members.pop(1)
        its_queues = {q for _, q in leaving.assignment}
        assert its_queues
        leaving.close()
        poll_until(members, seen, lambda: settled(members, queues), 30, bodies, "the two to take over")
        seen.clear()
        third = produce(120, "third")
        assert {q for q, _ in third} & its_queues
        poll_until(members, seen, lambda: third <= set(seen), 60, bodies, "every message of the third batch")
        assert all(bodies[p] == sent[p] for p in third)
        # Nothing was lost at the hand-over: every message ever produced was read at least once.
        assert set(sent) <= set(bodies)
    finally:
        for m in members:
            m.close()


def test_small_polls_lose_nothing(client: Client) -> None:
    """poll(max_messages=1) on a member that owns several queues must not skip any message."""
    client.admin().create_topic("trickle", queues=4)
    producer = client.producer()
    sent = {at(producer.send("trickle", f"m{i}".encode(), key=f"k{i}")) for i in range(40)}
    assert len({q for q, _ in sent}) > 1
    got: list[Pos] = []
    with client.consumer(group="trickle", topic="trickle", auto_commit=False) as consumer:
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            msgs = consumer.poll(max_messages=1, timeout=0.3)
            assert len(msgs) <= 1
            got.extend((m.queue, m.offset) for m in msgs)
        positions = {q: off for (_, q), off in consumer.positions.items()}
    assert sorted(got) == sorted(sent), f"read {len(got)} of {len(sent)}; positions now {positions}"


def test_offsets_resume_after_consumer_restart(cluster: LocalCluster, client: Client) -> None:
    topic, group = "resume", "resumers"
    client.admin().create_topic(topic, queues=4)
    producer = client.producer()
    first = {
        at(r) for r in producer.send_batch(topic, [OutMessage(f"a{i}".encode(), f"k{i}") for i in range(80)])
    }
    assert {q for q, _ in first} == {0, 1, 2, 3}

    before: set[Pos] = set()
    with (
        Client(cluster.controllers) as c1,
        c1.consumer(group=group, topic=topic, auto_commit=False, heartbeat_interval=0.3) as a,
    ):
        deadline = time.monotonic() + 30
        while len(before) < 30:
            assert time.monotonic() < deadline, "the first consumer read nothing"
            before.update((m.queue, m.offset) for m in a.poll(max_messages=12, timeout=0.5))
        a.commit()
        committed = {q: off for (_, q), off in a.positions.items()}
    assert set(committed) == {0, 1, 2, 3}
    assert before == {(q, o) for q, off in committed.items() for o in range(off)}
    assert 0 < sum(committed.values()) < len(first)

    later = {
        at(r) for r in producer.send_batch(topic, [OutMessage(f"b{i}".encode(), f"k{i}") for i in range(40)])
    }
    after: list[Pos] = []
    with (
        Client(cluster.controllers) as c2,
        c2.consumer(group=group, topic=topic, auto_commit=False, heartbeat_interval=0.3) as b,
    ):
        deadline = time.monotonic() + 30
        while not (first | later) - before <= set(after):
            assert time.monotonic() < deadline, f"the restarted consumer read {len(after)} messages"
            after.extend((m.queue, m.offset) for m in b.poll(max_messages=100, timeout=0.5))
    reread = sorted(p for p in after if p[1] < committed[p[0]])
    assert reread == [], f"read again below the committed offsets {committed}"
    assert len(after) == len(set(after))
    for q, off in committed.items():
        if any(qq == q and o >= off for qq, o in first | later):
            assert min(o for qq, o in after if qq == q) == off


def test_reader_reads_one_queue_from_an_offset(client: Client) -> None:
    client.admin().create_topic("readme", queues=3)
    producer = client.producer()
    receipts = [producer.send("readme", f"line {i}".encode(), key="same") for i in range(20)]
    queue = receipts[0].queue
    assert {r.queue for r in receipts} == {queue}
    offsets = [r.queue_offset for r in receipts]
    assert offsets == list(range(offsets[0], offsets[0] + 20))

    start = offsets[7]
    msgs = read_queue(client, "readme", queue, start, 13)
    assert [m.offset for m in msgs] == offsets[7:]
    assert [m.body for m in msgs] == [f"line {i}".encode() for i in range(7, 20)]

    reader = client.reader("readme", queue, start)
    first = reader.read(max_messages=5, timeout=2.0)
    assert [m.offset for m in first] == offsets[7:12]
    # a read returns what the replica has confirmed so far; the rest follows within moments
    rest: list = []
    deadline = time.monotonic() + 5
    while len(rest) < 8 and time.monotonic() < deadline:
        rest += reader.read(max_messages=100, timeout=0.5)
    assert [m.offset for m in rest] == offsets[12:]
    assert reader.read(max_messages=100, timeout=0.2) == []  # at the end: nothing, not an error
    other = (queue + 1) % 3
    assert read_queue(client, "readme", other, 0, 1, timeout=1.0) == []


def test_async_client_round_trip(cluster: LocalCluster) -> None:
    async def main() -> tuple[list[Receipt], dict[Pos, ConsumedMessage]]:
        async with AsyncClient(cluster.controllers) as c:
            await c.admin().create_topic("async", queues=2)
            p = c.producer()
            receipts = [
                await p.send(
                    "async", f"one {i}".encode(), key=f"k{i}", tags="single", properties={"i": str(i)}
                )
                for i in range(10)
            ]
            receipts += await p.send_batch(
                "async", [OutMessage(f"two {i}".encode(), None, "batch", {"i": str(i)}) for i in range(10)]
            )
            consumer = c.consumer(group="async-readers", topic="async", heartbeat_interval=0.3)
            got: dict[Pos, ConsumedMessage] = {}
            deadline = time.monotonic() + 30
            try:
                while len(got) < len(receipts) and time.monotonic() < deadline:
                    for m in await consumer.poll(max_messages=100, timeout=0.5):
                        got[(m.queue, m.offset)] = m
            finally:
                await consumer.close()
            return receipts, got

    receipts, got = asyncio.run(main())
    assert len(receipts) == 20
    expected = [(f"one {i}".encode(), f"k{i}", "single", {"i": str(i)}) for i in range(10)] + [
        (f"two {i}".encode(), None, "batch", {"i": str(i)}) for i in range(10)
    ]
    for r, want in zip(receipts, expected, strict=True):
        m = got.get(at(r))
        assert m is not None, f"acknowledged message at {at(r)} not consumed"
        assert (m.body, m.key, m.tags, m.properties) == want


def test_consumer_started_right_after_create_topic(client: Client) -> None:
    """The brokers learn a new topic from their next heartbeat: until then a consumer waits, it does not fail."""
    for i in range(3):
        topic = f"fresh-{i}"
        client.admin().create_topic(topic, queues=2)
        with client.consumer(group="fresh", topic=topic, heartbeat_interval=0.3) as consumer:
            got = consumer.poll(max_messages=10, timeout=0.1)  # at once: before any broker heard of it
            receipts = client.producer().send_batch(
                topic, [OutMessage(f"{topic} {j}".encode(), f"k{j}") for j in range(10)]
            )
            deadline = time.monotonic() + 20
            while len(got) < len(receipts) and time.monotonic() < deadline:
                got += consumer.poll(max_messages=10, timeout=0.3)
        assert sorted((m.queue, m.offset) for m in got) == sorted(at(r) for r in receipts)


def test_typed_errors_and_large_messages(client: Client) -> None:
    client.admin().create_topic("sizes", queues=1)
    producer = client.producer()
    big = bytes(range(256)) * (3 << 12)  # 3 MiB, under max_message_bytes (4 MiB)
    first = producer.send("sizes", big, key="k")
    with pytest.raises(MessageTooLargeError):
        producer.send("sizes", b"x" * (5 << 20), key="k")
    with pytest.raises(InvalidArgumentError):
        producer.send("sizes", "not bytes", key="k")  # type: ignore[arg-type]
    last = producer.send("sizes", b"after", key="k")
    assert last.queue_offset == first.queue_offset + 1, "a rejected message took a queue offset"
    msgs = read_queue(client, "sizes", 0, first.queue_offset, 2)
    assert [m.body for m in msgs] == [big, b"after"]


def test_a_member_that_stops_heartbeating_loses_its_queues(client: Client) -> None:
    """A crashed member (no close, no more polls) is dropped after the session timeout; nothing is lost."""
    client.admin().create_topic("crashy", queues=4)
    producer = client.producer()

    def produce(tag: str) -> set[Pos]:
        batch = [OutMessage(f"{tag} {i}".encode(), f"k{i}") for i in range(100)]
        return {at(r) for r in producer.send_batch("crashy", batch)}

    sent = produce("before")
    opts = {"heartbeat_interval": 0.3, "session_timeout": 2.0}
    crashed = client.consumer(group="crashy", topic="crashy", **opts)
    survivor = client.consumer(group="crashy", topic="crashy", **opts)
    try:
        seen: collections.Counter[Pos] = collections.Counter()
        poll_until(
            [crashed, survivor],
            seen,
            lambda: settled([crashed, survivor], {0, 1, 2, 3}),
            30,
            what="two members to share the queues",
        )
        lost_queues = {q for _, q in crashed.assignment}
        sent |= produce("after")  # the crashed member never reads these
        poll_until([survivor], seen, lambda: sent <= set(seen), 30, what="the survivor to read everything")
        assert {q for _, q in survivor.assignment} == {0, 1, 2, 3}
        assert lost_queues and all(seen[p] >= 1 for p in sent)
    finally:
        survivor.close()
        crashed.close()


def test_one_group_on_two_topics_reads_both_fully(client: Client) -> None:
    """Members of one group reading different topics do not split each other's queues."""
    client.admin().create_topic("left", queues=4)
    client.admin().create_topic("right", queues=4)
    producer = client.producer()
    sent = {
        t: {
            at(r)
            for r in producer.send_batch(t, [OutMessage(f"{t} {i}".encode(), f"k{i}") for i in range(60)])
        }
        for t in ("left", "right")
    }
    members = {t: client.consumer(group="both", topic=t, heartbeat_interval=0.3) for t in ("left", "right")}
    try:
        seen: dict[str, set[Pos]] = {"left": set(), "right": set()}
        deadline = time.monotonic() + 20
        while any(not sent[t] <= seen[t] for t in sent) and time.monotonic() < deadline:
            for t, m in members.items():
                seen[t].update((msg.queue, msg.offset) for msg in m.poll(max_messages=100, timeout=0.2))
        for t, m in members.items():
            assert {q for _, q in m.assignment} == {0, 1, 2, 3}, f"{t}: owns only {m.assignment}"
            assert sent[t] <= seen[t], f"{t}: {len(sent[t] - seen[t])} messages never read"
    finally:
        for m in members.values():
            m.close()


def test_reader_read_ahead_returns_each_message_once_in_order_across_short_batches(client: Client) -> None:
    """Full batches keep two pulls under way, the second from where a full batch would end: when a
    batch comes back short (the end of what is confirmed), the pulls started past it are dropped,
    and the reader goes on exactly where the short batch ended."""
    client.admin().create_topic("ahead", queues=1)  # one key below: keyless requests may overlap
    producer = client.producer()
    producer.send_batch("ahead", [OutMessage(f"a{i}".encode(), key="k") for i in range(2500)])
    reader = client.reader("ahead", 0, 0)
    got: list[ConsumedMessage] = []
    deadline = time.monotonic() + 30
    while len(got) < 2500 and time.monotonic() < deadline:
        got.extend(reader.read(max_messages=1000, timeout=0.5))
    producer.send_batch("ahead", [OutMessage(f"b{i}".encode(), key="k") for i in range(700)])
    while len(got) < 3200 and time.monotonic() < deadline:
        got.extend(reader.read(max_messages=1000, timeout=0.5))
    assert reader.read(max_messages=1000, timeout=0.2) == []
    assert [m.offset for m in got] == list(range(3200))
    assert [m.body for m in got] == [f"a{i}".encode() for i in range(2500)] + [
        f"b{i}".encode() for i in range(700)
    ]
