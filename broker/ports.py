"""The narrow ports the broker's ledger, shared-subscription and retention shells are given.

Owns the statement of what each of them needs from the replica (broker/replica.py), so that each
names only that, not the whole `Replica`: the one write path (check, append, persist, as
broker/replica.py's docstring describes it), the waits on the confirm offset, and the few parts of
the role and of the replica's folds they look at. `Replica` provides all three; the classes are
structural (`typing.Protocol`), so nothing is wrapped and every call is the replica's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.ledgers import LedgerReplica
    from tidelog.broker.offsets import GroupOffsets
    from tidelog.broker.topics import TopicTable
    from tidelog.commitlog import CommitLog, Message, Placement, QueueOffsets
    from tidelog.ha.master import HaMaster
    from tidelog.ha.slave import HaSlave

T = TypeVar("T")


@runtime_checkable
class WritePath(Protocol):
    """The replica's one write path: this broker may write, append, then wait for the acks."""

    def require_writable(self) -> HaMaster: ...

    def append(self, msgs: list[Message]) -> tuple[HaMaster, list[Placement]]: ...

    async def persist(self, master: HaMaster, end: int, needed: int, *, fsync: bool = False) -> None: ...


@runtime_checkable
class ConfirmWaits(Protocol):
    """Waiting on the confirm offset: long polls, and the wake-up when it moved."""

    def notify_confirmed(self) -> None: ...

    async def long_poll(self, poll: Callable[[], tuple[T, bool]], wait_ms: int) -> T: ...


@runtime_checkable
class LedgerHost(WritePath, ConfirmWaits, Protocol):
    """What broker/ledgers.py uses: the write path, the waits, the log to read entries back, the
    HA roles (whose acks an add needs, whose fence a read respects) and who this broker is."""

    cfg: BrokerConfig
    log: CommitLog
    broker_id: int
    ha_master: HaMaster | None
    ha_slave: HaSlave | None

    @property
    def ctx(self) -> str: ...


@runtime_checkable
class SharedHost(ConfirmWaits, Protocol):
    """What broker/shared.py uses: master-only writes of its state, the queues' offsets, the
    topics served and their generation markers, and the master's epoch (its lease numbers)."""

    cfg: BrokerConfig
    log: CommitLog
    topic_table: TopicTable

    def require_master(self) -> HaMaster: ...

    async def write(self, msgs: list[Message]) -> list[Placement]: ...

    def queue_offsets(self, topic: str, queue: int) -> QueueOffsets: ...

    @property
    def master_epoch(self) -> int: ...

    @property
    def topics(self) -> dict[str, int]: ...


@runtime_checkable
class RetentionHost(WritePath, Protocol):
    """What broker/retention.py uses: the role (what a round may do), the write path (the master's
    carry-forward), and the folds whose records retention must keep: topic markers and retention,
    group offsets, the ledger index."""

    cfg: BrokerConfig
    log: CommitLog
    topic_table: TopicTable
    offsets: GroupOffsets
    ledgers: LedgerReplica
    ha_master: HaMaster | None

    @property
    def ctx(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def master_epoch(self) -> int: ...

    @property
    def master_address(self) -> str: ...
