"""HA master and slave over real loopback sockets, in one process (docs/reference/rocketmq-controller-ha.md §3.4, docs/ARCHITECTURE.md §4).

Two commit logs, a HaMaster serving one of them, a HaSlave following it: what the slave ends with
must be byte-identical to the master, forks must be cut at the last consistent point, and a
master of an older epoch must not be able to write into a slave that has seen a newer one.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import FlushSlaveTimeoutError
from tidelog.ha.master import HaMaster
from tidelog.ha.protocol import AuthHello, read_frame
from tidelog.ha.slave import HaSlave

SEG = 16 * 1024
MASTER_ID, SLAVE_ID = 1, 2
SECRET = "streaming-test-secret"


def open_log(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=SEG, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)


def batch(n: int, tag: str, size: int = 300) -> list[Message]:
    return [Message("t", i % 3, f"{tag}-{i}-".encode() + b"x" * size) for i in range(n)]


def segment_bytes(path: Path) -> list[tuple[str, bytes]]:
    return [(f.name, f.read_bytes()) for f in sorted((path / "commitlog").iterdir())]


async def until(predicate, timeout: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Pair:
    """A master log served on a loopback port, and a slave log following it."""

    def __init__(
        self, tmp: Path, master_epoch: int, sss: frozenset[int], *, slave_timeout_ms: int = 3000
    ) -> None:
        self.tmp = tmp
        self.mlog = open_log(tmp / "m")
        self.slog = open_log(tmp / "s")
        self.master_epoch = master_epoch
        self.sss = sss
        self.slave_timeout_ms = slave_timeout_ms
        self.master: HaMaster | None = None
        self.slave: HaSlave | None = None
        self.server: asyncio.AbstractServer | None = None
        self.address = ""

    async def start_master(self) -> None:
        if self.mlog.epochs.last_epoch < self.master_epoch:
            self.mlog.epochs.append(self.master_epoch, self.mlog.max_offset)
        self.master = HaMaster(
            self.mlog,
            broker_set="bs",
            broker_id=MASTER_ID,
            epoch=self.master_epoch,
            sync_state_set=self.sss,
            sss_epoch=1,
            slave_timeout_ms=self.slave_timeout_ms,
            batch_bytes=4096,
            heartbeat_interval_ms=100,
            idle_timeout_ms=2000,
            secret=SECRET,
        )

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                hello = await read_frame(reader)
                assert isinstance(hello, AuthHello)
                assert self.master is not None
                await self.master.accept(reader, writer, hello)
            except Exception:
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def start_slave(self, master_epoch: int | None = None) -> HaSlave:
        self.slave = HaSlave(
            self.slog,
            broker_set="bs",
            broker_id=SLAVE_ID,
            master_id=MASTER_ID,
            master_address=self.address,
            master_epoch=master_epoch or self.master_epoch,
            ack_interval_ms=100,
            idle_timeout_ms=2000,
            retry_ms=50,
            secret=SECRET,
        ).start()
        return self.slave

    def assert_byte_identical(self) -> None:
        """Both logs flushed, their segment files hold the same bytes."""
        self.mlog.flush()
        self.slog.flush()
        assert segment_bytes(self.tmp / "m") == segment_bytes(self.tmp / "s")

    def append(self, msgs: list[Message]) -> int:
        placed = self.mlog.append(msgs)
        assert self.master is not None
        self.master.on_appended()
        return placed[-1].phys_offset + placed[-1].size

    async def close(self) -> None:
        if self.slave is not None:
            await self.slave.stop()
        if self.master is not None:
            await self.master.close()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
        self.mlog.close()
        self.slog.close()


def test_3_4_slave_copy_is_byte_identical_and_confirm_follows_acks(tmp_path):
    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}))
        await pair.start_master()
        try:
            pair.append(batch(20, "before"))
            # with the slave in the SyncStateSet but not connected, nothing is confirmed
            assert pair.mlog.confirm_offset == 0
            pair.start_slave()
            end = pair.append(batch(150, "after"))  # rolls several segments
            await until(lambda: pair.slog.max_offset == end, what="the slave to catch up")
            await until(lambda: pair.mlog.confirm_offset == end, what="the master's confirm offset")
            await until(lambda: pair.slog.confirm_offset == end, what="the slave's confirm offset")
            assert pair.slog.epochs.pairs() == pair.mlog.epochs.pairs() == [(1, 0)]
            pair.assert_byte_identical()
            assert len(pair.slog.read("t", 0, 0, 1000)) == len(pair.mlog.read("t", 0, 0, 1000)) == 57
        finally:
            await pair.close()

    asyncio.run(main())


def test_an_append_is_written_to_an_idle_slave_at_once_and_a_long_one_in_chunks(tmp_path):
    """A sender waiting for data gets an append's records written by the append itself (no turn
    of the event loop in between, a share of every acknowledgement's latency); an append longer
    than one chunk is finished by the woken sender. The copy stays byte-identical."""

    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}))
        await pair.start_master()
        try:
            slave = pair.start_slave()
            await until(lambda: slave.connected, what="the slave to stream")
            assert pair.master is not None
            await until(
                lambda: all(c.parked for c in pair.master.connections.values()), what="an idle sender"
            )
            (conn,) = pair.master.connections.values()
            end = pair.append(batch(1, "one"))
            assert conn.send_offset == end  # written before this task gave the loop a turn
            long_end = pair.append(batch(40, "long"))  # 40 records of ~360 B: several 4 KiB chunks
            assert conn.send_offset < long_end
            await until(lambda: pair.slog.max_offset == long_end, what="the slave to catch up")
            await until(lambda: pair.mlog.confirm_offset == long_end, what="the master's confirm offset")
            pair.assert_byte_identical()
        finally:
            await pair.close()

    asyncio.run(main())


@pytest.mark.parametrize("zero_copy", [True, False])
def test_transfers_go_by_sendfile_over_plain_tcp_and_a_full_socket_takes_the_rest_copied(tmp_path, zero_copy):
    """Over plain TCP the master hands transfers' records from the page cache to the socket
    (os.sendfile); what a full socket does not take goes through the transport, read from the file.
    Chunks far larger than the socket's buffer make both happen; the copy is byte-identical
    either way, and with zero copy off every byte is read and written."""

    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}))
        await pair.start_master()
        assert pair.master is not None
        pair.master.batch_bytes = 4 << 20
        pair.master.zero_copy = zero_copy
        try:
            slave = pair.start_slave()
            await until(lambda: slave.connected, what="the slave to stream")
            end = 0
            for round_ in range(500):  # ~6.5 MB in appends of ~13 KB (segments of 16 KiB)
                end = pair.append(batch(40, f"r{round_}"))
            await until(lambda: pair.slog.max_offset == end, timeout=60, what="the slave to catch up")
            await until(lambda: pair.mlog.confirm_offset == end, what="the master's confirm offset")
            pair.assert_byte_identical()
            master = pair.master
            if zero_copy:
                assert master.sent_zero_copy > 0
            else:
                assert master.sent_zero_copy == 0
        finally:
            await pair.close()

    asyncio.run(main())


def test_3_4_fork_repair_cuts_the_unacked_tail_of_a_deposed_master(tmp_path):
    """The old master (epoch 1) kept records nobody acked; the new master (epoch 2) started at the
    shared prefix. Following the new master, the old one drops exactly its own tail."""

    async def main() -> None:
        pair = Pair(tmp_path, 2, frozenset({MASTER_ID}))
        shared = batch(30, "shared")
        # both logs hold the shared epoch-1 prefix, byte for byte
        pair.slog.epochs.append(1, 0)
        pair.slog.append(shared)
        pair.mlog.append_raw(0, pair.slog.read_raw(0, 1 << 20))
        pair.mlog.epochs.append(1, 0)
        fork_at = pair.slog.max_offset
        # the deposed master's unacknowledged tail, still in epoch 1
        pair.slog.append(batch(12, "unacked"))
        tail_end = pair.slog.max_offset
        assert tail_end > fork_at
        await pair.start_master()  # epoch 2 starts at fork_at
        assert pair.mlog.epochs.pairs() == [(1, 0), (2, fork_at)]
        end = pair.append(batch(20, "epoch2"))
        try:
            slave = pair.start_slave()
            await until(lambda: pair.slog.max_offset == end and slave.connected, what="repair and catch-up")
            assert slave.truncations == [(tail_end, fork_at)]  # exactly the unacked tail, once
            assert pair.slog.epochs.pairs() == [(1, 0), (2, fork_at)]
            pair.assert_byte_identical()
            await until(lambda: pair.slog.confirm_offset == end, what="the slave's confirm offset")
            bodies = [m.body for q in range(3) for m in pair.slog.read("t", q, 0, 1000)]
            assert len(bodies) == 50
            assert not any(b.startswith(b"unacked") for b in bodies)
        finally:
            await pair.close()

    asyncio.run(main())


def test_3_4_a_deposed_master_cannot_write_into_a_slave_of_a_newer_epoch(tmp_path):
    async def main() -> None:
        pair = Pair(tmp_path, 2, frozenset({MASTER_ID}))
        await pair.start_master()
        pair.append(batch(10, "old-term"))
        before = pair.slog.max_offset
        try:
            slave = pair.start_slave(master_epoch=3)  # the controller told the slave about epoch 3
            await asyncio.sleep(0.5)
            assert not slave.connected and slave.handshakes == 0
            assert pair.slog.max_offset == before == 0
        finally:
            await pair.close()

    asyncio.run(main())


def test_4_sync_write_waits_for_the_in_sync_slave_and_times_out_without_it(tmp_path):
    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}), slave_timeout_ms=400)
        await pair.start_master()
        assert pair.master is not None
        try:
            pair.start_slave()
            end = pair.append(batch(5, "acked"))
            await pair.master.wait_acks(end, 2)  # returns once the slave holds `end`
            assert pair.slog.max_offset >= end
            await pair.slave.stop()  # type: ignore[union-attr]
            end2 = pair.append(batch(5, "unacked"))
            with pytest.raises(FlushSlaveTimeoutError, match="stored on the master"):
                await pair.master.wait_acks(end2, 2)
            assert pair.mlog.max_offset == end2  # the records stay stored
        finally:
            await pair.close()

    asyncio.run(main())


def test_3_4_a_lagging_slave_takes_the_previous_epochs_history_from_a_new_master(tmp_path):
    """After a failover the controller tells the slave about epoch 2, but it still lacks records
    of epoch 1 that the new master holds: it must take them, then epoch 2's."""

    async def main() -> None:
        pair = Pair(tmp_path, 2, frozenset({MASTER_ID}))
        pair.mlog.epochs.append(1, 0)
        pair.mlog.append(batch(40, "epoch1"))  # written under the old master, held by the new one
        epoch2_start = pair.mlog.max_offset
        await pair.start_master()
        end = pair.append(batch(10, "epoch2"))
        try:
            slave = pair.start_slave(master_epoch=2)
            await until(lambda: pair.slog.max_offset == end, what="the lagging slave to catch up")
            assert slave.truncations == []
            assert pair.slog.epochs.pairs() == [(1, 0), (2, epoch2_start)]
            pair.assert_byte_identical()
        finally:
            await pair.close()

    asyncio.run(main())


