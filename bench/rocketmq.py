"""The official RocketMQ client against tidelog's RocketMQ endpoint (broker/rocketmq.py), beside
tidelog's own client, on one cluster and one workload: messages of 1 KiB with a key.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback,
`replication: sync`, `in_sync_replicas: 2`, `flush: async`) and measures, for each client:

- send, one at a time: each send waits for its receipt before the next;
- send, many in flight: `--in-flight` sends outstanding (the official client's `send_async`,
  tidelog's `send` from as many tasks);
- receive + acknowledge: batches of 32 in the shared mode, each message acknowledged on its own
  (the official client's SimpleConsumer, acknowledging from 16 threads; tidelog's shared consumer,
  acknowledging a batch's messages concurrently). Every message sent by both send phases is read.

The official client (rocketmq-python-client) runs in a process of its own
(bench/rocketmq_client.py): its generated protobuf modules and tidelog's cannot share one. Run
from the repository root:

    python -m bench.rocketmq                  # table
    python -m bench.rocketmq --messages 2000 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

BODY = b"x" * 1024
WORKER = Path(__file__).with_name("rocketmq_client.py")


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


async def _rocketmq_endpoint(client: AsyncClient, master: str) -> str:
    status = await client.call_broker(master, "Status", bpb.StatusRequest(), timeout=5.0)
    return str(status.rocketmq_address)


def _official(endpoint: str, topic: str, messages: int, in_flight: int) -> dict[str, float]:
    out = subprocess.run(
        # -P: the script's folder (bench/, which holds rocketmq.py) stays off sys.path, so that
        # `import rocketmq` finds the official client
        [sys.executable, "-P", str(WORKER), endpoint, topic, "g-rocketmq", str(messages), str(in_flight)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the official client's run failed: {out.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-rocketmq-"))
    options = dict(SYNC_REPLICATED)
    try:
        with BenchCluster(root, broker_options=options) as cluster:
            cluster.wait_ready("tidelog", queues=args.queues)
            cluster.wait_ready("rocketmq", queues=args.queues)

            async def go() -> tuple[str, dict[str, float]]:
                async with AsyncClient(cluster.controller_address) as client:
                    endpoint = await _rocketmq_endpoint(client, cluster.master_address)
                    return endpoint, await _tidelog(client, "tidelog", args.messages, args.in_flight)

            endpoint, own = loops.run(go())
            official = _official(endpoint, "rocketmq", args.messages, args.in_flight)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "commit": code_version(("commitlog", "broker", "client", "ha", "tidelog")),
        "messages": args.messages,
        "queues": args.queues,
        "in_flight": args.in_flight,
        "tidelog": {k: round(v) for k, v in own.items()},
        "rocketmq": official,
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['messages']:,} messages of 1 KiB per send phase, {r['queues']} queues, "
        f"{r['in_flight']} in flight, commit {r['commit']} (messages/s)",
        f"  {'':34} {'tidelog client':>15} {'RocketMQ client':>16}",
    ]
    rows = (
        ("send, one at a time", "sync"),
        (f"send, {r['in_flight']} in flight", "async"),
        ("receive 32 + ack each (shared)", "receive_ack"),
    )
    for label, key in rows:
        lines.append(f"  {label:34} {r['tidelog'][key]:>15,} {r['rocketmq'][key]:>16,}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="messages per send phase")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report(run(args), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
