"""Routes and queue choice for the client (pure functions and a small cache; no I/O here).

A topic's queues are the pairs (broker set, queue id) of its route, in a fixed order (broker set
name, then queue id), so every client computes the same list. A message with a key always maps
to the same pair (CRC32C of the key over that list) and so keeps its order; a message without a
key goes round robin over the queues whose broker set has a master.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.commitlog.crc import crc32c


@dataclass(frozen=True)
class Replica:
    broker_id: int
    address: str
    is_master: bool


@dataclass(frozen=True)
class BrokerSetRoute:
    name: str
    queues: int
    master_address: str  # "" when the set has no master
    master_epoch: int
    replicas: tuple[Replica, ...]

    def read_addresses(self, prefer_slaves: bool = True) -> list[str]:
        """Addresses to read from: slaves first (they take load off the master), then the master."""
        slaves = [r.address for r in self.replicas if not r.is_master and r.address]
        master = [self.master_address] if self.master_address else []
        return slaves + master if prefer_slaves else master + slaves


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    broker_sets: tuple[BrokerSetRoute, ...]
    queue_list: tuple[tuple[str, int], ...] = field(default=())

    @classmethod
    def build(cls, topic: str, broker_sets: list[BrokerSetRoute]) -> TopicRoute:
        sets = tuple(sorted(broker_sets, key=lambda b: b.name))
        queues = tuple((b.name, q) for b in sets for q in range(b.queues))
        return cls(topic, sets, queues)

    def broker_set(self, name: str) -> BrokerSetRoute | None:
        for b in self.broker_sets:
            if b.name == name:
                return b
        return None

    def writable(self) -> list[tuple[str, int]]:
        masters = {b.name for b in self.broker_sets if b.master_address}
        return [q for q in self.queue_list if q[0] in masters]


def queue_for_key(route: TopicRoute, key: str) -> tuple[str, int]:
    """The queue a key always maps to (whether its broker set has a master right now or not)."""
    if not route.queue_list:
        raise ValueError(f"topic {route.topic} has no queues")
    return route.queue_list[crc32c(key.encode()) % len(route.queue_list)]


def queue_round_robin(
    route: TopicRoute, counter: int, avoid: frozenset[str] = frozenset()
) -> tuple[str, int]:
    """The next queue for a message without a key, skipping broker sets without a master or in `avoid`."""
    candidates = (
        [q for q in route.writable() if q[0] not in avoid] or route.writable() or list(route.queue_list)
    )
    if not candidates:
        raise ValueError(f"topic {route.topic} has no queues")
    return candidates[counter % len(candidates)]
