"""`tide health`: asks a process's /readyz (or /healthz) and waits for it (deploy/systemd runs it).

A real HTTP server on a free loopback port plays the process: not ready for the first answers,
then ready; the command run as `tide` does is a real subprocess.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import procs
from tidelog.cli.health import answer_of, metrics_address_of
from tidelog.errors import ConfigError


class _Process(http.server.BaseHTTPRequestHandler):
    not_ready_for = 0  # how many /readyz answers are 503 before the first 200
    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        type(self).asked.append(self.path)
        ready = self.path == "/healthz" or len(type(self).asked) > type(self).not_ready_for
        body = b"ok\n" if ready else b"not registered with the controller yet\n"
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def process() -> Iterator[tuple[str, type[_Process]]]:
    handler = type("Handler", (_Process,), {"asked": [], "not_ready_for": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def tide(*args: str) -> subprocess.CompletedProcess[str]:
    return procs.tide("health", *args, timeout=60)


def test_waits_until_the_process_is_ready(process: tuple[str, type[_Process]]) -> None:
    address, handler = process
    handler.not_ready_for = 3
    out = tide("--address", address, "--wait", "20", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc == {"address": address, "path": "/readyz", "ready": True, "status": 200, "reason": "ready"}
    assert handler.asked == ["/readyz"] * 4


def test_not_ready_in_time_exits_1_with_the_process_reason(process: tuple[str, type[_Process]]) -> None:
    address, handler = process
    handler.not_ready_for = 10_000
    out = tide("--address", address, "--wait", "1", "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["ready"] is False and doc["status"] == 503
    assert doc["reason"] == "not registered with the controller yet"
    assert tide("--address", address, "--live").returncode == 0  # alive, though not ready


def test_nobody_answering_is_not_ready(tmp_path: Path) -> None:
    out = tide("--address", "127.0.0.1:9", "--json")  # the discard port: nothing listens here
    assert out.returncode == 1
    assert json.loads(out.stdout)["status"] == 0


def test_the_config_names_the_address(process: tuple[str, type[_Process]], tmp_path: Path) -> None:
    address, _ = process
    broker = tmp_path / "broker.yaml"
    broker.write_text(f"broker_set: broker-a\nmetrics_address: {address}\n")
    assert tide("--config", str(broker)).returncode == 0
    controller = tmp_path / "controller.yaml"
    controller.write_text(
        "nodes:\n  - {id: c1, raft: 127.0.0.1:1, grpc: 127.0.0.1:2, metrics_address: " + address + "}\n"
        "  - {id: c2, raft: 127.0.0.1:3, grpc: 127.0.0.1:4}\n"
    )
    assert tide("--config", str(controller), "--node-id", "c1").returncode == 0
    off = tide("--config", str(controller), "--node-id", "c2")
    assert off.returncode == 1 and "no metrics_address" in off.stderr
    assert "--node-id" in tide("--config", str(controller)).stderr


@pytest.mark.parametrize(
    ("doc", "node", "expected"),
    [
        ({"metrics_address": "h:1"}, None, "h:1"),
        ({"nodes": [{"id": "c1", "metrics_address": "h:2"}]}, None, "h:2"),
        ({"nodes": [{"id": "c1"}, {"id": "c2", "metrics_address": "h:3"}]}, "c2", "h:3"),
    ],
)
def test_metrics_address_of_a_config(doc: dict[str, object], node: str | None, expected: str) -> None:
    assert metrics_address_of(doc, "cfg", node) == expected


@pytest.mark.parametrize(
    ("doc", "node"), [({}, None), ([], None), ({"nodes": [{"id": "c1"}, {"id": "c2"}]}, None)]
)
def test_a_config_without_an_address_is_a_clear_error(doc: object, node: str | None) -> None:
    with pytest.raises(ConfigError):
        metrics_address_of(doc, "cfg", node)


def test_what_an_answer_means() -> None:
    assert answer_of(200, "ok\n").ready
    assert answer_of(503, "no Raft leader\nmore\n").reason == "no Raft leader"
    assert answer_of(500, "").reason == "HTTP 500"
