"""What the ledger client knows of broker sets, and the choices made from it: where a new ledger
goes (rules C1–C4 in RULES.md) and in which order replicas are read. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.errors import IncorrectParameterError, NotEnoughBookiesError
from tidelog.ledger.metadata import check_create_params

if TYPE_CHECKING:
    from tidelog.proto import controller_pb2

__all__ = ["BrokerSetView", "ReplicaView", "broker_set_views", "place_ledger", "read_order"]


@dataclass(frozen=True)
class ReplicaView:
    broker_id: int
    address: str
    alive: bool = True


@dataclass(frozen=True)
class BrokerSetView:
    """What the controller says about one broker set, as much as the ledger client needs."""

    name: str
    master_id: int | None
    master_address: str
    members: tuple[ReplicaView, ...]
    sync_state_set: frozenset[int] = frozenset()
    master_epoch: int = 0

    def address_of(self, broker_id: int) -> str | None:
        for m in self.members:
            if m.broker_id == broker_id:
                return m.address
        return None

    @property
    def member_ids(self) -> tuple[int, ...]:
        return tuple(sorted(m.broker_id for m in self.members))

    @property
    def available(self) -> int:
        """Replicas that can take writes now: the alive members, none without a master."""
        if self.master_id is None or not self.master_address:
            return 0
        return sum(1 for m in self.members if m.alive)


def broker_set_views(reply: controller_pb2.DescribeBrokerSetsReply) -> list[BrokerSetView]:
    """`DescribeBrokerSets`' answer as views; liveness counts only when the answer knows it."""
    out = []
    for b in reply.broker_sets:
        role = b.role
        alive_known = reply.liveness_known
        members = tuple(
            ReplicaView(int(m.broker_id), m.address, bool(m.alive) if alive_known else True)
            for m in sorted(b.members, key=lambda m: m.broker_id)
        )
        out.append(
            BrokerSetView(
                role.broker_set,
                int(role.master_id) if role.has_master else None,
                role.master_address if role.has_master else "",
                members,
                frozenset(int(i) for i in role.sync_state_set),
                int(role.master_epoch),
            )
        )
    return sorted(out, key=lambda v: v.name)


def place_ledger(
    sets: Sequence[BrokerSetView],
    ledger_id: int,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    *,
    broker_set: str | None = None,
) -> BrokerSetView:
    """The broker set a new ledger goes to (rules C1–C4).

    Named set: it must exist and match the quorums. Otherwise, among the sets with exactly
    `ensemble_size` members, those with a master and every member alive are candidates, and the
    ledger id picks one (ids are sequential, so ledgers spread evenly). No set of that size:
    IncorrectParameterError (can never succeed); sets of that size but none ready:
    NotEnoughBookiesError (retryable).
    """

    def check(view: BrokerSetView) -> None:
        check_create_params(
            ensemble_size,
            write_quorum,
            ack_quorum,
            view.available,
            set_replicas=len(view.members),
            password=b"",
            custom_metadata={},
        )

    if broker_set is not None:
        named = [s for s in sets if s.name == broker_set]
        if not named:
            raise IncorrectParameterError(
                f"no broker set {broker_set!r} (known: {sorted(s.name for s in sets)})", broker_set=broker_set
            )
        check(named[0])
        return named[0]
    fitting = sorted((s for s in sets if len(s.members) == ensemble_size), key=lambda s: s.name)
    if not fitting:
        sizes = {s.name: len(s.members) for s in sets}
        raise IncorrectParameterError(
            f"tidelog requires ensemble_size == write_quorum == the replicas of a broker set; no broker set has "
            f"{ensemble_size} replicas (sizes: {sizes})",
            sizes=sizes,
        )
    ready = [s for s in fitting if s.available >= ensemble_size]
    if not ready:
        # let the core word the error for the best of them (quorum errors come first)
        check(max(fitting, key=lambda s: s.available))
        raise NotEnoughBookiesError(f"no broker set of {ensemble_size} replicas has all of them available")
    chosen = ready[ledger_id % len(ready)]
    check(chosen)
    return chosen


def read_order(view: BrokerSetView, replicas: Iterable[int]) -> list[tuple[int, str]]:
    """(broker id, address) of the replicas to read from: slaves first, the master last, so reads
    stay off the node that takes the writes. Replicas the set no longer knows are left out."""
    out = []
    for r in replicas:
        address = view.address_of(r)
        if address:
            out.append((r, address))
    return sorted(out, key=lambda ra: (ra[0] == view.master_id, ra[0]))
