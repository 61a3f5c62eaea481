"""SIGTERM reaches a broker that is still registering with an unreachable controller
(broker/server.py `_until_stopped`): it stops at once, not after its registration attempt, which
takes seconds (5 s here) to give up on the controller."""

from __future__ import annotations

import time
from pathlib import Path

from tests.brokers import BrokerSetProcs
from tests.procs import free_address, wait_until


def test_a_broker_registering_with_an_unreachable_controller_stops_at_once(tmp_path: Path) -> None:
    bs = BrokerSetProcs(tmp_path, "broker-a", 1, free_address())  # nothing listens there
    try:
        bs.start()
        # serving status means its registration attempt has begun (it starts right after)
        wait_until(
            lambda: bs.clients[0].status(timeout=1.0) is not None, 20, 0.05, what="the broker's gRPC port"
        )
        started = time.monotonic()
        assert bs.procs[0].stop(timeout=10) == 0  # SIGTERM: a clean stop
        assert time.monotonic() - started < 3.0, "the stop waited out the registration attempt"
        assert "stopping" in bs.logs()
    finally:
        bs.stop()
