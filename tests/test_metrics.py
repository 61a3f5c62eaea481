"""tidelog/metrics.py: the HTTP endpoint over a real socket, its routing, and the gRPC call timer."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client import Counter

from tidelog.broker import config as broker_config
from tidelog.controller import config as controller_config
from tidelog.errors import ConfigError, NotMasterError
from tidelog.metrics import MetricsServer, RpcMetrics, RpcTimer, new_registry, respond, split_address
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc
from tidelog.wire import rpc


async def http_get(address: str, path: str, method: str = "GET") -> tuple[int, str]:
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


def test_respond_routes_each_path() -> None:
    registry = new_registry()
    Counter("tidelog_example", "an example", registry=registry).inc(3)
    status, ctype, body = respond("GET", "/metrics?x=1", registry, lambda: None)
    assert status == 200 and ctype.startswith("text/plain") and b"tidelog_example_total 3.0" in body
    assert respond("GET", "/healthz", registry, lambda: "down")[0] == 200
    assert respond("GET", "/readyz", registry, lambda: None)[:1] == (200,)
    status, _, body = respond("GET", "/readyz", registry, lambda: "no leader\nsecond line")
    assert (status, body) == (503, b"no leader\n")
    assert respond("GET", "/nope", registry, lambda: None)[0] == 404
    assert respond("POST", "/metrics", registry, lambda: None)[0] == 405


def test_registries_are_per_process_object() -> None:
    a, b = new_registry(), new_registry()
    Counter("tidelog_same_name", "x", registry=a).inc()
    Counter("tidelog_same_name", "x", registry=b)  # no clash: neither is the global registry
    assert a.get_sample_value("tidelog_same_name_total") == 1.0
    assert b.get_sample_value("tidelog_same_name_total") == 0.0


@pytest.mark.parametrize("bad", ["nohost", "host:", ":80", "h:99999", "h:x"])
def test_split_address_refuses_bad_addresses(bad: str) -> None:
    with pytest.raises(ConfigError, match="metrics_address"):
        split_address(bad)


def test_server_answers_over_http_and_stops() -> None:
    asyncio.run(_test_server_answers_over_http_and_stops())


async def _test_server_answers_over_http_and_stops() -> None:
    registry = new_registry()
    Counter("tidelog_example", "an example", registry=registry).inc()
    reason: list[str | None] = ["not registered with the controller yet"]
    server = MetricsServer("127.0.0.1:0", registry, lambda: reason[0])
    await server.start()
    address = server.bound
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    assert await http_get(address, "/healthz") == (200, "ok\n")
    assert await http_get(address, "/readyz") == (503, "not registered with the controller yet\n")
    reason[0] = None
    assert await http_get(address, "/readyz") == (200, "ready\n")
    status, body = await http_get(address, "/metrics")
    assert status == 200 and "tidelog_example_total 1.0" in body and "process_cpu_seconds_total" in body
    assert await http_get(address, "/metrics", method="HEAD") == (200, "")
    await server.close()
    with pytest.raises(OSError):
        await http_get(address, "/healthz")


def test_server_binds_only_its_address_and_names_the_key_when_taken() -> None:
    asyncio.run(_test_server_binds_only_its_address_and_names_the_key_when_taken())


async def _test_server_binds_only_its_address_and_names_the_key_when_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="metrics_address 127.0.0.1:") as err:
            await MetricsServer(f"127.0.0.1:{port}", new_registry(), lambda: None).start()
        assert err.value.details.get("key") == "metrics_address" or "metrics_address" in str(err.value)
    server = MetricsServer("127.0.0.1:0", new_registry(), lambda: None)
    await server.start()
    try:
        host = server.bound.rpartition(":")[0]
        assert host == "127.0.0.1"  # never the wildcard
    finally:
        await server.close()


def test_a_failing_collector_answers_500_and_the_server_keeps_serving() -> None:
    asyncio.run(_test_a_failing_collector_answers_500_and_the_server_keeps_serving())


async def _test_a_failing_collector_answers_500_and_the_server_keeps_serving() -> None:
    class Broken:
        def collect(self) -> list[object]:
            raise RuntimeError("collector bug")

    registry = new_registry()
    registry.register(Broken())  # type: ignore[arg-type]
    server = MetricsServer("127.0.0.1:0", registry, lambda: None)
    await server.start()
    try:
        status, body = await http_get(server.bound, "/metrics")
        assert status == 500 and "collector bug" in body
        assert await http_get(server.bound, "/healthz") == (200, "ok\n")
    finally:
        await server.close()


class _Servicer(pb_grpc.BrokerServicer):
    @rpc
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:
        if request.ByteSize() == 0:
            raise NotMasterError("broker 2 is slave", master_address="127.0.0.1:1")
        return pb.StatusReply()

    @rpc
    async def Produce(self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext) -> pb.ProduceReply:
        return pb.ProduceReply(broker_set="b", results=[pb.ProduceResult() for _ in request.messages])


def test_rpc_timer_reports_every_call_with_its_reply_or_error_code() -> None:
    asyncio.run(_test_rpc_timer_reports_every_call_with_its_reply_or_error_code())


async def _test_rpc_timer_reports_every_call_with_its_reply_or_error_code() -> None:
    seen: list[tuple[str, str, object]] = []
    registry = new_registry()
    metrics = RpcMetrics(registry, ("node_id",))

    def observe(method: str, request: object, reply: object, seconds: float, code: str) -> None:
        assert seconds >= 0
        seen.append((method, code, reply))
        metrics.observe(("c1",), method, seconds, code)

    server = grpc.aio.server(interceptors=[RpcTimer(observe)])
    pb_grpc.add_BrokerServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.BrokerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Status(pb.StatusRequest())
            assert (
                err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            )  # the error still reaches the client
            reply = await stub.Produce(
                pb.ProduceRequest(topic="t", messages=[pb.ProduceMessage(body=b"x")] * 3)
            )
            assert len(reply.results) == 3
            await stub.Produce(pb.ProduceRequest(topic="t", messages=[pb.ProduceMessage(body=b"x")]))
    finally:
        await server.stop(0)
    assert [(m, c) for m, c, _ in seen] == [("Status", "NOT_MASTER"), ("Produce", "OK"), ("Produce", "OK")]
    assert seen[0][2] is None and len(seen[1][2].results) == 3  # type: ignore[attr-defined]
    count = registry.get_sample_value
    assert count("tidelog_rpc_duration_seconds_count", {"node_id": "c1", "method": "Produce"}) == 2
    assert count("tidelog_rpc_duration_seconds_count", {"node_id": "c1", "method": "Status"}) == 1
    assert count("tidelog_rpc_errors_total", {"node_id": "c1", "method": "Status", "code": "NOT_MASTER"}) == 1
    assert count("tidelog_rpc_errors_total", {"node_id": "c1", "method": "Produce", "code": "OK"}) is None


REPO = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"\btidelog_[a-z_]+")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _documented() -> set[str]:
    return {_base(n) for n in _NAME.findall((REPO / "deploy" / "METRICS.md").read_text())}


def test_every_exported_name_is_documented_in_metrics_md() -> None:
    exported = set()
    for path in ("tidelog/metrics.py", "broker/metrics.py", "controller/metrics.py"):
        exported |= {_base(n) for n in re.findall(r'"(tidelog_[a-z_]+)', (REPO / path).read_text())}
    assert len(exported) > 30
    assert exported <= _documented(), sorted(exported - _documented())


def test_the_grafana_dashboard_uses_documented_names_only() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana-tidelog.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {_base(n) for e in exprs for n in _NAME.findall(e)}
    for needed in ("tidelog_produced_messages", "tidelog_ack_wait_seconds", "tidelog_ha_lag_bytes"):
        assert needed in used
    assert used <= _documented(), sorted(used - _documented())


def test_the_kubernetes_example_probes_the_configured_metrics_ports() -> None:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes.yaml").read_text()))
    files = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    ctrl = controller_config.parse(yaml.safe_load(files["controller.yaml"]), node_id="tidelog-controller-0")
    broker_doc = yaml.safe_load(files["broker-a.yaml.template"].replace("POD", "tidelog-broker-a-0"))
    broker = broker_config.from_mapping({**broker_doc, "secret": "a-real-secret-for-the-tests-0123456789"})
    ports = {"tidelog-controller": split_address(ctrl.self_node.metrics_address)[1]}
    ports["tidelog-broker-a"] = split_address(broker.metrics_address)[1]
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        pod = sts["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named["metrics"] == ports[sts["metadata"]["name"]]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(named["metrics"])
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
