"""The pure rules of the RocketMQ endpoint (broker/rocketmqrules.py): status codes, receipt
handles, tag filters, stored properties, signatures."""

from __future__ import annotations

import calendar
import hmac
from hashlib import sha1

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# --- signatures ---

SECRETS = {"ak": "sk", "other": "s2"}
NOW_TEXT = "20261126T171138Z"
NOW = calendar.timegm((2026, 11, 26, 17, 11, 38, 0, 0, 0))
SKEW = 900


def signed(
    access_key: str = "ak", secret: str = "sk", date_time: str = NOW_TEXT, *, upper: bool = False
) -> dict[str, str]:
    """Metadata as an official client sends it (the Java client writes the hex in upper case)."""
    sig = hmac.new(secret.encode(), date_time.encode(), sha1).hexdigest()
    sig = sig.upper() if upper else sig
    return {
        "authorization": f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={sig}",
        "x-mq-date-time": date_time,
    }


def test_the_clients_signature_scheme() -> None:
    # HMAC-SHA1 of the date-time by the secret key, in hex (a value computed independently)
    assert rules.sign("sk", NOW_TEXT) == hmac.new(b"sk", NOW_TEXT.encode(), sha1).hexdigest()
    assert rules.date_time_s(NOW_TEXT) == NOW


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        (signed(), True),
        (signed(upper=True), True),  # the Java client's upper-case hex
        (signed("other", "s2"), True),
        (signed("ak", "sk", "20261126T172600Z"), True),  # 14 min 22 s ahead
        (signed("ak", "sk", "20261126T165700Z"), True),  # 14 min 38 s behind
        ({}, False),  # not signed
        ({"x-mq-date-time": NOW_TEXT}, False),
        (signed("ak", "wrong"), False),
        (signed("nobody", "sk"), False),  # an unknown access key
        (signed("other", "sk"), False),  # another key's secret
        (signed("ak", "sk", "20261126T172639Z"), False),  # 15 min 1 s ahead
        (signed("ak", "sk", "20261126T165637Z"), False),  # 15 min 1 s behind
        (signed("ak", "sk", "20261126T171138"), False),  # not the format
        (signed("ak", "sk", "20261332T171138Z"), False),  # no such date
        ({**signed(), "x-mq-date-time": "20261126T171139Z"}, False),  # signed another time
        (
            {
                **signed(),
                "authorization": signed()["authorization"].replace("MQv2-HMAC-SHA1", "MQv2-HMAC-SHA256"),
            },
            False,
        ),
        (
            {**signed(), "authorization": signed()["authorization"].replace("x-mq-date-time", "x-mq-other")},
            False,
        ),
        ({**signed(), "authorization": "MQv2-HMAC-SHA1 Credential=ak"}, False),
        ({**signed(), "authorization": signed()["authorization"] + ", Signature=00"}, False),  # twice
    ],
)
def test_signed_calls_pass_and_every_other_is_refused(headers: dict[str, str], accepted: bool) -> None:
    why = rules.refusal(headers, SECRETS, NOW, SKEW)
    assert (why is None) is accepted, why


def test_without_access_keys_nothing_is_checked_and_a_skew_of_0_checks_no_time() -> None:
    assert rules.refusal({}, {}, NOW, SKEW) is None
    assert rules.refusal(signed("ak", "sk", "20200101T000000Z"), SECRETS, NOW, 0) is None
    assert rules.refusal(signed("ak", "sk", "20200101T000000Z"), SECRETS, NOW, SKEW) is not None


def test_a_refusal_does_not_say_whether_the_access_key_exists() -> None:
    assert rules.refusal(signed("nobody"), SECRETS, NOW, SKEW) == rules.refusal(
        signed("ak", "wrong"), SECRETS, NOW, SKEW
    )


@given(st.data())
def test_any_change_of_the_signature_is_refused(data: st.DataObject) -> None:
    headers = signed()
    value = headers["authorization"]
    at = value.index("Signature=") + len("Signature=")
    sig = value[at:]
    i = data.draw(st.integers(0, len(sig) - 1), label="position")
    byte = data.draw(st.characters(min_codepoint=0x21, max_codepoint=0x7E), label="replacement")
    # a hex letter in the other case encodes the same signature (the Java client writes upper case)
    if byte.lower() == sig[i].lower():
        return
    changed = {**headers, "authorization": value[:at] + sig[:i] + byte + sig[i + 1 :]}
    assert rules.refusal(changed, SECRETS, NOW, SKEW) is not None


@given(st.text(max_size=60), st.text(max_size=60))
def test_malformed_metadata_is_refused_never_raises(authorization: str, date_time: str) -> None:
    headers = {"authorization": authorization, "x-mq-date-time": date_time}
    assert rules.refusal(headers, SECRETS, NOW, SKEW) is not None


def test_with_auth_on_the_controllers_users_sign_too() -> None:
    # users: access key -> signing key (tidelog/access.py), beside the configured access keys
    users = {"user-ak": "ab" * 32}.get
    assert rules.refusal(signed("user-ak", "ab" * 32), {}, NOW, SKEW, users) is None
    assert rules.refusal(signed("ak", "sk"), SECRETS, NOW, SKEW, users) is None
    assert rules.refusal(signed("user-ak", "wrong"), {}, NOW, SKEW, users) is not None
    # auth on and no configured keys: an unsigned call no longer passes
    assert rules.refusal({}, {}, NOW, SKEW, users) is not None


def test_every_messaging_service_method_has_a_permission_rule() -> None:
    from tidelog.proto.rocketmq import service_pb2

    service = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    assert {m.name for m in service.methods} == set(rules.METHODS)


def test_users_need_the_permissions_of_their_calls() -> None:
    from tidelog import acl
    from tidelog.proto.rocketmq import definition_pb2 as d
    from tidelog.proto.rocketmq import service_pb2 as s

    table = acl.AclState(
        1,
        {"u": acl.User("u", "AKuser01", "ab" * 32)},
        frozenset(
            {acl.Grant("u", "topic", "orders", "produce"), acl.Grant("u", "group", "billing", "consume")}
        ),
    )
    send = s.SendMessageRequest(messages=[d.Message(topic=d.Resource(name="orders"))])
    assert rules.permission_refusal("u", table, "SendMessage", send) is None
    send.messages.append(d.Message(topic=d.Resource(name="payments")))
    assert (
        rules.permission_refusal("u", table, "SendMessage", send) == "user u lacks produce on topic payments"
    )
    receive = s.ReceiveMessageRequest(
        group=d.Resource(name="billing"), message_queue=d.MessageQueue(topic=d.Resource(name="orders"))
    )
    assert (
        rules.permission_refusal("u", table, "ReceiveMessage", receive)
        == "user u lacks consume on topic orders"
    )
    assert rules.permission_refusal("u", table, "Telemetry", None) is None
    assert rules.permission_refusal("u", table, "SomethingNew", send) is not None


def test_a_rocketmq_consumer_is_a_member_per_topic_under_an_id_fit_for_a_metadata_key() -> None:
    a = rules.member_id("host-1@4242@0@dn5eie6lf3as", "orders")
    assert a == "rmq.host-1.4242.0.dn5eie6lf3as.orders"
    assert "/" not in rules.member_id("a/b@c", "t") and "@" not in rules.member_id("a/b@c", "t")
    assert rules.member_id("c@1", "orders") != rules.member_id("c@1", "refunds")
