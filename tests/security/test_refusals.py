"""Row 2 of docs/SECURITY.md's probe table: malformed requests, unsigned, to a secure broker's
GetOffsets and the controller's CreateTopic are refused from their metadata before their bodies
are parsed, and the logs grow by a bounded number of lines and no traceback; a signed caller's
malformed body gets INVALID_ARGUMENT. Also the rate-limited refusal log and its metric alone."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from tests.client.conftest import LocalCluster
from tests.security.conftest import admin, broker_config, controller_address, raw_call, tls_channel
from tidelog.guard import RefusalLog, peer_host
from tidelog.metrics import new_registry, watch_auth_refusals

# field 1, length-delimited, claiming far more bytes than follow: no protobuf parser takes it
MALFORMED = b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 64
PROBES = 2000
GET_OFFSETS = "/tidelog.broker.v1.Broker/GetOffsets"


def flood(
    channel: grpc.Channel, method: str, metadata: tuple[tuple[str, str], ...] = ()
) -> set[grpc.StatusCode]:
    call = raw_call(channel, method)
    codes: set[grpc.StatusCode] = set()
    for start in range(0, PROBES, 200):
        futures = [
            call.future(MALFORMED, timeout=30, metadata=metadata or None)
            for _ in range(start, min(start + 200, PROBES))
        ]
        for f in futures:
            try:
                f.result()
            except grpc.RpcError as exc:
                codes.add(exc.code())
    return codes


def wait_until_known(call: grpc.UnaryUnaryMultiCallable, c: LocalCluster, timeout: float = 20.0) -> None:
    """Until the broker has learned the admin user (on a heartbeat reply after its start)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call(b"", timeout=5, metadata=admin(c).metadata(method=GET_OFFSETS))
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                return
            assert time.monotonic() < deadline, "the broker never learned the admin user"
        time.sleep(0.1)


def grown(log: Path, before: int) -> list[str]:
    return log.read_bytes()[before:].decode(errors="replace").splitlines()


@pytest.mark.slow
def test_unsigned_malformed_calls_are_refused_unread_in_few_lines(secure: LocalCluster) -> None:
    logs = [secure.data_dir / "broker-a-0.log", secure.data_dir / "controller-c1.log"]
    sizes = [p.stat().st_size for p in logs]
    with tls_channel(secure, broker_config(secure)["listen"]) as broker:
        assert flood(broker, "/tidelog.broker.v1.Broker/GetOffsets") == {grpc.StatusCode.UNAUTHENTICATED}
    with tls_channel(secure, controller_address(secure)) as controller:
        codes = flood(controller, "/tidelog.controller.v1.ControllerAdmin/CreateTopic")
        assert codes == {grpc.StatusCode.UNAUTHENTICATED}
        # a members-only service without the cluster token: refused unread too
        assert flood(controller, "/tidelog.controller.v1.ControllerBroker/Heartbeat") == {
            grpc.StatusCode.UNAUTHENTICATED
        }
    for log, size in zip(logs, sizes, strict=True):
        lines = grown(log, size)
        assert not [line for line in lines if "Traceback" in line or "Unexpected" in line], log
        # 4,000-6,000 refusals, a few lines a second per peer
        assert len(lines) < 200, (log, len(lines))
        assert any("refused" in line for line in lines), log


@pytest.mark.slow
def test_a_signed_malformed_body_is_invalid_argument_without_a_traceback(secure: LocalCluster) -> None:
    log = secure.data_dir / "broker-a-0.log"
    size = log.stat().st_size
    with tls_channel(secure, broker_config(secure)["listen"]) as broker:
        call = raw_call(broker, GET_OFFSETS)
        wait_until_known(call, secure)
        with pytest.raises(grpc.RpcError) as err:
            call(MALFORMED, timeout=30, metadata=admin(secure).metadata(method=GET_OFFSETS))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not parse" in (err.value.details() or "")
        # each call is judged by its own metadata: an unsigned one after a signed one is refused
        with pytest.raises(grpc.RpcError) as err:
            call(b"", timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Traceback" not in "\n".join(grown(log, size))


def test_refusals_are_logged_a_few_a_second_per_peer_and_all_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = RefusalLog(per_second=5)
    caplog.set_level("INFO", logger="tidelog.guard")
    for i in range(1000):
        refusals.note(
            f"ipv4:10.0.0.1:{40000 + i}", "unsigned", "GetOffsets: not signed", now=100.0 + i / 1000
        )
    refusals.note("ipv6:[::1]:5000", "bad_signature", "CreateTopic: no match", now=100.5)
    refusals.note("ipv4:10.0.0.1:1", "unsigned", "GetOffsets: not signed", now=101.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "tidelog.guard"]
    assert len(lines) == 5 + 1 + 1
    assert "995 more refusals from 10.0.0.1 not logged" in lines[-1]
    assert refusals.refusals.counts == {"unsigned": 1001, "bad_signature": 1}
    registry = new_registry()
    watch_auth_refusals(registry, refusals.refusals, ("node_id",), lambda: ("c1",))
    text = generate_latest(registry).decode()
    assert 'tidelog_auth_refused_total{node_id="c1",reason="unsigned"} 1001.0' in text
    assert peer_host("ipv6:[::1]:5000") == "[::1]" and peer_host("127.0.0.1:9") == "127.0.0.1"
