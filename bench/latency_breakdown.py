"""Where a single send's time goes: the gRPC floor, the local append, replication, fsync.

Starts its own clusters (bench.cluster: one controller, a broker set of 1 or 2 replicas on
loopback) and times sequential single-message calls (1 KiB, one queue) over raw `grpc.aio`
stubs, each awaited before the next, then through the public `AsyncClient`:

- `Status` on the master: a gRPC round trip that does no work (the transport's floor);
- `Produce`, one replica (`replication: sync` but nobody to wait for): the floor plus the
  broker's request handling and the append;
- `Produce`, two replicas: plus the HA round trip (master -> slave -> ack -> release);
- the same through `AsyncClient.producer().send()`: plus the client library;

each under `flush: async` and `flush: sync` (which adds an fdatasync on each replica). The
differences between rows attribute the time. Run from the repository root:

    python -m bench.latency_breakdown            # table
    python -m bench.latency_breakdown --json
    python -m bench.latency_breakdown --sends 500   # shorter
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.cluster import BenchCluster
from bench.commitlog import code_version, pick_base_dir, report
from bench.produce import latency_summary
from tidelog.client.aio import AsyncClient
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

TOPIC = "lat"
BODY = b"x" * 1024


async def _time(n: int, call: Any) -> dict[str, float]:
    for _ in range(min(200, n)):  # warm the channel and the broker's code paths
        await call()
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        took.append(time.perf_counter() - t0)
    took.sort()
    return latency_summary(took)


async def _measure(cluster: BenchCluster, n: int, with_status: bool) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    async with grpc.aio.insecure_channel(cluster.master_address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        if with_status:
            out["status"] = await _time(n, lambda: stub.Status(pb.StatusRequest()))
        request = pb.ProduceRequest(topic=TOPIC, messages=[pb.ProduceMessage(body=BODY, queue=0)])
        out["produce"] = await _time(n, lambda: stub.Produce(request))
    async with AsyncClient(cluster.controller_address) as client:
        producer = client.producer()
        out["client_send"] = await _time(n, lambda: producer.send(TOPIC, BODY))
    return out


def run(base_dir: str, sends: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "code": code_version(("commitlog", "ha", "broker", "client")),
        "sends": sends,
        "rows": [],
    }
    for flush in ("async", "sync"):
        for replicas in (1, 2):
            with (
                tempfile.TemporaryDirectory(dir=base_dir) as tmp,
                BenchCluster(
                    Path(tmp), replicas=replicas, broker_options={"flush": flush, "replication": "sync"}
                ) as cluster,
            ):
                cluster.wait_ready(TOPIC, queues=1)
                figures = asyncio.run(
                    _measure(cluster, sends, with_status=flush == "async" and replicas == 1)
                )
            for what, summary in figures.items():
                result["rows"].append({"flush": flush, "replicas": replicas, "call": what, **summary})
    return result


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"single-message latency breakdown, code {r['code']}, {r['sends']} sequential calls per row, 1 KiB",
        f"{'flush':6} {'replicas':>8} {'call':12} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8} {'max ms':>8}",
    ]
    for row in r["rows"]:
        lines.append(
            f"{row['flush']:6} {row['replicas']:>8} {row['call']:12} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f} {row['p999_ms']:>8.2f} {row['max_ms']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency_breakdown", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--sends", type=int, default=2000, help="sequential calls per row (default 2000)")
    ap.add_argument("--dir", default=None, help="parent directory for the clusters' data")
    args = ap.parse_args(argv)
    report(run(pick_base_dir(args.dir), args.sends), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