def test_4_a_write_is_acknowledged_while_an_expansion_waits_for_an_unreachable_controller(tmp_path):
    """docs/ARCHITECTURE.md §3.5 step 2: the slave caught up and the master proposed it into the
    SyncStateSet, but the controller does not answer. The controller may or may not apply the
    change, so a write is acknowledged once both the confirmed set and the joining member hold it:
    whichever set the controller ends up with, its members have the write."""

    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID}), slave_timeout_ms=500)
        await pair.start_master()
        assert pair.master is not None
        unanswered = asyncio.Event()

        async def never_answers(_proposal, _attempt):  # the controller does not answer (paused, partitioned)
            await unanswered.wait()

        pair.master._propose = never_answers
        try:
            pair.start_slave()
            end = pair.append(batch(5, "x"))
            await until(
                lambda: pair.master.tracker.pending is not None and pair.slog.max_offset == end,
                what="the slave to catch up and the expansion to be proposed",
            )
            assert pair.master.sync_state_set == {MASTER_ID, SLAVE_ID}  # the confirm offset waits for both
            assert pair.master.ack_set == {MASTER_ID}  # the controller has confirmed only the master
            await pair.master.wait_acks(end, 2)  # both hold it: no wait for the controller
            assert pair.master.core.held_by_all() >= end == pair.slog.max_offset
        finally:
            unanswered.set()
            await pair.close()

    asyncio.run(main())


