"""A consumer group member in a process of its own, for tests that kill it with SIGKILL.

    python tests/client/handover_member.py CONTROLLERS GROUP TOPIC SESSION_TIMEOUT [MODE]

It polls until killed and prints, flushed line by line, every message `poll` returned as
`D <broker set> <queue> <offset>` and, whenever they change, its committed offsets as
`C <json [[broker set, queue, offset], ...]>`, so that a test can bound what it re-delivers.
"""

from __future__ import annotations

import json
import sys
import time

from tidelog.client import Client


def main(controllers: str, group: str, topic: str, session_timeout: str, mode: str = "clustering") -> None:
    with (
        Client(controllers) as client,
        client.consumer(
            group=group,
            topic=topic,
            heartbeat_interval=0.3,
            session_timeout=float(session_timeout),
            auto_commit_interval=0.5,
            mode=mode,
        ) as consumer,
    ):
        last: list[list[object]] = []
        while True:
            for m in consumer.poll(max_messages=20, timeout=0.2):
                print(f"D {m.broker_set} {m.queue} {m.offset}", flush=True)
            now = sorted([bs, q, off] for (bs, q), off in consumer.committed.items())
            if now != last:
                print("C " + json.dumps(now), flush=True)
                last = now
            time.sleep(0.01)  # the application's work: keeps the read slow enough to be killed mid-way


if __name__ == "__main__":
    main(*sys.argv[1:6])
