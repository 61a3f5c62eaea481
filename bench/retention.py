"""Retention under load: a broker set's disk use while a producer runs (docs/ARCHITECTURE.md §6.4).

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas with sync
replication, small segments and a short retention), produces 1 KiB messages for `--seconds`
through the client (many sends in flight), samples each replica's data directory every second,
and prints what was sent against what the disks held: with retention each replica holds about
the retention time's worth plus a few segments, however long the producer runs.

    python -m bench.retention --seconds 60 --retention-ms 5000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from bench.cluster import BenchCluster
from tidelog.broker.metrics import disk_used_bytes
from tidelog.client import Client

TOPIC = "retained"
BODY = b"r" * 1024
IN_FLIGHT = 256


def produce(cluster: BenchCluster, seconds: float) -> dict[str, Any]:
    """Produce for `seconds`; sample both replicas' disk use every second."""
    samples: list[tuple[float, int, int]] = []
    sent = 0
    with Client(cluster.controller_address) as client:
        producer = client.producer()
        pending: list[Future[Any]] = []
        start = time.monotonic()
        next_sample = start
        while (now := time.monotonic()) < start + seconds:
            if now >= next_sample:
                dirs = [cluster.root / f"{cluster.broker_set}-{i}" for i in range(len(cluster.brokers))]
                samples.append((round(now - start, 1), *(disk_used_bytes(d) for d in dirs)))
                next_sample += 1.0
            pending.append(producer.send_async(TOPIC, BODY))
            if len(pending) >= IN_FLIGHT:
                for fut in pending:
                    fut.result()
                sent += len(pending) * len(BODY)
                pending.clear()
        for fut in pending:
            fut.result()
        sent += len(pending) * len(BODY)
    return {"sent_bytes": sent, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--retention-ms", type=int, default=5000)
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    options = {
        "segment_bytes": args.segment_bytes,
        "retention_ms": args.retention_ms,
        "retention_check_interval_ms": 500,
        "replication": "sync",
        "in_sync_replicas": 2,
    }
    with (
        tempfile.TemporaryDirectory(prefix="tidelog-retention-") as tmp,
        BenchCluster(Path(tmp), broker_options=options) as cluster,
    ):
        cluster.wait_ready(TOPIC, 4)
        result = produce(cluster, args.seconds)
    late = result["samples"][len(result["samples"]) // 2 :]
    result.update(
        seconds=args.seconds,
        retention_ms=args.retention_ms,
        segment_bytes=args.segment_bytes,
        max_disk_bytes_second_half=[max(s[i] for s in late) for i in (1, 2)],
    )
    if args.json:
        print(json.dumps(result))
        return
    mib = 1 << 20
    print(
        f"sent {result['sent_bytes'] / mib:.0f} MiB in {args.seconds:.0f} s, retention {args.retention_ms} ms, "
        f"segments {args.segment_bytes / mib:.1f} MiB"
    )
    for t, a, b in result["samples"][:: max(1, len(result["samples"]) // 12)]:
        print(f"  t={t:5.1f}s  replica 0 {a / mib:7.1f} MiB   replica 1 {b / mib:7.1f} MiB")
    m0, m1 = result["max_disk_bytes_second_half"]
    print(f"largest disk use in the second half: {m0 / mib:.1f} / {m1 / mib:.1f} MiB")


if __name__ == "__main__":
    main()
