"""`tide demo`: the main job that `make run` runs.

By default it starts the embedded default cluster (deploy/local.yaml: one controller, one broker
set of two replicas, on loopback ports), creates a topic, produces and consumes with a
three-member consumer group, runs the kill-master drill, prints the summary and stops every
process it started. `--storage` instead walks the storage engine alone: group-commit writes, a
simulated crash with a torn tail, recovery, and a replica copy compared byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from tidelog.cli.common import console
from tidelog.commitlog import CommitLog, Message

SEGMENT_BYTES = 256 * 1024
TOPIC = "demo"
QUEUES = 4


async def _produce(log: CommitLog, producers: int, per_producer: int) -> list[tuple[int, int, bytes]]:
    """Concurrent sync-flushed producers; returns (queue, queue offset, body) of every ack."""
    acked: list[tuple[int, int, bytes]] = []

    async def producer(pid: int) -> None:
        for i in range(per_producer):
            body = f"producer {pid} message {i} ".encode() + os.urandom(200)
            queue = (pid + i) % QUEUES
            placed = log.append([Message(TOPIC, queue, body, key=f"p{pid}")])[0]
            await log.flushed(placed.phys_offset + placed.size)
            acked.append((queue, placed.queue_offset, body))

    await asyncio.gather(*(producer(p) for p in range(producers)))
    return acked


def _read_everything(log: CommitLog) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for topic, queue in log.queues():
        offset = log.queue_offsets(topic, queue).min
        while batch := log.read(topic, queue, offset, 256):
            for m in batch:
                out[(queue, m.queue_offset)] = m.body
            offset = batch[-1].queue_offset + 1
    return out


def _files_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for f in sorted((directory / "commitlog").iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def run_storage_demo(workdir: Path, producers: int = 16, per_producer: int = 200) -> dict[str, Any]:
    live = workdir / "broker-a-0"
    log = CommitLog.open(live, segment_bytes=SEGMENT_BYTES, flush="sync")
    t0 = time.perf_counter()
    acked = asyncio.run(_produce(log, producers, per_producer))
    produce_s = time.perf_counter() - t0
    # unflushed work that a crash may tear: appended but never acknowledged
    log.append([Message(TOPIC, 0, b"never acknowledged " + os.urandom(300)) for _ in range(50)])
    crash = workdir / "after-crash"
    shutil.copytree(live, crash)  # what the disk holds if the process dies now
    log.close()
    last = sorted((crash / "commitlog").iterdir())[-1]
    with open(last, "r+b") as f:  # tear the tail mid-record
        f.truncate(max(0, last.stat().st_size - 123))

    recovered = CommitLog.open(crash, segment_bytes=SEGMENT_BYTES)
    recovered.confirm_offset = recovered.max_offset
    stored = _read_everything(recovered)
    lost = sum(1 for q, off, body in acked if stored.get((q, off)) != body)

    replica_dir = workdir / "broker-a-1"
    replica = CommitLog.open(replica_dir, segment_bytes=SEGMENT_BYTES)
    offset = 0
    while offset < recovered.max_offset:
        offset = replica.append_raw(offset, recovered.read_raw(offset, 256 * 1024))
    replica.flush()
    same = _files_digest(crash) == _files_digest(replica_dir)
    summary = {
        "producers": producers,
        "acknowledged": len(acked),
        "acked_per_s": round(len(acked) / produce_s),
        "segments": len(list((crash / "commitlog").iterdir())),
        "recovered_max_offset": recovered.max_offset,
        "readable_after_crash": len(stored),
        "acked_lost": lost,
        "replica_byte_identical": same,
    }
    recovered.close()
    replica.close()
    return summary


DEFAULT_TOPOLOGY = """
host: 127.0.0.1
ports: auto
controller: {nodes: 1, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 2500}
broker_sets: [{name: broker-a, replicas: 2}]
broker: {segment_bytes: 67108864, flush: async, replication: sync, in_sync_replicas: 2,
         min_in_sync_replicas: 1, auto_in_sync_replicas: true, heartbeat_interval_ms: 500,
         ha_heartbeat_interval_ms: 500}
"""


def run_cluster_demo(workdir: Path, topology: Path | None, drill_s: float, say: Any) -> dict[str, Any]:
    from tidelog import localcluster
    from tidelog.client import Client, OutMessage
    from tidelog.drill.killmaster import kill_master

    if topology is None:
        topology = workdir / "local.yaml"
        topology.write_text(DEFAULT_TOPOLOGY)
    data_dir = workdir / "cluster"
    say("starting one controller and broker set broker-a (2 replicas) on loopback ...")
    state = localcluster.up(localcluster.load_topology(topology), data_dir)
    try:
        with Client(state["controllers"], **localcluster.client_options(state)) as client:
            client.admin().create_topic("demo", queues=4)
            say("producing 2,000 messages with sync replication ...")
            producer = client.producer()
            sent = []
            for i in range(20):
                batch = [
                    OutMessage(f"order {i * 100 + j}".encode(), key=f"customer-{j % 7}") for j in range(100)
                ]
                sent += producer.send_batch("demo", batch)
            say("consuming them with a consumer group of three members ...")
            members = [
                client.consumer(group="demo-readers", topic="demo", heartbeat_interval=0.3) for _ in range(3)
            ]
            seen: set[tuple[int, int]] = set()
            deadline = time.monotonic() + 30
            while len(seen) < len(sent) and time.monotonic() < deadline:
                for member in members:
                    seen.update((m.queue, m.offset) for m in member.poll(max_messages=500, timeout=0.2))
            for member in members:
                member.close()
        say(f"drill: kill -9 the master of broker-a while producing for {drill_s:.0f}s ...")
        drill = kill_master(data_dir, "broker-a", drill_s, on_event=lambda m: say(f"  {m}"))
    finally:
        localcluster.down(data_dir)
    return {
        "produced": len(sent),
        "consumed": len(seen),
        "drill_acked": drill["acked"],
        "drill_acked_lost": drill["acked_lost"],
        "drill_duplicates": drill["duplicates"],
        "failover_s": drill["failover_s"],
        "max_write_gap_s": drill["max_write_gap_s"],
        "rejoin_s": drill["rejoin_s"],
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON object")
@click.option("--storage", is_flag=True, help="walk the storage engine alone (no processes)")
@click.option(
    "-c",
    "--config",
    "topology",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="topology file (default: the embedded default of deploy/local.yaml)",
)
@click.option(
    "--drill-duration",
    default=15.0,
    show_default=True,
    envvar="TIDE_DEMO_DRILL_DURATION",
    show_envvar=True,
    help="seconds of the kill-master drill (`make run` passes no options: set it in the environment)",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="run in this directory and keep the data",
)
def demo(
    as_json: bool, storage: bool, topology: Path | None, drill_duration: float, keep: Path | None
) -> None:
    """Start the embedded default cluster, produce, consume, kill the master, show that nothing was lost."""

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg)

    with tempfile.TemporaryDirectory(prefix="tide-demo-") as tmp:
        workdir = keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if storage:
            summary = run_storage_demo(workdir)
            bad = bool(summary["acked_lost"]) or not summary["replica_byte_identical"]
        else:
            summary = run_cluster_demo(workdir, topology, drill_duration, say)
            bad = bool(summary["drill_acked_lost"]) or summary["consumed"] < summary["produced"]
    if as_json:
        click.echo(json.dumps(summary))
    else:
        table = Table(title="tidelog demo" + (": storage engine" if storage else ""))
        table.add_column("what")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key.replace("_", " "), str(value))
        console().print(table)
    if bad:
        raise click.ClickException("the demo found lost or diverging data")
