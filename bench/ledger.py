"""Ledger API benchmark: add latency, pipelined add throughput, recovery open and reads.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas, all on
loopback, `replication: sync, in_sync_replicas: 2, auto_in_sync_replicas: true, flush: async`,
256 MiB segments), drives it through the asyncio ledger client
(`AsyncLedgers(AsyncClient(controllers))`), stops every process it started and prints the figures.
Run from the repository root:

    python -m bench.ledger              # table, about 45 s
    python -m bench.ledger --json       # machine-readable
    python -m bench.ledger --quick      # shorter phases and a smaller ledger, ~15 s

Every entry carries 1 KiB of data; every ledger is E = WQ = 2, AQ = 2 (an add is acknowledged
once both replicas hold it), digest crc32c. MB = 10^6 bytes of entry data.

- sequential adds: one `add_entry` at a time (the next is sent when the previous is
  acknowledged), ~500 adds after 20 untimed ones; p50/p99 of each add's call-to-ack time;
- pipelined adds: `add_entry_async` keeping 1, 16, 128 and 1,000 adds in flight (a new add is
  made as soon as the oldest completes; they complete in id order) for a few seconds each, on a
  fresh ledger each; entries/s counts every add acknowledged, up to the last acknowledgement.
  The writer sends the adds in batches, one `AddBatch` call each (ledger/writer.py): "per call"
  is the mean number of entries a call carried;
- many ledgers: 32 fresh ledgers on the broker set, 8 adds in flight on each, all at once, for
  the same few seconds; "calls per frame" is how many ledgers' `AddBatch` calls a data-port
  frame carried on average (ledger/coalesce.py: the calls made in one turn of the event loop
  for one broker share a LEDGER_ADDS frame);
- recovery open: a ledger of ~10,000 entries (written with 128 in flight, all acknowledged)
  whose writer then stops without closing it (its client goes away, the ledger stays OPEN);
  another client times `open_ledger(id, password, recovery=True)`: mark IN_RECOVERY, fence both
  replicas, read and rewrite what lies past the replicas' LAC, CLOSE;
- reads: `read_entries(0, last)` over that recovered ledger in one call (the client loops over
  the replicas' reply limits), three passes from the page cache; entries/s and MB/s.

Each phase also records the CPU each process used, in percent of one core, and what the rest
of the machine used meanwhile ("others"): client and servers share the cores with whatever
else runs there.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cluster import BenchCluster
from bench.commitlog import code_version, pick_base_dir, report
from bench.produce import BROKER_CODE, CpuMeter, latency_summary, machine_info
from tidelog.client.aio import AsyncClient
from tidelog.ledger import AsyncLedgers, NotEnoughBookiesError

ENTRY_BYTES = 1024
ENSEMBLE = WRITE_QUORUM = ACK_QUORUM = 2
PASSWORD = b"bench"
BROKER_OPTIONS: dict[str, Any] = {
    "replication": "sync",
    "in_sync_replicas": 2,
    "auto_in_sync_replicas": True,
    "flush": "async",
    "segment_bytes": 256 << 20,
}
TOPIC = "bench"  # BenchCluster.wait_ready waits on a topic; the ledgers do not use it
WINDOWS = (1, 16, 128, 1000)
MANY_LEDGERS, MANY_WINDOW = 32, 8  # the many-ledgers phase: ledgers, adds in flight on each
RECOVERY_WINDOW = 128  # adds in flight while filling the ledger to recover
READ_PASSES = 3
WARMUP_ADDS = 20


# ---------------------------------------------------------------------------------- helpers


async def _create(ledgers: Any, timeout: float = 30.0) -> Any:
    """A fresh E=WQ=AQ=2 ledger; retried while the set is not yet seen as fully up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await ledgers.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, PASSWORD)
        except NotEnoughBookiesError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _pipelined(
    writer: Any, data: bytes, window: int, *, duration: float | None = None, count: int | None = None
) -> dict[str, Any]:
    """Keep `window` adds in flight for `duration` s (or until `count` adds were sent)."""
    in_flight: collections.deque[tuple[float, asyncio.Future[int]]] = collections.deque()
    latencies: list[float] = []
    sent = 0
    start = time.perf_counter()
    deadline = start + duration if duration is not None else float("inf")
    while time.perf_counter() < deadline and (count is None or sent < count):
        if len(in_flight) >= window:
            t, fut = in_flight.popleft()
            await fut
            latencies.append(time.perf_counter() - t)
        in_flight.append((time.perf_counter(), writer.add_entry_async(data)))
        sent += 1
    while in_flight:
        t, fut = in_flight.popleft()
        await fut
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    return {"entries": sent, "seconds": elapsed, "latencies": latencies}


