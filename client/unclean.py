"""What an operator's unclean election may lose: the RPO `tide admin elect --unclean` prints and
the quorum drill checks (docs/RUNBOOK-quorum.md §4).

The controller knows, per member, the last (epoch, max offset) the member reported to the Raft
log; the last confirm offset it knows for a set is the highest one its SyncStateSet members
reported. Electing a broker from outside the set loses what lies past that broker's own end.

What the RPO covers, exactly: the bytes from the candidate's end up to that reported offset, plus
the controllers' `rpo_bound_bytes` when they set it (controller/RULES.md L10: a master alone in
its SyncStateSet then acknowledges nothing past that bound beyond the last report every
controller's log holds, the surviving one's included), so that nothing acknowledged lies past the
count. Without the bound, what it cannot cover: what the lost members acknowledged after that
report, which no survivor holds a record of. A master alone in its SyncStateSet (the only case
where a survivor is outside it) reports at every heartbeat (controller/RULES.md §1), so that is
the writes of its last heartbeat interval and of the report's Raft commit before it was lost, and
more only when the surviving controller lagged behind the lost majority's log. The line printed
says which, with the offset where the count stops; the drill checks every loss against them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tidelog.client.controllers import ControllerClient
from tidelog.errors import InvalidArgumentError
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import broker_pb2_grpc as bpb_grpc
from tidelog.tlsconfig import FROM_ENV, aio_channel, resolve_client
from tidelog.wire import CHANNEL_OPTIONS


@dataclass(frozen=True)
class UncleanRpo:
    """What an unclean election of `broker_id` may lose: the last confirm offset the controller
    knows for the set (the highest offset its SyncStateSet members reported to the Raft log) minus
    the candidate's own max offset, when positive."""

    broker_set: str
    broker_id: int
    in_sync: bool
    known_confirm_offset: int
    candidate_max_offset: int
    reported_by: int | None = None  # the SyncStateSet member whose report gave known_confirm_offset
    bound_bytes: int = 0  # the controllers' rpo_bound_bytes (0: none, an uncounted tail remains)

    @property
    def bytes(self) -> int:
        """The bytes counted: from the candidate's end to the last reported offset (plus the bound)."""
        return 0 if self.in_sync else max(0, self.counted_until - self.candidate_max_offset)

    @property
    def counted_until(self) -> int:
        """The offset where the count stops: with a bound nothing acknowledged lies past it; without,
        losses past it are the uncounted tail (module doc)."""
        reach = self.known_confirm_offset
        if self.bound_bytes:
            reach = max(reach, 0) + self.bound_bytes  # as ha/rpobound.py::grant counts it
        return max(reach, self.candidate_max_offset)

    def line(self) -> str:
        if self.in_sync:
            return (
                f"{self.broker_set}: broker {self.broker_id} is in the SyncStateSet: a clean election, RPO 0"
            )
        who = f"broker {self.reported_by}" if self.reported_by is not None else "the lost members"
        if self.bound_bytes:
            return (
                f"{self.broker_set}: electing broker {self.broker_id} from outside the SyncStateSet: RPO "
                f"at most {self.bytes} bytes, offsets {self.candidate_max_offset}..{self.counted_until} "
                f"(its max offset {self.candidate_max_offset}; {who} last reported offset "
                f"{self.known_confirm_offset} to the controllers' log, and acknowledged at most "
                f"rpo_bound_bytes={self.bound_bytes} past what every controller held of its reports); "
                f"nothing acknowledged past offset {self.counted_until} is lost"
            )
        return (
            f"{self.broker_set}: electing broker {self.broker_id} from outside the SyncStateSet: RPO "
            f"{self.bytes} bytes counted, offsets {self.candidate_max_offset}..{self.counted_until} "
            f"(its max offset {self.candidate_max_offset}; {who} last reported offset "
            f"{self.known_confirm_offset} to the controllers' log); not counted and also lost: what "
            f"{who} acknowledged past offset {self.counted_until} after that report, normally the "
            f"writes of its last heartbeat interval and the report's Raft commit before it was lost "
            f"(a master alone in its SyncStateSet reports every heartbeat), more if this controller "
            f"lagged behind the lost ones"
        )


async def unclean_rpo(c: ControllerClient, broker_set: str, broker_id: int) -> UncleanRpo:
    """The RPO of electing `broker_id` of `broker_set` now (asked of the controllers and the broker)."""
    reply = await c.describe_broker_sets([broker_set])
    if not reply.broker_sets:
        raise InvalidArgumentError(f"no broker set {broker_set!r}")
    info = reply.broker_sets[0]
    members = {m.broker_id: m for m in info.members}
    if broker_id not in members:
        raise InvalidArgumentError(f"broker {broker_id} is not a member of {broker_set}")
    sss = set(info.role.sync_state_set)
    reports = sorted(
        ((members[b].last_max_offset, b) for b in sss if b != broker_id and b in members), reverse=True
    )
    known, reporter = reports[0] if reports else (-1, None)
    candidate = members[broker_id].last_max_offset
    with contextlib.suppress(Exception):  # its own word is fresher than its last report; either will do
        candidate = await broker_max_offset(members[broker_id].address)
    return UncleanRpo(
        broker_set, broker_id, broker_id in sss, known, candidate, reporter, reply.rpo_bound_bytes
    )


async def broker_max_offset(address: str) -> int:
    """A broker's own max offset (its Status), fresher than what it last reported to the controller."""
    channel = aio_channel(address, resolve_client(FROM_ENV), CHANNEL_OPTIONS)
    try:
        reply = await bpb_grpc.BrokerStub(channel).Status(bpb.StatusRequest(), timeout=3.0)
        return int(reply.max_offset)
    finally:
        await channel.close()
