"""A ledger writer run as its own process by the recovery tests.

`python -m tests.broker.ledger_writer CONTROLLERS OUT [AQ]` creates a ledger (E = WQ = the broker
set's replicas), writes `ledger <id>` to OUT, then adds `payload(0)`, `payload(1)`, … one at a
time, writing `acked <id>` after each acknowledgement, until an add fails: then it writes
`error <CODE>` and exits. Every line is flushed and fsync'd before the next add, so what OUT says
was acknowledged was acknowledged (a test may kill or stop this process at any moment).
"""

from __future__ import annotations

import os
import sys

from tidelog.client import Client
from tidelog.errors import TidelogError
from tidelog.ledger import Ledgers

PASSWORD = b"recovery-test"


def payload(entry_id: int) -> bytes:
    return (b"%08d|" % entry_id) * (1 + entry_id % 7)


def main() -> None:
    controllers, out_path = sys.argv[1], sys.argv[2]
    aq = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    with Client(controllers) as client, open(out_path, "a") as out:

        def say(line: str) -> None:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

        ledgers = Ledgers(client)
        handle = ledgers.create_ledger(2, 2, aq, PASSWORD)
        say(f"ledger {handle.ledger_id}")
        entry = 0
        while True:
            try:
                got = handle.add_entry(payload(entry))
            except TidelogError as exc:
                say(f"error {exc.code}")
                return
            say(f"acked {got}")
            entry += 1


if __name__ == "__main__":
    main()
