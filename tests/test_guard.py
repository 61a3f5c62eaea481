"""The server side of users' auth (tidelog/guard.py) without a server: who a call's metadata
proves, what the rules then allow, the cluster secret's token as the cluster itself, and the
`auth:` config section (refused without TLS in broker and controller configs)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from tidelog import access, acl
from tidelog.broker.config import from_mapping
from tidelog.controller.config import parse
from tidelog.credentials import Credentials
from tidelog.errors import ConfigError, PermissionDeniedError, UnauthenticatedError
from tidelog.guard import AuthSettings, Guard, parse_section
from tidelog.proto import broker_pb2 as bpb

ALICE = Credentials("AKalice1", "alice-secret")
PRODUCE = "/tidelog.broker.v1.Broker/Produce"
TABLE = acl.AclState(
    3,
    {"alice": acl.User("alice", ALICE.access_key, ALICE.signing_key)},
    frozenset({acl.Grant("alice", "topic", "orders-*", "produce")}),
)


def member(method: str, metadata: Mapping[str, str], request: Any) -> bool:
    if "tide-cluster-auth" not in metadata:
        return False
    if metadata["tide-cluster-auth"] != "valid":
        raise UnauthenticatedError("the cluster secret was not proven")
    return True


GUARD = Guard(AuthSettings(True), lambda: TABLE, member)


def refusal(metadata: Mapping[str, str], topic: str = "orders-eu", method: str = PRODUCE) -> Exception | None:
    return GUARD.refusal(method, metadata, bpb.ProduceRequest(topic=topic))


def test_a_signed_call_within_its_grants_passes() -> None:
    assert refusal(dict(ALICE.metadata(method=PRODUCE))) is None


def test_a_signature_is_taken_once_for_its_own_method_and_never_date_only() -> None:
    signed = dict(ALICE.metadata(method=PRODUCE))
    assert refusal(signed) is None
    again = refusal(signed)
    assert isinstance(again, UnauthenticatedError) and "replay" in again.message
    other = refusal(dict(ALICE.metadata(method=PRODUCE)), method="/tidelog.broker.v1.Broker/Pull")
    assert isinstance(other, UnauthenticatedError) and "signed for" in other.message
    date_only = dict(access.headers(ALICE.access_key, ALICE.signing_key, time.time()))
    refused = refusal(date_only)
    assert isinstance(refused, UnauthenticatedError) and "only its date" in refused.message


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        dict(Credentials(ALICE.access_key, "wrong").metadata()),
        dict(Credentials("AKnobody1", "alice-secret").metadata()),
        dict(ALICE.metadata(now_s=0)),  # 1970: far outside the clock bound
        {"authorization": "Basic YWxpY2U6c2VjcmV0"},
    ],
)
def test_anything_else_is_unauthenticated(metadata: dict[str, str]) -> None:
    assert isinstance(refusal(metadata), UnauthenticatedError)


def test_a_known_user_without_the_grant_is_told_which_permission_it_lacks() -> None:
    err = refusal(dict(ALICE.metadata(method=PRODUCE)), topic="payments")
    assert isinstance(err, PermissionDeniedError)
    assert err.message == "user alice lacks produce on topic payments"
    pull = "/tidelog.broker.v1.Broker/Pull"
    err = refusal(dict(ALICE.metadata(method=pull)), method=pull)
    assert isinstance(err, PermissionDeniedError) and "consume on topic orders-eu" in err.message


def test_the_cluster_secret_is_the_cluster_and_a_bad_token_is_refused() -> None:
    assert refusal({"tide-cluster-auth": "valid"}, topic="payments") is None
    assert isinstance(
        refusal({"tide-cluster-auth": "forged", **dict(ALICE.metadata())}), UnauthenticatedError
    )


def test_the_signature_is_fresh_per_call() -> None:
    first, later = dict(ALICE.metadata(now_s=1_795_000_000)), dict(ALICE.metadata(now_s=1_795_000_007))
    assert first[access.DATE_TIME] != later[access.DATE_TIME]
    assert first[access.AUTHORIZATION] != later[access.AUTHORIZATION]


def test_the_auth_section() -> None:
    assert parse_section(None, "config", has_tls=False) is None
    assert parse_section({"enabled": False}, "config", has_tls=False) is None
    assert parse_section({"enabled": True, "max_skew_s": 60}, "config", has_tls=True) == AuthSettings(
        True, 60
    )
    for bad in ({"enabled": "yes"}, {"enabled": True, "max_skew_s": 0}, {"enabled": True, "other": 1}, []):
        with pytest.raises(ConfigError):
            parse_section(bad, "config", has_tls=True)


def test_auth_needs_tls_in_broker_and_controller_configs() -> None:
    broker = {"broker_set": "a", "data_dir": "data", "controllers": "127.0.0.1:1", "secret": "s"}
    with pytest.raises(ConfigError, match="auth needs TLS"):
        from_mapping({**broker, "auth": {"enabled": True}})
    assert from_mapping({**broker, "auth": {"enabled": False}}).auth is None
    nodes = [{"id": "c1", "raft": "127.0.0.1:9801", "grpc": "127.0.0.1:9701"}]
    with pytest.raises(ConfigError, match="auth needs TLS"):
        parse({"data_dir": "d", "nodes": nodes, "secret": "s", "auth": {"enabled": True}})
