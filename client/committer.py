"""A client's group commits: every member's, whatever its group, sent to each master through one
pace (client/commitpace.py), so that many groups in one process cost a master few calls.

`Committer.commit(address, commits)` returns when the master at `address` has written them (or
raises what it answered). The units of one call share its fate, with one exception: a call
refused for what one of its commits says (`SPLIT_ON`: an offset past a queue's end, a group over
the broker's `max_groups`, a permission, an unknown topic; all refused before anything is
written) is sent again in halves, and so on down to single units, so that only the units at
fault get the error. Any other answer (not the master, unavailable, a timeout, a full disk, ...)
goes to every unit of the call, and to the rest of a call being split: each member defers its
commit as it would have alone.

A call travels as a COMMITS frame through the master's data port (tidelog/dataport_frames.py),
which costs the master about half the CPU of a gRPC call, or as gRPC's `CommitOffsets` where
there is no data port. A master of a release without the frame (its data port answers it as
unknown) gets gRPC from then on; one without `CommitOffsets` (it answers UNIMPLEMENTED) one
`CommitOffset` per commit.

Every member gets an answer: a client that closes fails the commits waiting and those of the
calls out with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidelog import dataport_frames as df
from tidelog.client.batching import int_option
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
    GroupLimitReachedError,
    InvalidArgumentError,
    PermissionDeniedError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
    UnsupportedCallError,
)
from tidelog.proto import broker_pb2 as bpb

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

log = logging.getLogger(__name__)

#: refusals of a call for what some of its commits say, given before anything is written: the
#: call is split to find the units at fault (every other answer goes to every unit)
SPLIT_ON = (InvalidArgumentError, GroupLimitReachedError, PermissionDeniedError, TopicNotFoundError)


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
        self.transport = transport
        self.interval_s = int_option("commit_interval_ms", interval_ms, 0, 60_000) / 1000
        self._paces: dict[str, CommitPace] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._out: dict[str, list[_Waiting]] = {}  # per master, the units of its call out
        self._grpc_only: set[str] = set()  # masters whose data port answered COMMITS as unknown
        self._single_only: set[str] = set()  # masters that answered UNIMPLEMENTED to CommitOffsets
        self.calls = 0  # commit calls sent, answered or not: what the pace saves (bench.scale)
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
        """Every commit waiting, and every commit of a call out, gets UNAVAILABLE (a call out may
        still have been written: a commit is at least once); the calls end with the client's
        tasks."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for pace in self._paces.values():
            _fail([u.token for u in pace.waiting], _closed())
            pace.waiting.clear()
        for units in self._out.values():
            _fail(units, _closed())

    def _step(self, address: str, event: Event) -> None:
        pace = self._paces.get(address)
        if pace is None:
            pace = self._paces[address] = CommitPace(self.interval_s, MAX_COMMITS_PER_CALL)
        loop = asyncio.get_running_loop()
        for action in pace.step(event, loop.time()):
            if self._closed:
                break
            if isinstance(action, Send):
                units = self._out[address] = [u.token for u in action.units]
                self.transport.background(self._send(address, units))
            elif address not in self._timers:
                # A wake-up is the last call's time plus the spacing: one set earlier is no later.
                self._timers[address] = loop.call_at(action.at, self._tick, address)
        if pace.forgettable(loop.time()):
            del self._paces[address]  # a client that met many masters keeps no state for them

    def _tick(self, address: str) -> None:
        self._timers.pop(address, None)
        if address in self._paces:
            self._step(address, Tick())

    async def _send(self, address: str, units: list[_Waiting]) -> None:
        try:
            await self._deliver(address, units)
        except Exception:  # a bug: every member has its answer (_deliver), and it is reported
            log.exception("group commits to %s: the call failed unexpectedly", address)
        finally:
            # cancelled in a split (the client closing): the units it had not reached are answered too
            _fail(units, UnavailableError("the commit call ended without an answer"))
            if self._out.get(address) is units:
                del self._out[address]
            self._step(address, Answered())

    async def _deliver(self, address: str, units: list[_Waiting]) -> TidelogError | None:
        """Send `units` in one call and answer each; a `SPLIT_ON` refusal sends them again in
        halves. Returns the answer that failed them all for a reason about no one commit (a
        split stops there and gives it to the units it has not sent), else None."""
        units = [u for u in units if not u.future.done()]  # a member may have given up
        if not units:
            return None
        try:
            await self._call(address, [c for u in units for c in u.commits])
        except SPLIT_ON as exc:
            if len(units) == 1:
                _fail(units, exc)
                return None
            # Nothing of the call was written: halves, so a few units at fault cost a few calls.
            half = len(units) // 2
            for part in (units[:half], units[half:]):
                stop = await self._deliver(address, part)
                if stop is not None:
                    _fail(units, stop)
                    return stop
            return None
        except TidelogError as exc:
            _fail(units, exc)
            return exc
        except BaseException as exc:  # a bug, or the client closing: every member still gets an answer
            _fail(units, exc)
            raise
        for unit in units:
            if not unit.future.done():
                unit.future.set_result(None)
        return None

    async def _call(self, address: str, commits: list[CommitFields]) -> None:
        """One call of `commits`: a COMMITS frame through the master's data port (about half
        a gRPC call's CPU on the master), else `CommitOffsets`, else one `CommitOffset` each."""
        transport = self.transport
        if address not in self._grpc_only:
            sent = True  # a frame went out, whatever its answer
            try:
                body = await transport.over_data_port(
                    address, df.OP_COMMITS, [df.commits_request(commits)], transport.rpc_timeout
                )
                sent = body is not None  # None: no data port
            except InvalidArgumentError as exc:
                if df.UNKNOWN_OP not in exc.message:
                    raise
                # A broker from before the frame (a rolling upgrade): it wrote nothing of it.
                log.info("data port %s takes no COMMITS frames: committing through gRPC", address)
                self._grpc_only.add(address)
                sent = False
            finally:
                if sent:
                    self.calls += 1
                    self.frames += 1
            if sent:
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
