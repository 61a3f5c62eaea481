"""The last add confirmed (LAC) of a ledger, asked of every replica at once.

`LacTally` is the pure part: it takes the replicas' `Lac` answers one by one and says what they
add up to and when the asking may stop. The master's answer is exact (it is the one that
confirms adds), so it ends the wait; otherwise the largest answer wins once all are in, or,
long polling, the first above `previous`. `ask_replicas` is the I/O: one `Lac` call per replica,
concurrently, fed to a tally until it is final.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import LedgerReadError, TidelogError, UnauthorizedAccessError
from tidelog.proto import ledger_pb2 as lpb

__all__ = ["LacTally", "ask_replicas"]


@dataclass
class LacTally:
    """What the replicas' LAC answers add up to so far (`previous`/`wait_ms` as in the request)."""

    previous: int = -1
    wait_ms: int = 0
    lac: int = -1
    length: int = 0
    fenced: bool = False
    answered: int = 0
    errors: dict[int, TidelogError] = field(default_factory=dict)

    def on_answer(self, reply: lpb.LacReply) -> bool:
        """Take one answer; True when it ends the wait (the master's, or a long poll's news)."""
        self.answered += 1
        self.fenced = self.fenced or reply.fenced
        if reply.lac > self.lac or (reply.lac == self.lac and reply.length > self.length):
            self.lac, self.length = int(reply.lac), int(reply.length)
        return bool(reply.is_master) or (self.wait_ms > 0 and reply.lac > self.previous)

    def on_error(self, replica: int, err: TidelogError) -> None:
        self.errors[replica] = err

    def result(self, ledger_id: int) -> tuple[int, int, bool]:
        """(LAC, length through it, fenced), or the error when no replica answered at all."""
        if not self.answered:
            for err in self.errors.values():
                if isinstance(err, UnauthorizedAccessError):
                    raise err
            raise LedgerReadError(
                f"no replica of ledger {ledger_id} answered a LAC read: "
                f"{ {r: str(e) for r, e in sorted(self.errors.items())} }"
            )
        return self.lac, self.length, self.fenced


async def ask_replicas(
    call: Callable[[str], Awaitable[Any]], targets: Sequence[tuple[int, str]], tally: LacTally
) -> None:
    """`call(address)` for every (replica, address) at once, each answer fed to `tally`, until
    the tally is final or every replica answered; calls still running then are cancelled."""
    tasks = {asyncio.ensure_future(call(address)): replica for replica, address in targets}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            final = False
            for t in done:
                try:
                    reply = t.result()
                except TidelogError as exc:
                    tally.on_error(tasks[t], exc)
                    continue
                final = tally.on_answer(reply) or final
            if final:
                return
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
