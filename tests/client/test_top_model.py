"""`tide top`'s pure core (cli/topmodel.py): answers → snapshot, two snapshots → rates,
and the shape of the `--json` document. No processes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from tidelog.cli import top
from tidelog.cli import topmodel as model
from tidelog.localcluster import free_port
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import controller_pb2 as cpb


def _info(master: int | None = 1, sss: tuple[int, ...] = (1, 2), ids: tuple[int, ...] = (2, 1)) -> Any:
    role = cpb.RoleAssignment(
        broker_set="broker-a",
        has_master=master is not None,
        master_id=master or 0,
        master_epoch=3,
        sync_state_set=list(sss),
        sync_state_set_epoch=5,
    )
    members = [
        cpb.MemberInfo(
            broker_id=i,
            address=f"h:{i}",
            datacenter=f"dc-{i}",
            in_sync=i in sss,
            alive=True,
            is_master=i == master,
        )
        for i in ids
    ]
    return cpb.BrokerSetInfo(role=role, members=members)


def _status(broker_id: int, role: str, max_offset: int, confirm: int | None = None) -> bpb.StatusReply:
    return bpb.StatusReply(
        broker_set="broker-a",
        broker_id=broker_id,
        role=role,
        last_epoch=3,
        max_offset=max_offset,
        confirm_offset=max_offset if confirm is None else confirm,
    )


def _snap(
    at: float,
    master_max: int,
    slave_max: int | None,
    *,
    messages: int = 0,
    committed: int = 0,
    lag: int = 0,
) -> model.Snapshot:
    statuses = {
        1: _status(1, "master", master_max),
        2: None if slave_max is None else _status(2, "slave", slave_max),
    }
    bs = model.broker_set(_info(), True, statuses)
    return model.Snapshot(
        taken_at=at,
        wall=1_700_000_000.25,
        liveness_known=True,
        broker_sets=(bs,),
        topics=(model.Topic("t", messages),),
        groups=(model.Group("g", "t", committed, lag),),
    )


def test_members_come_sorted_with_the_broker_s_own_role_and_offsets() -> None:
    bs = model.broker_set(_info(), True, {1: _status(1, "master", 500, 400), 2: _status(2, "slave", 400)})
    assert [m.broker_id for m in bs.members] == [1, 2]
    m1, m2 = bs.members
    assert (m1.role, m1.max_offset, m1.confirm_offset, m1.epoch, m1.datacenter) == (
        "master",
        500,
        400,
        3,
        "dc-1",
    )
    assert (m2.role, m2.in_sync, m2.alive) == ("slave", True, True)
    assert (bs.master, bs.epoch, bs.sync_state_set, bs.sync_state_set_epoch) == (1, 3, (1, 2), 5)


@pytest.mark.parametrize(
    ("status", "role"),
    [
        (None, "unreachable"),
        (_status(7, "slave", 10), "gone"),  # another broker id answers at this address
    ],
)
def test_a_member_that_does_not_answer_as_itself_has_no_offsets(status: Any, role: str) -> None:
    bs = model.broker_set(_info(), True, {1: _status(1, "master", 10), 2: status})
    m = bs.members[1]
    assert m.role == role and m.max_offset is None and m.epoch is None


def test_liveness_unknown_is_none_not_false() -> None:
    bs = model.broker_set(_info(), False, {})
    assert all(m.alive is None for m in bs.members)


def test_no_master() -> None:
    bs = model.broker_set(_info(master=None, sss=()), True, {2: _status(2, "none", 30)})
    doc = model.view(model.Snapshot(1.0, 0.0, True, (bs,)))
    (b,) = doc["broker_sets"]
    assert b["master"] is None and b["max_offset"] == 30  # the head falls back to the furthest member
    assert all(m["lag_bytes"] is None for m in b["members"])


def test_lag_is_bytes_behind_the_master() -> None:
    doc = model.view(_snap(1.0, 1000, 600))
    (b,) = doc["broker_sets"]
    lags = {m["broker_id"]: m["lag_bytes"] for m in b["members"]}
    assert lags == {1: 0, 2: 400}
    assert model.view(_snap(1.0, 1000, None))["broker_sets"][0]["members"][1]["lag_bytes"] is None


def test_rates_come_from_two_snapshots() -> None:
    before = _snap(10.0, 1000, 1000, messages=100, committed=50)
    after = _snap(12.0, 5000, 4000, messages=140, committed=60)
    doc = model.view(after, before)
    assert doc["rate_window_s"] == 2.0
    assert doc["broker_sets"][0]["produce_bytes_per_s"] == 2000.0
    assert doc["topics"] == [{"name": "t", "messages": 140, "produce_messages_per_s": 20.0}]
    assert doc["groups"][0]["consume_messages_per_s"] == 5.0
    first = model.view(after)  # one snapshot: no rates, never zeros
    assert first["rate_window_s"] is None
    assert first["broker_sets"][0]["produce_bytes_per_s"] is None
    assert first["topics"][0]["produce_messages_per_s"] is None


def test_a_counter_that_went_down_has_no_rate() -> None:
    # a failover cut an unreplicated tail, or the topic was deleted and created again
    doc = model.view(_snap(2.0, 900, 900, messages=3), _snap(1.0, 1000, 1000, messages=100))
    assert doc["broker_sets"][0]["produce_bytes_per_s"] is None
    assert doc["topics"][0]["produce_messages_per_s"] is None


@given(
    before=st.integers(0, 1 << 50),
    delta=st.integers(-(1 << 20), 1 << 40),
    seconds=st.floats(-5.0, 1e4, allow_nan=False),
)
def test_rate_is_never_negative_and_never_made_up(before: int, delta: int, seconds: float) -> None:
    r = model.rate(before, before + delta, seconds)
    if delta < 0 or seconds < model.MIN_WINDOW_S:
        assert r is None
    else:
        assert r is not None and r >= 0
        assert r * seconds == pytest.approx(delta, rel=1e-9, abs=1e-6)
    assert model.rate(None, before, 1.0) is None and model.rate(before, None, 1.0) is None


@given(master=st.integers(0, 1 << 40), behind=st.lists(st.integers(-(1 << 20), 1 << 30), max_size=4))
def test_lag_is_never_negative(master: int, behind: list[int]) -> None:
    ids = tuple(range(1, len(behind) + 2))
    statuses = {1: _status(1, "master", master)}
    statuses.update(
        {i: _status(i, "slave", max(0, master - b)) for i, b in zip(ids[1:], behind, strict=True)}
    )
    doc = model.view(model.Snapshot(0.0, 0.0, True, (model.broker_set(_info(1, ids, ids), True, statuses),)))
    for m in doc["broker_sets"][0]["members"]:
        assert m["lag_bytes"] == max(0, master - m["max_offset"])


@pytest.mark.parametrize(
    ("keys", "pairs"),
    [
        (["group/g1/topics/t1", "group/g1/members/m-1", "group/g2/topics/t1"], [("g1", "t1"), ("g2", "t1")]),
        (["group/g/topics/a", "group/g/topics/b", "group/g/topics/a"], [("g", "a"), ("g", "b")]),
        (["ledger/1", "group//topics/t", "group/g/topics/", "group/g"], []),
    ],
)
def test_group_topics_from_metadata_keys(keys: list[str], pairs: list[tuple[str, str]]) -> None:
    assert model.group_topics(keys) == pairs


@pytest.mark.parametrize(
    ("per_s", "text"),
    [
        (None, "-"),
        (0.0, "0.0 B/s"),
        (999.0, "999.0 B/s"),
        (1500.0, "1.5 kB/s"),
        (2.5e6, "2.5 MB/s"),
        (7e12, "7000.0 GB/s"),
    ],
)
def test_human_rate(per_s: float | None, text: str) -> None:
    assert model.human_rate(per_s, "B") == text


def test_the_json_document_has_the_documented_shape() -> None:
    doc = model.view(_snap(3.0, 10, 5), _snap(2.0, 0, 0))
    json.dumps(doc)  # plain JSON types only
    assert set(doc) == {
        "version",
        "time",
        "rate_window_s",
        "liveness_known",
        "broker_sets",
        "topics",
        "groups",
        "errors",
    }
    assert doc["version"] == 1 and doc["time"] == "2023-11-14T22:13:20.250Z"
    (b,) = doc["broker_sets"]
    assert set(b) == {
        "name",
        "master",
        "epoch",
        "sync_state_set",
        "sync_state_set_epoch",
        "max_offset",
        "produce_bytes_per_s",
        "members",
    }
    assert set(b["members"][0]) == {
        "broker_id",
        "address",
        "datacenter",
        "alive",
        "in_sync",
        "role",
        "epoch",
        "max_offset",
        "confirm_offset",
        "lag_bytes",
    }
    assert set(doc["topics"][0]) == {"name", "messages", "produce_messages_per_s"}
    assert set(doc["groups"][0]) == {"group", "topic", "committed", "lag", "consume_messages_per_s"}


def test_the_frame_shows_members_rates_and_lag() -> None:
    doc = model.view(_snap(2.0, 3000, 1000, messages=30, lag=7), _snap(1.0, 1000, 1000, messages=10))
    rows = model.member_rows(doc)
    assert [(r["broker"], r["role"], r["in_sss"], r["lag_bytes"]) for r in rows] == [
        (1, "master", "yes", 0),
        (2, "slave", "yes", 2000),
    ]
    assert rows[0]["produce"] == "2.0 kB/s" and rows[1]["produce"] == ""
    console = Console(record=True, width=200)
    console.print(top.render(doc, "refresh failed: nobody home"))
    text = console.export_text()
    for shown in ("broker-a", "master", "slave", "2.0 kB/s", "20.0 msg/s", "refresh failed", "g"):
        assert shown in text


def test_no_controller_is_one_line_naming_the_addresses_tried() -> None:
    port = free_port()
    result = CliRunner().invoke(
        top.top, ["--controllers", f"127.0.0.1:{port}", "--timeout", "0.5", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 1
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    assert f"no controller answered (tried 127.0.0.1:{port} for 0.5s)" in line
    assert "Traceback" not in result.output


def test_no_controller_address_at_all_is_a_usage_error() -> None:
    result = CliRunner().invoke(top.top, ["--controllers", " "])
    assert result.exit_code == 2 and "no controller address" in result.output
