"""When a segmented log's owner seals its ledger and starts a new one (`RollPolicy`,
`should_roll`), and the defaults a log's ledgers are made with (ensemble size, owner token).
Pure but for `default_ensemble_size`, which asks the controller.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.errors import IncorrectParameterError
from tidelog.ledger.metadata import is_int

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

__all__ = ["RollPolicy", "choose_ensemble_size", "default_ensemble_size", "default_owner", "should_roll"]


@dataclass(frozen=True)
class RollPolicy:
    """When an owner seals its ledger and moves to a new one (checked before each append).

    A ledger is rolled once it holds `max_entries` entries or `max_bytes` bytes of entry data, or
    has been open `max_age_s` seconds; an empty ledger is never rolled (an idle log makes no
    empty ledgers). None switches a limit off.
    """

    max_entries: int | None = 50_000
    max_bytes: int | None = 256 << 20
    max_age_s: float | None = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise IncorrectParameterError(f"{name} must be a positive integer or None, got {value!r}")
        age = self.max_age_s
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or not age > 0):
            raise IncorrectParameterError(f"max_age_s must be a positive number or None, got {age!r}")


def should_roll(entries: int, size_bytes: int, opened_at: float, now: float, policy: RollPolicy) -> bool:
    """Whether the current ledger (`entries` entries, `size_bytes` bytes, opened at `opened_at`) is full."""
    if entries <= 0:
        return False
    if policy.max_entries is not None and entries >= policy.max_entries:
        return True
    if policy.max_bytes is not None and size_bytes >= policy.max_bytes:
        return True
    return policy.max_age_s is not None and now - opened_at >= policy.max_age_s


def choose_ensemble_size(replica_counts: Sequence[int]) -> int:
    """The ensemble size for ledgers when none is given: the replica count shared by every broker set
    that has a master. Sets of different sizes need an explicit choice (IncorrectParameterError)."""
    counts = sorted(set(replica_counts))
    if not counts:
        raise IncorrectParameterError("no broker set has a master: cannot choose an ensemble size")
    if len(counts) > 1:
        raise IncorrectParameterError(
            f"broker sets have {counts} replicas: give the ensemble size (it must "
            f"equal the replica count of the broker set the ledger goes to)"
        )
    return counts[0]


async def default_ensemble_size(client: Transport) -> int:
    """`choose_ensemble_size` over the cluster's broker sets that have a master now."""
    reply = await client.controller.describe_broker_sets()
    return choose_ensemble_size([len(b.members) for b in reply.broker_sets if b.role.has_master])


def default_owner() -> str:
    """A token no other owner holds: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