# ---------------------------------------------------------------------------------- phases


async def _run_phases(
    cluster: BenchCluster, *, sequential_adds: int, window_seconds: float, recovery_entries: int
) -> dict[str, Any]:
    data = os.urandom(ENTRY_BYTES)
    out: dict[str, Any] = {}

    def meter() -> CpuMeter:
        m = CpuMeter(cluster.pids)
        m.add("client", os.getpid())
        return m.start()

    async with AsyncClient(cluster.controller_address) as client:
        ledgers = AsyncLedgers(client)
        out["sequential"] = await _sequential(ledgers, data, sequential_adds, meter)
        out["pipelined"] = await _pipelined_windows(ledgers, data, window_seconds, meter)
        out["many_ledgers"] = await _many_ledgers(ledgers, data, window_seconds, meter)

    # (3) a ledger whose writer stops without closing it, then a recovery open by another client
    async with AsyncClient(cluster.controller_address) as writer_client:
        w = await _create(AsyncLedgers(writer_client))
        fill = await _pipelined(w, data, RECOVERY_WINDOW, count=recovery_entries)
        ledger_id, writer_lac = w.ledger_id, w.last_add_confirmed
        # no w.close(): leaving this block closes the writer's connections, the ledger stays OPEN
    async with AsyncClient(cluster.controller_address) as client:
        r, recovered = await _recover(AsyncLedgers(client), ledger_id, writer_lac, meter)
        out["recovery"] = {
            "entries_written": fill["entries"],
            "fill_seconds": fill["seconds"],
            "fill_entries_per_s": fill["entries"] / fill["seconds"],
            **recovered,
        }
        out["read"] = await _read_back(r, ledger_id, meter)
        await r.close()
    return out


async def _sequential(ledgers: Any, data: bytes, adds: int, meter: Callable[[], CpuMeter]) -> dict[str, Any]:
    """(1) sequential adds, one at a time"""
    w = await _create(ledgers)
    for _ in range(WARMUP_ADDS):
        await w.add_entry(data)
    lat: list[float] = []
    m = meter()
    start = time.perf_counter()
    for _ in range(adds):
        t = time.perf_counter()
        await w.add_entry(data)
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    out = {
        "adds": adds,
        "seconds": elapsed,
        "adds_per_s": adds / elapsed,
        "latency": latency_summary(lat),
        "cpu_pct": m.stop(),
    }
    await w.close()
    return out


async def _pipelined_windows(
    ledgers: Any, data: bytes, window_seconds: float, meter: Callable[[], CpuMeter]
) -> list[dict[str, Any]]:
    """(2) pipelined adds, 1 / 16 / 128 in flight, a fresh ledger each"""
    pipelined = []
    for window in WINDOWS:
        w = await _create(ledgers)
        for _ in range(WARMUP_ADDS):
            await w.add_entry(data)
        calls_before = w.add_requests
        m = meter()
        r = await _pipelined(w, data, window, duration=window_seconds)
        cpu = m.stop()
        calls = w.add_requests - calls_before
        await w.close()
        pipelined.append(
            {
                "in_flight": window,
                "entries": r["entries"],
                "seconds": r["seconds"],
                "entries_per_s": r["entries"] / r["seconds"],
                "mb_per_s": r["entries"] * ENTRY_BYTES / r["seconds"] / 1e6,
                "add_latency": latency_summary(r["latencies"]),
                "add_calls": calls,
                "entries_per_call": r["entries"] / max(1, calls),
                "cpu_pct": cpu,
            }
        )
    return pipelined