def test_4_5_a_write_made_while_an_expansion_is_pending_waits_for_the_new_member(tmp_path):
    """The dr-rehearsal drill's loss: a slave caught up, the master proposed it into the
    SyncStateSet, and a write made while the proposal was in flight was sized for the confirmed set
    (the master alone) and acknowledged at once. The controller then applied the expansion, the
    master's datacenter went down before the slave had copied that write, and the slave, now a
    member, was elected without it. Sized for the effective set, the write is acknowledged only
    once the new member's ack counts and covers it."""
    from tidelog.ha.ackpolicy import AckConfig, required_acks

    auto = AckConfig(
        replication="sync", in_sync_replicas=2, min_in_sync_replicas=1, auto_in_sync_replicas=True
    )

    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID}), slave_timeout_ms=5000)
        await pair.start_master()
        assert pair.master is not None
        master = pair.master
        answer = asyncio.Event()

        async def slow_controller(proposal, attempt):  # applies the change once told to
            await answer.wait()
            master.on_controller_state(proposal.new_sync_state_set, proposal.sss_epoch + 1)

        master._propose = slow_controller
        try:
            pair.start_slave()
            first = pair.append(batch(5, "x"))
            await until(
                lambda: master.tracker.pending is not None and pair.slog.max_offset == first,
                what="the slave to catch up and the expansion to be proposed",
            )
            assert pair.slave is not None
            await pair.slave.stop()  # the link goes down: the slave copies nothing more
            needed = required_acks(auto, master.write_set_size)
            end = pair.append(batch(3, "during"))
            acked = asyncio.ensure_future(master.wait_acks(end, needed))
            await asyncio.sleep(0.3)
            answer.set()  # the controller applies the expansion: the slave may now be elected
            await until(lambda: master.ack_set == {MASTER_ID, SLAVE_ID}, what="the expansion applied")
            await asyncio.sleep(0.3)
            assert not acked.done(), "acknowledged a write the electable slave does not hold"
            pair.start_slave()  # the link is back: the slave copies the write, its ack covers it
            await acked
            assert pair.slog.max_offset >= end
        finally:
            answer.set()
            await pair.close()

    asyncio.run(main())
