"""Consume throughput in the shared mode (each message acknowledged) beside the clustering mode.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback,
`replication: sync`, `in_sync_replicas: 2`, `flush: async`), fills a topic of `--queues` queues
with `--messages` messages of 1 KiB, then reads all of them back, each phase with a new group:

- clustering: one member, `poll` batches of 256, offsets committed every second (auto-commit);
- shared, acknowledged per batch: one member, `poll` batches of 256, `ack_all` of each batch;
- shared, acknowledged one by one: one member, `ack` of each message (one request each);
- shared, acknowledged one by one but all of a batch at once: `ack` of each message from its own
  task, which the broker writes together (one record per queue for the calls that wait together);
- key_shared, acknowledged per batch: as shared, the messages carrying 1,000 distinct keys.

Each phase gives messages/s and the CPU each process spent per 1,000 messages. Run from the
repository root:

    python -m bench.shared                  # table
    python -m bench.shared --messages 20000 --json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import SYNC_REPLICATED, BenchCluster
from bench.commitlog import code_version, report
from bench.dataplane import per_thousand
from bench.produce import CpuMeter
from tidelog import loops
from tidelog.client.aio import AsyncClient, OutMessage

BODY = b"x" * 1024


async def _fill(client: AsyncClient, topic: str, messages: int, keys: int) -> None:
    producer = client.producer()
    sent = 0
    while sent < messages:
        n = min(1000, messages - sent)
        batch = [OutMessage(BODY, f"k{(sent + i) % keys}" if keys else None) for i in range(n)]
        await producer.send_batch(topic, batch)
        sent += n


async def _consume(
    client: AsyncClient, meter: CpuMeter, topic: str, group: str, messages: int, mode: str, ack: str
) -> dict[str, Any]:
    consumer = client.consumer(group, topic, mode=mode, start="earliest")
    got, t0 = 0, time.perf_counter()
    meter.start()
    try:
        while got < messages:
            batch = await consumer.poll(max_messages=256, timeout=1.0)
            if not batch and time.perf_counter() - t0 > 120:
                break
            if ack == "batch":
                await consumer.ack_all(batch)  # type: ignore[attr-defined]
            elif ack == "each":
                for m in batch:
                    await consumer.ack(m)  # type: ignore[attr-defined]
            elif ack == "together":  # one ack() per message, all of a batch at once
                await asyncio.gather(*(consumer.ack(m) for m in batch))  # type: ignore[attr-defined]
            got += len(batch)
        dt = time.perf_counter() - t0
        cpu = meter.stop()
    finally:
        await consumer.close()
    return {
        "msgs_per_s": round(got / dt),
        "messages": got,
        "cpu_ms_per_1000": per_thousand(cpu, dt, max(1, got)),
    }


async def _run(cluster: BenchCluster, args: argparse.Namespace) -> dict[str, Any]:
    pids = {k: v for k, v in cluster.pids.items() if not k.startswith("controller")}
    meter = CpuMeter({**pids, "client": os.getpid()})
    out: dict[str, Any] = {}
    async with AsyncClient(cluster.controller_address) as client:
        await _fill(client, "plain", args.messages, 0)
        await _fill(client, "keyed", args.messages, 1000)
        phases = [
            ("clustering", "plain", "clustering", "commit"),
            ("shared_ack_per_batch", "plain", "shared", "batch"),
            ("shared_ack_each", "plain", "shared", "each"),
            ("shared_ack_each_concurrently", "plain", "shared", "together"),
            ("key_shared_ack_per_batch", "keyed", "key_shared", "batch"),
        ]
        for name, topic, mode, ack in phases:
            out[name] = await _consume(client, meter, topic, f"g-{name}", args.messages, mode, ack)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-shared-"))
    options = dict(SYNC_REPLICATED)
    try:
        with BenchCluster(root, broker_options=options) as cluster:
            cluster.wait_ready("plain", queues=args.queues)
            cluster.wait_ready("keyed", queues=args.queues)
            figures = loops.run(_run(cluster, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "commit": code_version(("commitlog", "broker", "client", "ha", "tidelog")),
        "messages": args.messages,
        "queues": args.queues,
        **figures,
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [f"consume {r['messages']:,} messages of 1 KiB from {r['queues']} queues, commit {r['commit']}"]
    names = ("clustering", "shared_ack_per_batch", "shared_ack_each", "shared_ack_each_concurrently")
    for name in (*names, "key_shared_ack_per_batch"):
        f = r[name]
        cpu = ", ".join(f"{k} {v}" for k, v in f["cpu_ms_per_1000"].items())
        lines.append(f"  {name:26} {f['msgs_per_s']:>9,} msgs/s   CPU ms per 1,000 msgs: {cpu}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report(run(args), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