async def _many_ledgers(
    ledgers: Any, data: bytes, window_seconds: float, meter: Callable[[], CpuMeter]
) -> dict[str, Any]:
    """(2b) MANY_LEDGERS ledgers on the broker set, MANY_WINDOW adds in flight on each, together"""
    writers = [await _create(ledgers) for _ in range(MANY_LEDGERS)]
    for w in writers:
        await w.add_entry(data)
    frames, grouped = ledgers.adds.frames, ledgers.adds.grouped
    calls = sum(w.add_requests for w in writers)
    m = meter()
    runs = await asyncio.gather(*(_pipelined(w, data, MANY_WINDOW, duration=window_seconds) for w in writers))
    cpu = m.stop()
    entries = sum(r["entries"] for r in runs)
    seconds = max(r["seconds"] for r in runs)
    calls = sum(w.add_requests for w in writers) - calls
    frames, grouped = ledgers.adds.frames - frames, ledgers.adds.grouped - grouped
    for w in writers:
        await w.close()
    return {
        "ledgers": MANY_LEDGERS,
        "in_flight_each": MANY_WINDOW,
        "entries": entries,
        "seconds": seconds,
        "entries_per_s": entries / seconds,
        "mb_per_s": entries * ENTRY_BYTES / seconds / 1e6,
        "add_latency": latency_summary([x for r in runs for x in r["latencies"]]),
        "add_calls": calls,
        # calls that shared a LEDGER_ADDS frame with other ledgers' (ledger/coalesce.py), and those frames
        "shared_frames": frames,
        "calls_in_shared_frames": grouped,
        "cpu_pct": cpu,
    }


async def _recover(
    ledgers: Any, ledger_id: int, writer_lac: int, meter: Callable[[], CpuMeter]
) -> tuple[Any, dict[str, Any]]:
    """The timed recovery open of a ledger its writer left OPEN; the opened ledger and its figures."""
    before = await ledgers.get_metadata(ledger_id)
    await ledgers.list_ledgers()  # connect to the controller outside the timed region
    m = meter()
    t = time.perf_counter()
    r = await ledgers.open_ledger(ledger_id, PASSWORD, recovery=True)
    open_s = time.perf_counter() - t
    cpu = m.stop()
    if r.last_add_confirmed < writer_lac or not r.is_closed:
        raise RuntimeError(
            f"recovery closed ledger {ledger_id} at {r.last_add_confirmed}, "
            f"the writer had {writer_lac} acknowledged (closed: {r.is_closed})"
        )
    return r, {
        "state_before": before.state.name,
        "writer_lac": writer_lac,
        "recovered_last_entry": r.last_add_confirmed,
        "state_after": r.metadata.state.name,
        "open_s": open_s,
        "cpu_pct": cpu,
    }


async def _read_back(r: Any, ledger_id: int, meter: Callable[[], CpuMeter]) -> dict[str, Any]:
    """(4) read the whole recovered ledger back, a few passes"""
    last = r.last_add_confirmed
    passes = []
    m = meter()
    for _ in range(READ_PASSES):
        t = time.perf_counter()
        entries = await r.read_entries(0, last)
        passes.append(time.perf_counter() - t)
        if len(entries) != last + 1 or entries[-1].entry_id != last:
            raise RuntimeError(f"read {len(entries)} entries of ledger {ledger_id}, expected {last + 1}")
    cpu = m.stop()
    best, median = min(passes), statistics.median(passes)
    return {
        "entries": last + 1,
        "passes_s": passes,
        "entries_per_s": (last + 1) / median,
        "best_entries_per_s": (last + 1) / best,
        "mb_per_s": (last + 1) * ENTRY_BYTES / median / 1e6,
        "cpu_pct": cpu,
    }


def run(
    base_dir: str, *, sequential_adds: int, window_seconds: float, recovery_entries: int
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tidelog-bench-ledger-", dir=base_dir))
    cluster = BenchCluster(work, broker_options=BROKER_OPTIONS)
    try:
        cluster.start()
        t0 = time.perf_counter()
        cluster.wait_ready(TOPIC, 1)
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "code": code_version((*BROKER_CODE, "ledger", "client")),
            "machine": machine_info(str(work)),
            "load_average_1m": os.getloadavg()[0],
            "config": {
                "entry_bytes": ENTRY_BYTES,
                "ensemble": ENSEMBLE,
                "write_quorum": WRITE_QUORUM,
                "ack_quorum": ACK_QUORUM,
                "broker": BROKER_OPTIONS,
                "sequential_adds": sequential_adds,
                "window_seconds": window_seconds,
                "windows": list(WINDOWS),
                "recovery_entries": recovery_entries,
                "read_passes": READ_PASSES,
            },
            "startup_s": time.perf_counter() - t0,
        }
        result.update(
            asyncio.run(
                _run_phases(
                    cluster,
                    sequential_adds=sequential_adds,
                    window_seconds=window_seconds,
                    recovery_entries=recovery_entries,
                )
            )
        )
        result["sync_state_set_at_end"] = cluster.in_sync_count()
        result["load_average_1m_at_end"] = os.getloadavg()[0]
        return result
    except Exception:
        sys.stderr.write(cluster.logs() + "\n")
        raise
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------- report


