"""Data-plane benchmark: the public client against a broker set, with the CPU each process spends.

The workloads of the peers' harness (`run_all.sh`, `bench_tidelog.py`), run through the same
public API (`tidelog.client.aio.AsyncClient`), plus what each process spent per 1,000 messages,
which tells where the time goes independently of how busy the machine is:

- produce: `send_batch` of 1,000 messages of 1 KiB, one batch at a time, for `--seconds`;
- send: `send()` with 1,000 in flight (one asyncio task per message, as bench_tidelog does);
- latency: single `send()` calls one at a time (p50/p99/p999/max), under this cluster's flush mode;
- consume: everything produced read back from the start by a `reader` (which reads a slave first),
  then the same pulls sent to the master (`AsyncClient.pull_records`, decoded as the reader does).

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback,
`replication: sync`, `in_sync_replicas: 2`, 256 MiB segments) with `--flush async|sync`, stops every
process it started. Run from the repository root:

    python -m bench.dataplane                    # flush: async
    python -m bench.dataplane --flush sync --json
    python -m bench.dataplane --ha-copy          # the master streams to its slave by read and write
    TIDELOG_EVENT_LOOP=asyncio python -m bench.dataplane    # without uvloop (this process and the servers)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import BenchCluster
from bench.commitlog import code_version, report
from bench.produce import CpuMeter, latency_summary
from bench.sendfloor import harness_loop
from tidelog import loops
from tidelog.client.aio import AsyncClient, OutMessage
from tidelog.commitlog.batch import RecordView, walk
from tidelog.dataport_frames import PullCall

TOPIC = "bench"
BODY = b"x" * 1024
BATCH = 1000


def per_thousand(cpu: dict[str, float], seconds: float, messages: int) -> dict[str, float]:
    """CPU ms each process spent per 1,000 messages, from CpuMeter's percent of one core."""
    return {k: round(v / 100 * seconds * 1000 / messages * 1000, 2) for k, v in cpu.items()}


async def _produce(client: AsyncClient, meter: CpuMeter, seconds: float) -> dict[str, Any]:
    producer = client.producer()
    batch = [OutMessage(BODY)] * BATCH
    n, t0 = 0, time.perf_counter()
    meter.start()
    while time.perf_counter() - t0 < seconds:
        n += len(await producer.send_batch(TOPIC, batch))
    dt = time.perf_counter() - t0
    return {"msgs_per_s": round(n / dt), "messages": n, "cpu_ms_per_1000": per_thousand(meter.stop(), dt, n)}


async def _send_in_flight(client: AsyncClient, meter: CpuMeter, seconds: float) -> dict[str, Any]:
    """`send()` with 1,000 in flight, in the peers harness's own loop (bench/sendfloor.py)."""
    producer = client.producer()
    meter.start()
    done, dt = await harness_loop(producer, seconds, TOPIC, BODY)
    cpu = per_thousand(meter.stop(), dt, done)
    return {"msgs_per_s": round(done / dt), "messages": done, "cpu_ms_per_1000": cpu}


async def _latency(client: AsyncClient, count: int) -> dict[str, Any]:
    producer = client.producer()
    await producer.send(TOPIC, BODY)
    times = []
    for _ in range(count):
        t = time.perf_counter()
        await producer.send(TOPIC, BODY)
        times.append(time.perf_counter() - t)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in latency_summary(times).items()}


async def _consume(client: AsyncClient, meter: CpuMeter, total: int) -> dict[str, Any]:
    reader = client.reader(TOPIC, 0, 0)
    got, t0 = 0, time.perf_counter()
    meter.start()
    while got < total:
        batch = await reader.read(max_messages=BATCH, timeout=1.0)
        if not batch:
            break
        got += len(batch)
    dt = time.perf_counter() - t0
    return {
        "msgs_per_s": round(got / dt),
        "messages": got,
        "cpu_ms_per_1000": per_thousand(meter.stop(), dt, got),
    }


async def _consume_master(client: AsyncClient, meter: CpuMeter, address: str, total: int) -> dict[str, Any]:
    got, t0 = 0, time.perf_counter()
    meter.start()
    while got < total:
        reply = await client.pull_records(address, PullCall(TOPIC, 0, got, BATCH, 0, 0), 10.0)
        if not reply.count:
            break
        got += len([RecordView(reply.records, pos, "") for pos in walk(reply.records, address, 0)])
    dt = time.perf_counter() - t0
    return {
        "msgs_per_s": round(got / dt),
        "messages": got,
        "cpu_ms_per_1000": per_thousand(meter.stop(), dt, got),
    }


async def _run(cluster: BenchCluster, args: argparse.Namespace) -> dict[str, Any]:
    pids = {k: v for k, v in cluster.pids.items() if not k.startswith("controller")}
    meter = CpuMeter({**pids, "client": os.getpid()})
    out: dict[str, Any] = {}
    async with AsyncClient(cluster.controller_address) as client:
        await client.producer().send(TOPIC, BODY)  # route and connections warm
        out["produce_batch_1000"] = await _produce(client, meter, args.seconds)
        out["send_1000_in_flight"] = await _send_in_flight(client, meter, args.seconds)
        out["latency_one_at_a_time"] = await _latency(client, args.latency_count)
        total = out["produce_batch_1000"]["messages"] + out["send_1000_in_flight"]["messages"]
        out["consume"] = await _consume(client, meter, total)
        out["consume_from_master"] = await _consume_master(client, meter, cluster.master_address, total)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-dataplane-"))
    options = {
        "replication": "sync",
        "in_sync_replicas": 2,
        "auto_in_sync_replicas": True,
        "flush": args.flush,
        "segment_bytes": 256 << 20,
        "ha_zero_copy": not args.ha_copy,
    }
    try:
        with BenchCluster(root, broker_options=options) as cluster:
            cluster.wait_ready(TOPIC, queues=1)
            figures = loops.run(_run(cluster, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "commit": code_version(("commitlog", "broker", "client", "ha", "tidelog")),
        "flush": args.flush,
        "ha_zero_copy": not args.ha_copy,
        "event_loop": loops.name(),
        **figures,
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"tidelog data plane, flush: {r['flush']}, loop: {r['event_loop']}, "
        f"HA zero copy: {r['ha_zero_copy']}, commit {r['commit']}"
    ]
    for name in ("produce_batch_1000", "send_1000_in_flight", "consume", "consume_from_master"):
        f = r[name]
        cpu = ", ".join(f"{k} {v}" for k, v in f["cpu_ms_per_1000"].items())
        lines.append(f"  {name:22} {f['msgs_per_s']:>9,} msgs/s   CPU ms per 1,000 msgs: {cpu}")
    lat = r["latency_one_at_a_time"]
    lines.append(
        f"  {'latency, one at a time':22} p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, "
        f"p999 {lat['p999_ms']} ms, max {lat['max_ms']} ms ({lat['count']} sends)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flush", choices=("async", "sync"), default="async")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each throughput phase")
    ap.add_argument("--latency-count", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--ha-copy",
        action="store_true",
        help="the master reads and writes what it streams (ha_zero_copy: false)",
    )
    args = ap.parse_args(argv)
    report(run(args), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
