"""The README's RocketMQ snippets (its "RocketMQ clients" section), run as written against a
cluster of deploy/local.yaml, with only the endpoint replaced by one `tide cluster status` names:
the Python one with the official Python client, the Node.js one with the official Node.js client
(tests/client/node). They print what the README says they print."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import REPO, LocalCluster

pytestmark = pytest.mark.slow

NODE_MODULES = Path(__file__).with_name("node") / "node_modules"
PLACEHOLDER = "127.0.0.1:40123"


def snippet(language: str) -> str:
    """The README's `language` code block of its "RocketMQ clients" section."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### RocketMQ clients") :]
    section = section[: section.index("\n### ", 1)]
    (code,) = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    assert PLACEHOLDER in code
    return code


@pytest.fixture(scope="module")
def endpoint(cluster: LocalCluster) -> str:
    rc.create_topic(cluster, "orders")  # as the README says: `tide topic create orders`
    return rc.endpoint(cluster, "broker-a", "master")


def run(command: list[str], env: dict[str, str] | None = None) -> list[list[str]]:
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split(" ", 2) for line in out.stdout.splitlines() if line.startswith(("sent ", "received "))]


def test_the_python_snippet_prints_what_it_sent_and_then_only_what_is_new(endpoint: str) -> None:
    code = snippet("python").replace(PLACEHOLDER, endpoint)
    (sent, received) = run([sys.executable, "-c", code])
    assert sent[0] == "sent" and sent[1].startswith("broker-a:")
    assert received == ["received", sent[1], "b'hello'"]
    # again: the group has the first message already, and gets the new one only
    (sent_again, received_again) = run([sys.executable, "-c", code])
    assert sent_again[1] != sent[1] and received_again == ["received", sent_again[1], "b'hello'"]


@pytest.mark.skipif(
    shutil.which("node") is None or not NODE_MODULES.exists(),
    reason="needs node and `npm ci` in tests/client/node (make test does both)",
)
def test_the_node_snippet_prints_what_it_sent_and_receives_the_topic_from_its_start(
    endpoint: str, tmp_path: Path
) -> None:
    code = snippet("js").replace(PLACEHOLDER, endpoint)
    script = tmp_path / "snippet.js"
    script.write_text(code)
    # the client logs into files under $HOME: a test directory here
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES), "HOME": str(tmp_path)}
    lines = run(["node", str(script)], env)
    sent = [line for line in lines if line[0] == "sent"]
    received = [line for line in lines if line[0] == "received"]
    assert len(sent) == 1 and sent[0][1].startswith("broker-a:")
    # a group new to the topic starts at its oldest message: the Python snippet's too, if it ran
    assert sent[0][1] in {r[1] for r in received}
    assert all(r[2] == "hello" for r in received)
