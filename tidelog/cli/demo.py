"""`tide demo`: the main job that `make run` runs.

For now it exercises the storage engine end to end on a temporary directory: sync-flushed
appends from concurrent producers (group commit), reading back every acknowledged message,
a simulated crash that tears the log's tail, recovery, and a replica copy over the raw
replication interface compared byte for byte. Later stages grow it into a whole local cluster.
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
from rich.console import Console
from rich.table import Table

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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON object")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run in this directory and keep the data")
def demo(as_json: bool, keep: Path | None) -> None:
    """Write, crash, recover and replicate a commit log; print what survived."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        summary = run_storage_demo(keep)
    else:
        with tempfile.TemporaryDirectory(prefix="tide-demo-") as tmp:
            summary = run_storage_demo(Path(tmp))
    if as_json:
        click.echo(json.dumps(summary))
    else:
        table = Table(title="tidelog demo: storage engine")
        table.add_column("what")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key.replace("_", " "), str(value))
        Console().print(table)
    if summary["acked_lost"] or not summary["replica_byte_identical"]:
        raise click.ClickException("the demo found lost or diverging data")
