"""controller/raft.py::RaftNode.majority_contact_age_ms reads PySyncObj's answer times on
PySyncObj's own clock. PySyncObj stamps them with CLOCK_MONOTONIC_RAW, which NTP does not slew;
read against time.monotonic, the age came out too old by however far the two clocks had drifted
apart since boot (0.24 s on a host up for hours), and a three-node controller with a short
heartbeat timeout then withheld every lease (its grant window is 15 % of that timeout)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from pysyncobj.monotonic import monotonic as raft_clock

from tidelog.controller.raft import RaftNode


def test_answers_just_stamped_are_fresh_whatever_time_monotonic_says(monkeypatch: pytest.MonkeyPatch) -> None:
    stamped = raft_clock()
    obj = SimpleNamespace(
        otherNodes=["c2", "c3"], _SyncObj__lastResponseTime={"c2": stamped, "c3": stamped - 5.0}
    )
    node = SimpleNamespace(is_leader=lambda: True, _obj=obj)
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + 10.0)  # a clock far from PySyncObj's
    age = RaftNode.majority_contact_age_ms(node)  # type: ignore[arg-type]
    assert 0 <= age < 1000, age  # c2 answered just now: with the leader, a majority of three
    obj._SyncObj__lastResponseTime = {"c2": stamped - 5.0, "c3": stamped - 6.0}
    assert 5000 <= RaftNode.majority_contact_age_ms(node) < 6000  # type: ignore[arg-type]
