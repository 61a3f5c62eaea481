"""The pure rules of the RocketMQ endpoint (broker/rocketmqrules.py): status codes, receipt
handles, tag filters, stored properties."""

from __future__ import annotations

import pytest

from tidelog.broker import rocketmqrules as rules
from tidelog.errors import all_codes
from tidelog.proto.rocketmq import definition_pb2 as d


@pytest.mark.parametrize(
    ("tidelog_code", "retryable", "rocketmq"),
    [
        ("INVALID_ARGUMENT", False, "BAD_REQUEST"),
        ("TOPIC_NOT_FOUND", False, "TOPIC_NOT_FOUND"),
        ("RECEIPT_INVALID", False, "INVALID_RECEIPT_HANDLE"),
        ("MESSAGE_ILLEGAL", False, "MESSAGE_BODY_TOO_LARGE"),
        ("NOT_MASTER", False, "HA_NOT_AVAILABLE"),
        ("IN_SYNC_REPLICAS_NOT_ENOUGH", True, "HA_NOT_AVAILABLE"),
        ("FLUSH_DISK_TIMEOUT", False, "MASTER_PERSISTENCE_TIMEOUT"),
        ("FLUSH_SLAVE_TIMEOUT", False, "SLAVE_PERSISTENCE_TIMEOUT"),
        ("UNAUTHENTICATED", False, "UNAUTHORIZED"),
        ("DISK_FULL", True, "INTERNAL_SERVER_ERROR"),  # not in the table: retryable
        ("HA_PROTOCOL", False, "INTERNAL_ERROR"),  # not in the table: not retryable
    ],
)
def test_tidelog_errors_map_to_rocketmq_codes(tidelog_code: str, retryable: bool, rocketmq: str) -> None:
    assert rules.code_for(tidelog_code, retryable) == rocketmq


def test_every_mapped_code_exists_on_both_sides() -> None:
    codes = all_codes()
    for ours, theirs in rules.CODE_FOR_ERROR.items():
        assert ours in codes, ours
        d.Code.Value(theirs)  # raises for a name RocketMQ does not have
    for name in (rules.OK, rules.NOT_IMPLEMENTED, rules.UNSUPPORTED, rules.TOO_MANY_REQUESTS, rules.TIMEOUT):
        d.Code.Value(name)


def test_receipt_handles_round_trip_and_refuse_anything_else() -> None:
    text = rules.encode_handle("broker-a.1", 3, "1f.2.a0")
    assert rules.decode_handle(text) == rules.Handle("broker-a.1", 3, "1f.2.a0")
    for bad in (
        "",
        "broker-a:3",
        "broker-a:x:1f.2.a0",
        "a/b:1:1f.2.a0",
        "broker-a:1:1F.2.A0",
        "b:1:1f.2.a0 ",
    ):
        assert rules.decode_handle(bad) is None, bad


@pytest.mark.parametrize(
    ("expression", "tag", "matches"),
    [
        ("*", None, True),
        ("", "x", True),
        ("a||b", "a", True),
        (" a || b ", "b", True),
        ("a||b", "c", False),
        ("a||b", None, False),
        ("a||*", "z", True),
    ],
)
def test_tag_filters(expression: str, tag: str | None, matches: bool) -> None:
    assert rules.tag_matches(rules.parse_tag_filter(expression), tag) is matches


@pytest.mark.parametrize("expression", ["a||", "||", "a|| ||b"])
def test_malformed_tag_filters_are_refused(expression: str) -> None:
    with pytest.raises(ValueError):
        rules.parse_tag_filter(expression)


def test_properties_round_trip_and_the_key_is_the_group_or_the_first_key() -> None:
    st = rules.to_stored(
        message_id="01ABC",
        message_type="FIFO",
        tag="t",
        keys=["k1", "k2"],
        message_group="g",
        born_host="10.0.0.1",
        user_properties={"u": "1"},
    )
    assert (st.key, st.tags) == ("g", "t")
    back = rules.from_stored(st.key, st.properties)
    assert (back.keys, back.message_group, back.message_type, back.client_message_id) == (
        ["k1", "k2"],
        "g",
        "FIFO",
        "01ABC",
    )
    assert back.user_properties == {"u": "1"}
    normal = rules.to_stored(
        message_id="",
        message_type="NORMAL",
        tag="",
        keys=["k1"],
        message_group="",
        born_host="",
        user_properties={},
    )
    assert (normal.key, normal.tags) == ("k1", None)
    # a message tidelog's own client sent: its key is its one RocketMQ key
    assert rules.from_stored("k", {"x": "y"}).keys == ["k"]


@pytest.mark.parametrize(
    "kw",
    [
        {"user_properties": {"rmq.message_id": "forged"}},
        {"keys": ["has space"]},
        {"keys": [""]},
        {"tag": "a||b"},
    ],
)
def test_unstorable_messages_are_refused(kw: dict[str, object]) -> None:
    args: dict[str, object] = {
        "message_id": "",
        "message_type": "NORMAL",
        "tag": "",
        "keys": [],
        "message_group": "",
        "born_host": "",
        "user_properties": {},
    }
    args.update(kw)
    with pytest.raises(ValueError):
        rules.to_stored(**args)  # type: ignore[arg-type]


def test_long_polls_end_before_the_client_stops_listening() -> None:
    assert rules.long_poll_ms(0, None) == rules.DEFAULT_LONG_POLL_MS
    assert rules.long_poll_ms(5000, 3500) == 2500
    assert rules.long_poll_ms(10**9, None) == rules.MAX_LONG_POLL_MS
    assert rules.long_poll_ms(5000, 500) == 0
