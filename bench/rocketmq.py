"""The official RocketMQ clients (Python and Node.js) against tidelog's RocketMQ endpoint
(broker/rocketmq.py), beside tidelog's own client, on one cluster and one workload: messages of
1 KiB with a key, on topics of `--queues` queues (8).

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback,
`replication: sync`, `in_sync_replicas: 2`, `flush: async`) and measures, for each client:

- send, one at a time: each send waits for its receipt before the next;
- send, many in flight: `--in-flight` sends outstanding (the official client's `send_async`,
  tidelog's `send` from as many tasks);
- receive + acknowledge: batches of 32 in the shared mode, each message acknowledged on its own
  (the official client's SimpleConsumer, acknowledging from 16 threads; tidelog's shared consumer,
  acknowledging a batch's messages concurrently). Every message sent by both send phases is read;
- receive latency: a consumer waits in a receive (a long poll of 20 s) while `--messages`
  messages are sent one at a time to the queues of another topic; the time from each send to its
  receipt, p50 and p99 over all of them.

The official Python client (rocketmq-python-client) runs in a process of its own
(bench/rocketmq_client.py): its generated protobuf modules and tidelog's cannot share one; the
Node.js client (rocketmq-client-nodejs, `make node-client`) in Node (tests/client/node/driver.js,
its `bench` command; left out when Node or the package is missing). Run from the repository root:

    python -m bench.rocketmq                  # table
    python -m bench.rocketmq --messages 2000 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import SYNC_REPLICATED, BenchCluster
from bench.commitlog import code_version, report
from tidelog import loops
from tidelog.client.aio import AsyncClient
from tidelog.proto import broker_pb2 as bpb
from tidelog.tasks import within

BODY = b"x" * 1024
WORKER = Path(__file__).with_name("rocketmq_client.py")
NODE_DIR = Path(__file__).resolve().parents[1] / "tests" / "client" / "node"


async def _tidelog(client: AsyncClient, topic: str, messages: int, in_flight: int) -> dict[str, float]:
    producer = client.producer()
    await producer.send(topic, BODY, "k-1")  # route and connections set up before the clock starts
    t0 = time.perf_counter()
    for i in range(messages):
        await producer.send(topic, BODY, f"k{i}")
    sync_s = time.perf_counter() - t0

    window = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with window:
            await producer.send(topic, BODY, f"k{i}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(messages)))
    async_s = time.perf_counter() - t0

    consumer = client.consumer("g-tidelog", topic, mode="shared", start="earliest")
    got, t0 = 0, time.perf_counter()
    try:
        while got < 2 * messages + 1 and time.perf_counter() - t0 < 600:
            batch = await consumer.poll(max_messages=32, timeout=2.0)
            await asyncio.gather(*(consumer.ack(m) for m in batch))  # type: ignore[attr-defined]
            got += len(batch)
        receive_s = time.perf_counter() - t0
    finally:
        await consumer.close()
    return {"sync": messages / sync_s, "async": messages / async_s, "receive_ack": got / receive_s}


async def _tidelog_latency(client: AsyncClient, topic: str, messages: int) -> list[float]:
    """Seconds from each send (one at a time) to its receipt by a shared consumer already waiting
    in a poll (20 s)."""
    consumer = client.consumer("g-tidelog-latency", topic, mode="shared", start="earliest")
    producer = client.producer()
    seen: list[float] = []

    async def receiver() -> None:
        while len(seen) < messages:
            batch = await consumer.poll(max_messages=32, timeout=20.0)
            now = time.time()
            seen.extend(now - float(m.properties["sent"]) for m in batch)
            for m in batch:
                asyncio.ensure_future(consumer.ack(m))  # type: ignore[attr-defined]

    try:
        task = asyncio.ensure_future(receiver())
        await asyncio.sleep(1.0)  # the consumer's first poll is waiting
        for i in range(messages):
            await producer.send(topic, BODY, f"k{i}", None, {"sent": repr(time.time())})
        await within(task, 60)
    finally:
        await consumer.close()
    return seen


def _progress(what: str) -> None:
    print(what, file=sys.stderr, flush=True)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "received": 0}
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50_ms": round(at(0.50) * 1000, 1),
        "p99_ms": round(at(0.99) * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
        "received": len(ordered),
    }


def _node(endpoint: str, messages: int, in_flight: int) -> dict[str, Any] | None:
    """The Node.js client's figures, or None without Node or the package."""
    if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").exists():
        return None
    args = {
        "topic": "node",
        "latencyTopic": "node-latency",
        "group": "g-node",
        "messages": messages,
        "inFlight": in_flight,
    }
    with tempfile.TemporaryDirectory() as home:  # the client logs into files under $HOME
        out = subprocess.run(
            ["node", str(NODE_DIR / "driver.js"), endpoint, "bench", json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=NODE_DIR,
            env={**os.environ, "HOME": home},
        )
    if out.returncode != 0:
        raise RuntimeError(f"the Node.js client's run failed: {out.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


async def _rocketmq_endpoint(client: AsyncClient, master: str) -> str:
    status = await client.call_broker(master, "Status", bpb.StatusRequest(), timeout=5.0)
    return str(status.rocketmq_address)


def _official(endpoint: str, topic: str, messages: int, in_flight: int) -> dict[str, Any]:
    out = subprocess.run(
        # -P: the script's folder (bench/, which holds rocketmq.py) stays off sys.path, so that
        # `import rocketmq` finds the official client
        [
            sys.executable,
            "-P",
            str(WORKER),
            endpoint,
            topic,
            "g-rocketmq",
            str(messages),
            str(in_flight),
            f"{topic}-latency",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the official client's run failed: {out.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-rocketmq-"))
    options = dict(SYNC_REPLICATED)
    try:
        with BenchCluster(root, broker_options=options) as cluster:
            for topic in (
                "tidelog",
                "tidelog-latency",
                "rocketmq",
                "rocketmq-latency",
                "node",
                "node-latency",
            ):
                cluster.wait_ready(topic, queues=args.queues)

            async def go() -> tuple[str, dict[str, Any]]:
                async with AsyncClient(cluster.controller_address) as client:
                    endpoint = await _rocketmq_endpoint(client, cluster.master_address)
                    figures: dict[str, Any] = await _tidelog(client, "tidelog", args.messages, args.in_flight)
                    figures = {k: round(v) for k, v in figures.items()}
                    figures["latency"] = _percentiles(
                        await _tidelog_latency(client, "tidelog-latency", args.messages)
                    )
                    return endpoint, figures

            t0 = time.monotonic()
            endpoint, own = loops.run(go())
            _progress(f"tidelog client done after {time.monotonic() - t0:.1f}s")
            official = _official(endpoint, "rocketmq", args.messages, args.in_flight)
            _progress(f"RocketMQ Python client done after {time.monotonic() - t0:.1f}s")
            official["latency"] = _percentiles(official.pop("latency_s"))
            node = _node(endpoint, args.messages, args.in_flight)
            if node is not None:
                node["latency"] = _percentiles(node.pop("latency_s"))
                _progress(f"RocketMQ Node.js client done after {time.monotonic() - t0:.1f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "commit": code_version(("commitlog", "broker", "client", "ha", "tidelog")),
        "messages": args.messages,
        "queues": args.queues,
        "in_flight": args.in_flight,
        "tidelog": own,
        "rocketmq": official,
        "rocketmq_node": node,
    }


def format_table(r: dict[str, Any]) -> str:
    node = r.get("rocketmq_node") or {}
    lines = [
        f"{r['messages']:,} messages of 1 KiB per phase, {r['queues']} queues, "
        f"{r['in_flight']} in flight, commit {r['commit']}",
        f"  {'':38} {'tidelog client':>15} {'RocketMQ Python':>16} {'RocketMQ Node.js':>17}",
    ]
    rows = (
        ("send, one at a time (msg/s)", "sync"),
        (f"send, {r['in_flight']} in flight (msg/s)", "async"),
        ("receive 32 + ack each (msg/s)", "receive_ack"),
    )
    for label, key in rows:
        lines.append(
            f"  {label:38} {r['tidelog'][key]:>15,} {r['rocketmq'][key]:>16,} {node.get(key, '-'):>17}"
        )
    for label, key in (
        ("receive latency p50 (ms)", "p50_ms"),
        ("receive latency p99 (ms)", "p99_ms"),
    ):
        cells = [c["latency"][key] if c else "-" for c in (r["tidelog"], r["rocketmq"], node)]
        lines.append(f"  {label:38} {cells[0]:>15} {cells[1]:>16} {cells[2]:>17}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000, help="messages per phase")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report(run(args), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
