"""The RPO bound of a master alone in its SyncStateSet (controller/RULES.md L10): the controllers'
half, which offset they let it acknowledge up to, and the broker's half, which holds its
acknowledgements to that offset.

Why: when the only survivor of a lost datacenter is outside the SyncStateSet, an operator's
`tide admin elect --unclean` loses what the lost master acknowledged past the survivor's end, and
prints that loss (the RPO) from the last offsets the master reported to the controllers' log
(client/unclean.py). The master kept acknowledging after its last report reached the log, and the
surviving controller may have lagged behind the lost ones, so the printed figure could fall short.
With `rpo_bound_bytes` set, the leader grants the master, in each heartbeat reply, an offset to
acknowledge up to: the master's last report that *every* controller's Raft log holds (so also the
survivor's, whichever it is: a forced recovery keeps every entry a node's log holds), plus the
bound. A master alone acknowledges nothing past its grant; the RPO printed counts up to the
recorded offset plus the bound, and no acknowledged write lies beyond it.

The price: a master alone whose reports a controller cannot take (a controller down) stops
acknowledging `rpo_bound_bytes` past the last report they all hold, until that controller is back
or a slave rejoins the SyncStateSet. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


def held_by_every_node(recorded: int, recorded_at: int, every_node_index: int, previous: int) -> int:
    """The master's highest reported offset that every controller's log holds: `recorded` (read from
    the leader's state, which held it by Raft index `recorded_at`) once every node holds the log up
    to `recorded_at`; until then the last such offset found (`previous`)."""
    return max(previous, recorded) if every_node_index >= recorded_at else previous


def grant(held: int, bound_bytes: int) -> int:
    """The offset a master alone may acknowledge up to, given what every controller holds of its
    reports (-1: nothing yet, so only the bound itself from offset 0)."""
    return max(held, 0) + bound_bytes


@dataclass
class AckBound:
    """A master's grant from its controllers, for the master epoch it was granted in. Grants only
    grow within an epoch (each was safe when given: a later, lower one comes from a leader that
    knows less, not from a smaller truth)."""

    epoch: int = -1
    limit: int = -1  # -1: no grant in `epoch`
    enforced: bool = False  # the controllers set rpo_bound_bytes (replies say so; see the shell)

    def granted(self, epoch: int, limit: int) -> bool:
        """Take a grant for `epoch` from a heartbeat reply naming this broker master. True when the
        limit of `epoch` grew."""
        self.enforced = True
        if epoch != self.epoch:
            self.epoch, self.limit = epoch, limit
            return True
        if limit > self.limit:
            self.limit = limit
            return True
        return False

    def allows(self, epoch: int, end: int, *, alone: bool) -> bool:
        """Whether the master of `epoch` may acknowledge a write ending at `end`: always with a
        SyncStateSet of more than itself (an unclean election is needed only when no member
        survives, and a member holds every acknowledged write) or without a bound; alone, only
        up to its grant for that epoch."""
        if not alone or not self.enforced:
            return True
        return epoch == self.epoch and end <= self.limit