def _cpu(cpu: dict[str, float]) -> str:
    return "/".join(f"{cpu.get(k, 0):.0f}" for k in ("master", "slave", "client", "others"))


def format_table(r: dict[str, Any]) -> str:
    m = r["machine"]
    s = r["sequential"]
    seq_name = f"sequential add_entry ({s['adds']} adds)"
    lines = [
        f"tidelog ledger bench, {r['date']}, code {r['code']}, load average (1 min) "
        f"{r['load_average_1m']:.2f} at start, {r['load_average_1m_at_end']:.2f} at end",
        f"machine: {m['cores']} cores shared by the client and all servers, Python {m['python']}, "
        f"grpcio {m['grpc']}, {m['filesystem']} on {m['device']}",
        f"cluster: 1 controller + a broker set of 2 replicas on loopback, replication sync, flush async; "
        f"ledgers E=WQ={ENSEMBLE}, AQ={ACK_QUORUM}, {ENTRY_BYTES} B entries",
        "",
        f"{'phase':<50}{'entries/s':>10}{'MB/s':>7}{'add p50':>10}{'add p99':>10}  cpu% "
        f"master/slave/client/others",
        f"{seq_name:<50}{s['adds_per_s']:>10,.0f}"
        f"{s['adds_per_s'] * ENTRY_BYTES / 1e6:>7.2f}{s['latency']['p50_ms']:>8.2f}ms"
        f"{s['latency']['p99_ms']:>8.2f}ms"
        f"  {_cpu(s['cpu_pct'])}",
    ]
    for p in r["pipelined"]:
        name = (
            f"pipelined, {p['in_flight']} in flight ({p['seconds']:.1f} s, "
            f"{p.get('entries_per_call', 1):.0f} per call)"
        )
        lat = p["add_latency"]
        lines.append(
            f"{name:<50}{p['entries_per_s']:>10,.0f}{p['mb_per_s']:>7.2f}{lat['p50_ms']:>8.2f}ms"
            f"{lat['p99_ms']:>8.2f}ms  {_cpu(p['cpu_pct'])}"
        )
    many = r.get("many_ledgers")
    if many:
        name = (
            f"{many['ledgers']} ledgers x {many['in_flight_each']} in flight "
            f"({many['add_calls'] / max(1, many['shared_frames'] + many['add_calls'] - many['calls_in_shared_frames']):.1f}"
            " calls per frame)"
        )
        lat = many["add_latency"]
        lines.append(
            f"{name:<50}{many['entries_per_s']:>10,.0f}{many['mb_per_s']:>7.2f}{lat['p50_ms']:>8.2f}ms"
            f"{lat['p99_ms']:>8.2f}ms  {_cpu(many['cpu_pct'])}"
        )
    rec, rd = r["recovery"], r["read"]
    lines += [
        "",
        f"recovery open: ledger of {rec['entries_written']:,} entries (filled at "
        f"{rec['fill_entries_per_s']:,.0f}/s, "
        f"{RECOVERY_WINDOW} in flight), writer gone without close ({rec['state_before']}): "
        f"open_ledger(recovery=True) "
        f"{rec['open_s'] * 1e3:,.0f} ms -> {rec['state_after']} at entry {rec['recovered_last_entry']} "
        f"(writer LAC {rec['writer_lac']}); cpu% {_cpu(rec['cpu_pct'])}",
        f"read_entries(0, {rd['entries'] - 1}) x{len(rd['passes_s'])}: {rd['entries_per_s']:,.0f} entries/s "
        f"median ({rd['mb_per_s']:.1f} MB/s), best {rd['best_entries_per_s']:,.0f}/s; passes "
        + ", ".join(f"{x:.2f}" for x in rd["passes_s"])
        + f" s; cpu% {_cpu(rd['cpu_pct'])}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ledger", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--quick", action="store_true", help="200 sequential adds, 1 s per window, a 2,000-entry ledger"
    )
    ap.add_argument("--seconds", type=float, default=None, help="seconds per pipelined window (default 4)")
    ap.add_argument(
        "--dir",
        default=None,
        help="parent directory for the cluster's data (default: the "
        "system "
        "temp dir unless it is tmpfs, else the current directory)",
    )
    args = ap.parse_args(argv)
    result = run(
        pick_base_dir(args.dir),
        sequential_adds=200 if args.quick else 500,
        window_seconds=args.seconds or (1.0 if args.quick else 4.0),
        recovery_entries=2_000 if args.quick else 10_000,
    )
    report(result, args.json, format_table)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
