"""A client's group commits: every member's, whatever its group, sent to each master through one
pace (client/commitpace.py), so that many groups in one process cost a master few calls.

`Committer.commit(address, commits)` returns when the master at `address` has written them (or
raises what it answered). The units of one call share its fate, with one exception: a call
refused for what one of its commits says (an offset past a queue's end, a group over the
broker's `max_groups`, a permission) wrote nothing, and each of its units is then sent again
alone, so that only the unit at fault gets the error. An answer about the master itself (not the
master, unavailable, replicas not in sync, a flush timed out) goes to every unit: each member
defers its commit as it would have alone.

A call travels as a COMMITS frame through the master's data port (tidelog/dataport_frames.py),
which costs the master about half the CPU of a gRPC call, or as gRPC's `CommitOffsets` where
there is no data port. A master of a release without the frame (its data port answers it as
unknown) gets gRPC from then on; one without `CommitOffsets` (it answers UNIMPLEMENTED) one
`CommitOffset` per commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidelog import dataport_frames as df
from tidelog.client.commitpace import (
    DEFAULT_COMMIT_INTERVAL_MS,
    MAX_COMMITS_PER_CALL,
    Added,
    Answered,
    CommitPace,
    Event,
    Send,
    Tick,
    Unit,
)
from tidelog.errors import (
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    InSyncReplicasNotEnoughError,
    InvalidArgumentError,
    NotMasterError,
    StoreClosedError,
    TidelogError,
    UnavailableError,
    UnsupportedCallError,
)
from tidelog.proto import broker_pb2 as bpb

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

log = logging.getLogger(__name__)

#: answers about the master, not about any commit: every unit of the call gets them
ABOUT_THE_MASTER = (
    NotMasterError,
    UnavailableError,
    InSyncReplicasNotEnoughError,
    FlushSlaveTimeoutError,
    FlushDiskTimeoutError,
    StoreClosedError,
)


#: (group, topic, queue, offset)
CommitFields = tuple[str, str, int, int]


class _Waiting:
    """What a unit's token holds: its commits and the future its member awaits."""

    __slots__ = ("commits", "future")

    def __init__(self, commits: list[CommitFields], future: asyncio.Future[None]) -> None:
        self.commits = commits
        self.future = future


class Committer:
    def __init__(self, transport: Transport, interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS) -> None:
        if (
            isinstance(interval_ms, bool)
            or not isinstance(interval_ms, int)
            or not 0 <= interval_ms <= 60_000
        ):
            raise InvalidArgumentError(
                f"commit_interval_ms must be an integer in [0, 60000], not {interval_ms!r}"
            )
        self.transport = transport
        self.interval_s = interval_ms / 1000
        self._paces: dict[str, CommitPace] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._grpc_only: set[str] = set()  # masters whose data port answered COMMITS as unknown
        self._single_only: set[str] = set()  # masters that answered UNIMPLEMENTED to CommitOffsets
        self.calls = 0  # commit calls sent: what the pace saves is read here (bench.scale)
        self.frames = 0  # of them, COMMITS frames through a data port
        self._closed = False

    async def commit(self, address: str, commits: Sequence[CommitFields]) -> None:
        """Commit (group, topic, queue, offset) of `commits` at the master at `address`: one
        write, all or none."""
        if not commits:
            return
        if self._closed:
            raise _closed()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._step(address, Added(Unit(len(commits), _Waiting(list(commits), future))))
        await future

    def close(self) -> None:
        """Every commit still waiting gets UNAVAILABLE; the calls out end with the client's tasks."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for pace in self._paces.values():
            _fail([u.token for u in pace.waiting], _closed())
            pace.waiting.clear()

    def _step(self, address: str, event: Event) -> None:
        pace = self._paces.get(address)
        if pace is None:
            pace = self._paces[address] = CommitPace(self.interval_s, MAX_COMMITS_PER_CALL)
        loop = asyncio.get_running_loop()
        for action in pace.step(event, loop.time()):
            if self._closed:
                break
            if isinstance(action, Send):
                self.transport.background(self._send(address, [u.token for u in action.units]))
            else:
                timer = self._timers.get(address)
                if timer is None or timer.when() > action.at:
                    if timer is not None:
                        timer.cancel()
                    self._timers[address] = loop.call_at(action.at, self._tick, address)
        if pace.idle:
            del self._paces[address]  # a client that met many masters keeps no state for them

    def _tick(self, address: str) -> None:
        self._timers.pop(address, None)
        if address in self._paces:
            self._step(address, Tick())

    async def _send(self, address: str, units: list[_Waiting]) -> None:
        try:
            live = [u for u in units if not u.future.done()]  # a member may have given up
            if live:
                await self._deliver(address, live)
        finally:
            self._step(address, Answered())

    async def _deliver(self, address: str, units: list[_Waiting]) -> None:
        try:
            await self._call(address, [c for u in units for c in u.commits])
        except ABOUT_THE_MASTER as exc:
            _fail(units, exc)
        except TidelogError as exc:
            if len(units) == 1:
                _fail(units, exc)
                return
            # Nothing of the call was written: each unit again alone, so only the one at fault fails.
            for unit in units:
                await self._deliver(address, [unit])
        except BaseException as exc:  # a bug, or the client closing: every member still gets an answer
            _fail(units, exc)
            raise
        else:
            for unit in units:
                if not unit.future.done():
                    unit.future.set_result(None)

    async def _call(self, address: str, commits: list[CommitFields]) -> None:
        """One call of `commits`: a COMMITS frame through the master's data port (about half
        a gRPC call's CPU on the master), else `CommitOffsets`, else one `CommitOffset` each."""
        transport = self.transport
        if address not in self._grpc_only:
            try:
                body = await transport.over_data_port(
                    address, df.OP_COMMITS, [df.commits_request(commits)], transport.rpc_timeout
                )
            except InvalidArgumentError as exc:
                if df.UNKNOWN_OP not in exc.message:
                    raise
                # A broker from before the frame (a rolling upgrade): it wrote nothing of it.
                log.info("data port %s takes no COMMITS frames: committing through gRPC", address)
                self._grpc_only.add(address)
            else:
                if body is not None:
                    self.calls += 1
                    self.frames += 1
                    return
        requests = [bpb.CommitOffsetRequest(group=g, topic=t, queue=q, offset=o) for g, t, q, o in commits]
        if address not in self._single_only:
            self.calls += 1
            try:
                await transport.call_broker(
                    address, "CommitOffsets", bpb.CommitOffsetsRequest(commits=requests)
                )
                return
            except UnsupportedCallError:
                log.info("broker %s does not know CommitOffsets: committing one queue per call", address)
                self._single_only.add(address)
        for request in requests:
            self.calls += 1
            await transport.call_broker(address, "CommitOffset", request)


def _fail(units: list[_Waiting], exc: BaseException) -> None:
    for unit in units:
        if not unit.future.done():
            unit.future.set_exception(exc if not isinstance(exc, asyncio.CancelledError) else _closed())
            unit.future.exception()  # retrieved: a member that gave up must not be reported


def _closed() -> TidelogError:
    return UnavailableError("the client closed before the commit was answered")
