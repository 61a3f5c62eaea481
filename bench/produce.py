"""End-to-end benchmark: replicated produce throughput, open-loop latency and consume from the slave.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas, all on
loopback, `replication: sync, in_sync_replicas: 2, auto_in_sync_replicas: true, flush: async`,
256 MiB segments), drives it over the broker's gRPC API with `grpc.aio` stubs, stops every
process it started and prints the figures. Run from the repository root:

    python -m bench.produce              # table
    python -m bench.produce --json       # machine-readable
    python -m bench.produce --quick      # shorter phases, for a smoke run

What it measures (messages carry a 1 KiB body, no key, round robin over the topic's 8 queues;
MB = 10^6 bytes of message body):

- produce throughput: batch sizes 1 and 1000 per Produce call, 1 and 16 concurrent producers.
  A producer is an asyncio task sending its next request when the previous one is acknowledged
  (closed loop); producers share up to 4 channels of one client process. The 16-producer cases
  are run again split over several client processes, to show whether one client process is the
  bottleneck. An acknowledged message is on both replicas as long as the slave stays in the
  SyncStateSet; each phase records whether the set changed while it ran (then the figure
  includes writes the master acknowledged alone, and the next phase waits for the slave);
- latency: single-message sends at a fixed 1,000 msgs/s for 10 s, open loop (each send is
  started on its own timer slot whether or not earlier ones were answered); p50/p99/p999 of each
  send's time from call to acknowledgement, and of the time from its slot, which adds the client's
  timer lateness. A second run at 250 msgs/s separates service time from queueing when 1,000
  msgs/s is more than the broker can take;
- consume: everything the run produced, pulled back from the slave (PullRequest max_messages
  1000, max_bytes 4 MiB), one task per queue over one channel, from the page cache.

During every phase a thread samples the master's Status every 0.1 s: how many bytes of log the
slave has not acknowledged yet (its lag: p50, p99 and max), beside whether it left the
SyncStateSet. For every phase it also records the CPU each process used, in percent of one core, and what the
rest of the machine used meanwhile ("others"): the client and the servers share the cores with
whatever else runs there. It checks three targets: at least 100,000 msgs/s replicated with
batches of 1000 (the best client layout counts), p99 at most 2 ms for single-message sends at
1,000 msgs/s, and at least 300,000 msgs/s consumed.

`--profile DIR` additionally samples the brokers with py-spy during the 16-producer produce
phases, the latency phase and (the slave) the consume phase, writes py-spy's collapsed stacks to
DIR (one file per phase and process) and prints each profile's top functions. Without --native,
time spent in C (gRPC's core, protobuf, system calls) is charged to the Python frame that called
it. Figures from such a run are perturbed by the sampler.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc

from bench.cluster import SYNC_REPLICATED, BenchCluster
from bench.commitlog import code_version, fs_type, pick_base_dir, report
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

BODY_BYTES = 1024
SEGMENT_BYTES = 256 << 20
TOPIC = "bench"
QUEUES = 8
BROKER_OPTIONS: dict[str, Any] = {**SYNC_REPLICATED, "segment_bytes": SEGMENT_BYTES}
THROUGHPUT_CASES = ((1, 1), (1, 16), (1000, 1), (1000, 16))  # (batch, producers), one client process
MULTI_PROCESS_PRODUCERS = 16  # the cases re-run split over several client processes
LATENCY_RATE = 1000  # msgs/s
# A second, lower rate tells service time from queueing when LATENCY_RATE overloads the broker.
LOW_LATENCY_RATE = 250
PULL_MAX_MESSAGES = 1000
PULL_MAX_BYTES = 4 << 20
LAG_SAMPLE_S = 0.1  # how often the slave's lag is sampled during a phase
MAX_CHANNELS = 4  # producers share this many channels (one TCP connection each)
TARGET_PRODUCE = 100_000  # msgs/s, batch 1000
TARGET_P99_MS = 2.0  # single-message sends at LATENCY_RATE
TARGET_CONSUME = 300_000  # msgs/s from the slave
# The broker allows 64 MiB messages; a 4 MiB pull reply plus framing exceeds gRPC's 4 MiB default.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # without this, channels with equal arguments share one subchannel (one connection)
    ("grpc.use_local_subchannel_pool", 1),
]


# ---------------------------------------------------------------------------------- helpers


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in 0..100); NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    s = sorted(seconds)
    return {
        "count": len(s),
        "p50_ms": percentile(s, 50) * 1e3,
        "p99_ms": percentile(s, 99) * 1e3,
        "p999_ms": percentile(s, 99.9) * 1e3,
        "max_ms": (s[-1] if s else float("nan")) * 1e3,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[11], fields[12] are utime and stime (the 14th and 15th of the whole line)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy so far (everything but idle and iowait), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used per named process between start() and stop(), in percent of one core.

    "others" is what the rest of the machine used meanwhile (the cores are shared with whatever
    else runs there): a phase with a large "others" figure was measured on a busy machine.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float] = {}
        self._t0 = 0.0
        self._busy0 = 0.0

    def add(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        self._start[name] = cpu_seconds(pid)

    def start(self) -> CpuMeter:
        self._t0 = time.perf_counter()
        self._busy0 = machine_busy_seconds()
        self._start = {n: cpu_seconds(p) for n, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._t0
        out = {n: 100 * (cpu_seconds(p) - self._start.get(n, 0.0)) / wall for n, p in self.pids.items()}
        out["others"] = max(0.0, 100 * (machine_busy_seconds() - self._busy0) / wall - sum(out.values()))
        return {n: round(v, 1) for n, v in out.items()}


BROKER_CODE = ("broker", "ha", "commitlog", "controller", "tidelog")


def machine_info(directory: str) -> dict[str, Any]:
    typ, dev = fs_type(directory)
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "grpc": grpc.__version__,
        "filesystem": typ,
        "device": dev,
    }


def _produce_request(batch: int) -> pb.ProduceRequest:
    body = os.urandom(BODY_BYTES)
    return pb.ProduceRequest(topic=TOPIC, messages=[pb.ProduceMessage(body=body) for _ in range(batch)])


def _channels(address: str, count: int) -> list[grpc.aio.Channel]:
    return [grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) for _ in range(count)]


def _error_text(exc: grpc.aio.AioRpcError) -> str:
    code = dict(exc.trailing_metadata() or ()).get("tidelog-error-code") or exc.code().name
    return f"{code}: {exc.details()}"


# ---------------------------------------------------------------------------------- produce


async def _closed_loop(
    address: str, batch: int, producers: int, duration: float, ready: Connection | None = None
) -> dict[str, Any]:
    """`producers` tasks each sending `batch`-message requests back to back for `duration` s.

    With `ready`, this runs in a worker process: it reports when warmed up and starts on "go".
    """
    channels = _channels(address, min(producers, MAX_CHANNELS))
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    request = _produce_request(batch)
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    acked = 0
    try:
        # Warm-up outside the timed window: connections, HTTP/2 windows, the server's first call.
        await asyncio.gather(*(stubs[i % len(stubs)].Produce(request, timeout=10) for i in range(producers)))
        if ready is not None:
            ready.send("ready")
            await asyncio.get_running_loop().run_in_executor(None, ready.recv)
        start = time.perf_counter()
        deadline = start + duration

        async def producer(stub: pb_grpc.BrokerStub) -> None:
            nonlocal acked
            while True:
                t = time.perf_counter()
                if t >= deadline:
                    return
                try:
                    await stub.Produce(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    errors[_error_text(exc)] += 1
                    await asyncio.sleep(0.01)
                    continue
                latencies.append(time.perf_counter() - t)
                acked += batch

        await asyncio.gather(*(producer(stubs[i % len(stubs)]) for i in range(producers)))
        elapsed = time.perf_counter() - start
    finally:
        for c in channels:
            await c.close()
    return {"messages": acked, "seconds": elapsed, "latencies": latencies, "errors": dict(errors)}


def _client_worker(address: str, batch: int, producers: int, duration: float, conn: Connection) -> None:
    """Entry point of a client worker process: one closed-loop run, figures sent back on `conn`."""
    try:
        conn.send(asyncio.run(_closed_loop(address, batch, producers, duration, ready=conn)))
    finally:
        conn.close()


def _summarise_produce(
    batch: int, producers: int, procs: int, runs: list[dict[str, Any]], cpu: dict[str, float]
) -> dict[str, Any]:
    messages = sum(r["messages"] for r in runs)
    seconds = max(r["seconds"] for r in runs)
    errors: collections.Counter[str] = collections.Counter()
    lat: list[float] = []
    for r in runs:
        errors.update(r["errors"])
        lat.extend(r["latencies"])
    return {
        "batch": batch,
        "producers": producers,
        "client_procs": procs,
        "messages": messages,
        "seconds": seconds,
        "msgs_per_s": messages / seconds,
        "mb_per_s": messages * BODY_BYTES / seconds / 1e6,
        "request_latency": latency_summary(lat),
        "errors": dict(errors),
        "cpu_pct": cpu,
    }


def bench_produce(
    cluster: BenchCluster,
    batch: int,
    producers: int,
    procs: int,
    duration: float,
    profiler: Profiler | None = None,
) -> dict[str, Any]:
    """Closed-loop produce with `producers` tasks spread over `procs` client processes."""
    if procs == 1:
        return _produce_in_process(cluster, batch, producers, duration, profiler)
    return _produce_in_workers(cluster, batch, producers, procs, duration)


def _produce_in_process(
    cluster: BenchCluster, batch: int, producers: int, duration: float, profiler: Profiler | None
) -> dict[str, Any]:
    """The closed loop in this process (profiled, with a profiler, at the multi-process producer count)."""
    meter = CpuMeter(cluster.pids)
    meter.add("client", os.getpid())
    meter.start()
    prof = (
        profiler.start(f"produce-b{batch}-p{producers}", _brokers(cluster), duration)
        if profiler and producers == MULTI_PROCESS_PRODUCERS
        else None
    )
    run = asyncio.run(_closed_loop(cluster.master_address, batch, producers, duration))
    cpu = meter.stop()
    if profiler is not None and prof is not None:
        profiler.finish(prof)
    return _summarise_produce(batch, producers, 1, [run], cpu)


def _produce_in_workers(
    cluster: BenchCluster, batch: int, producers: int, procs: int, duration: float
) -> dict[str, Any]:
    """The closed loop in `procs` client processes, started together once every one has warmed up."""
    meter = CpuMeter(cluster.pids)
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[Any, Connection]] = []
    try:
        share = [producers // procs + (1 if i < producers % procs else 0) for i in range(procs)]
        for n in share:
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_client_worker, args=(cluster.master_address, batch, n, duration, child), daemon=True
            )
            p.start()
            child.close()
            workers.append((p, parent))
        for _, conn in workers:
            if not conn.poll(60):
                raise RuntimeError("a client worker did not warm up within 60 s")
            conn.recv()
        for i, (p, _) in enumerate(workers):
            meter.add(f"client-{i}", p.pid)
        meter.start()
        for _, conn in workers:
            conn.send("go")
        runs = []
        for _, conn in workers:
            if not conn.poll(duration + 60):
                raise RuntimeError("a client worker did not finish")
            runs.append(conn.recv())
        cpu = meter.stop()
        return _summarise_produce(batch, producers, procs, runs, cpu)
    finally:
        _end_workers(workers)


def _end_workers(workers: list[tuple[Any, Connection]]) -> None:
    """Join every client worker; one still running after 5 s is killed by its pid."""
    for p, conn in workers:
        conn.close()
        p.join(5)
        if p.is_alive() and p.pid is not None:
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)


# ---------------------------------------------------------------------------------- latency


async def _open_loop(address: str, rate: int, duration: float) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = pb_grpc.BrokerStub(channel)
    request = _produce_request(1)
    service: list[float] = []
    from_slot: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    late = 0
    try:
        for _ in range(200):  # warm-up at no particular rate
            await stub.Produce(request, timeout=10)
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        async def send(slot: float) -> None:
            t = time.perf_counter()
            try:
                await stub.Produce(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                errors[_error_text(exc)] += 1
                return
            end = time.perf_counter()
            service.append(end - t)
            from_slot.append(end - slot)

        n = int(rate * duration)
        start = time.perf_counter() + 0.05
        for i in range(n):
            slot = start + i / rate
            delay = slot - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.001:
                late += 1  # the client loop fell more than 1 ms behind its schedule
            task = loop.create_task(send(slot))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=15)
        elapsed = time.perf_counter() - start
    finally:
        await channel.close()
    return {
        "rate": rate,
        "sent": n,
        "acked": len(service),
        "seconds": elapsed,
        "slots_late_1ms": late,
        "latency": latency_summary(service),
        "latency_from_slot": latency_summary(from_slot),
        "errors": dict(errors),
    }


def bench_latency(
    cluster: BenchCluster, rate: int, duration: float, profiler: Profiler | None = None
) -> dict[str, Any]:
    meter = CpuMeter(cluster.pids)
    meter.add("client", os.getpid())
    meter.start()
    prof = profiler.start(f"latency-{rate}", _brokers(cluster), duration) if profiler else None
    out = asyncio.run(_open_loop(cluster.master_address, rate, duration))
    out["cpu_pct"] = meter.stop()
    if profiler is not None and prof is not None:
        profiler.finish(prof)
    return out


# ---------------------------------------------------------------------------------- consume


def wait_replicated(cluster: BenchCluster, timeout: float = 60.0) -> list[int]:
    """Wait until the slave can serve every message the master holds; returns each queue's end."""
    ends = [cluster.queue_offsets(cluster.master_address, TOPIC, q).max for q in range(QUEUES)]
    deadline = time.monotonic() + timeout
    while True:
        confirmed = [cluster.queue_offsets(cluster.slave_address, TOPIC, q).confirmed for q in range(QUEUES)]
        if all(c >= e for c, e in zip(confirmed, ends, strict=True)):
            return ends
        if time.monotonic() > deadline:
            raise RuntimeError(f"the slave confirmed {confirmed}, the master holds {ends}")
        time.sleep(0.1)


async def _pull_all(address: str, ends: list[int]) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = pb_grpc.BrokerStub(channel)
    messages = 0
    body_bytes = 0
    pulls = 0

    async def consume(queue: int) -> None:
        nonlocal messages, body_bytes, pulls
        offset = 0
        while offset < ends[queue]:
            reply = await stub.Pull(
                pb.PullRequest(
                    topic=TOPIC,
                    queue=queue,
                    offset=offset,
                    max_messages=PULL_MAX_MESSAGES,
                    max_bytes=PULL_MAX_BYTES,
                ),
                timeout=30,
            )
            if not reply.messages:
                raise RuntimeError(f"queue {queue}: nothing at offset {offset}, expected up to {ends[queue]}")
            pulls += 1
            messages += len(reply.messages)
            body_bytes += sum(len(m.body) for m in reply.messages)
            offset = reply.next_offset

    try:
        await stub.Status(pb.StatusRequest(), timeout=10)  # connect outside the timed region
        start = time.perf_counter()
        await asyncio.gather(*(consume(q) for q in range(len(ends))))
        elapsed = time.perf_counter() - start
    finally:
        await channel.close()
    return {
        "messages": messages,
        "bytes": body_bytes,
        "pulls": pulls,
        "seconds": elapsed,
        "msgs_per_s": messages / elapsed,
        "mb_per_s": body_bytes / elapsed / 1e6,
        "msgs_per_pull": messages / max(1, pulls),
    }


def bench_consume(cluster: BenchCluster, profiler: Profiler | None = None) -> dict[str, Any]:
    ends = wait_replicated(cluster)
    meter = CpuMeter(cluster.pids)
    meter.add("client", os.getpid())
    meter.start()
    # Unknown length up front: sample the slave for a fixed while and let the pull run on.
    prof = profiler.start("consume", {"slave": cluster.pids["slave"]}, 5) if profiler else None
    out = asyncio.run(_pull_all(cluster.slave_address, ends))
    out["cpu_pct"] = meter.stop()
    if profiler is not None and prof is not None:
        profiler.finish(prof)
    expected = sum(ends)
    if out["messages"] != expected:
        raise RuntimeError(f"pulled {out['messages']} messages, the queues hold {expected}")
    return out


# ---------------------------------------------------------------------------------- profiling


def _brokers(cluster: BenchCluster) -> dict[str, int]:
    return {k: v for k, v in cluster.pids.items() if k != "controller"}


class Profiler:
    """py-spy runs against broker processes during phases (opt-in: it takes CPU from the bench)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        exe = Path(sys.executable).with_name("py-spy")
        self.exe = str(exe) if exe.exists() else shutil.which("py-spy")
        if self.exe is None:
            raise SystemExit("--profile needs py-spy (pip install py-spy)")
        self.summaries: dict[str, list[dict[str, Any]]] = {}

    def start(
        self, name: str, pids: dict[str, int], seconds: float
    ) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Sample each of `pids` (role -> pid) for `seconds`, in the background."""
        handles = []
        for role, pid in pids.items():
            raw = self.out_dir / f"{name}-{role}.txt"
            proc = subprocess.Popen(
                [
                    self.exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(max(1, int(seconds))),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "-o",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            handles.append((f"{name}-{role}", proc))
        return handles

    def finish(self, handles: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
        for name, proc in handles:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            raw = self.out_dir / f"{name}.txt"
            if raw.exists():
                self.summaries[name] = top_functions(raw.read_text())


def _frame_name(frame: str) -> str:
    """ "func (path/to/file.py:123)" -> "func (file.py)": functions are counted across their lines."""
    func, sep, where = frame.partition(" (")
    if not sep:
        return frame
    return f"{func} ({where.rsplit('/', 1)[-1].rsplit(':', 1)[0].rstrip(')')})"


def top_functions(collapsed: str, limit: int = 15) -> list[dict[str, Any]]:
    """Top functions of py-spy's collapsed stacks by self samples, with their inclusive share.

    Without --native, time inside C extensions (gRPC's Cython core, protobuf) and system calls
    counts as self time of the Python frame that called into them.
    """
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return (
        [
            {"function": f, "self_pct": 100 * n / total, "inclusive_pct": 100 * incl[f] / total}
            for f, n in own.most_common(limit)
        ]
        if total
        else []
    )


# ---------------------------------------------------------------------------------- report


class LagSampler:
    """How far the slave trails the master while a phase runs: every LAG_SAMPLE_S the master's
    Status gives its log end and each slave's acknowledged offset; the gap is in bytes of log.
    A thread of its own, so the phase's event loop is not charged with it."""

    def __init__(self, cluster: BenchCluster) -> None:
        self.cluster = cluster
        self.gaps: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(LAG_SAMPLE_S):
            s = self.cluster.status(self.cluster.master_index)
            if s is not None and s.role == "master" and s.replicas:
                self.gaps.append(max(s.max_offset - r.ack_offset for r in s.replicas))

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        gaps = sorted(self.gaps)
        if not gaps:
            return {"samples": 0, "p50_bytes": 0, "p99_bytes": 0, "max_bytes": 0}
        return {
            "samples": len(gaps),
            "p50_bytes": percentile(gaps, 50),
            "p99_bytes": percentile(gaps, 99),
            "max_bytes": gaps[-1],
        }


def _phase(cluster: BenchCluster, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run one phase, noting whether the slave left the SyncStateSet meanwhile (then wait for it).

    Sync replication only holds while the slave is a member: once the master drops it (it fell
    behind under load), writes are acknowledged by the master alone, and the figure no longer
    measures replicated writes only. The next phase starts when the slave is back.
    """
    before = cluster.sync_state_set_epoch()
    with LagSampler(cluster) as lag:
        out = fn(cluster, *args)
    out["slave_lag"] = lag.summary()
    members = cluster.in_sync_count()
    out["sync_state_set_changed"] = cluster.sync_state_set_epoch() != before or members < len(cluster.brokers)
    if members < len(cluster.brokers):
        cluster.wait_in_sync(60.0)
    return out


def run(
    base_dir: str,
    *,
    duration: float,
    latency_seconds: float,
    low_rate_seconds: float,
    client_procs: Sequence[int],
    profile_dir: Path | None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tidelog-bench-produce-", dir=base_dir))
    profiler = Profiler(profile_dir) if profile_dir is not None else None
    cluster = BenchCluster(work, broker_options=BROKER_OPTIONS)
    try:
        cluster.start()
        t0 = time.perf_counter()
        cluster.wait_ready(TOPIC, QUEUES)
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "code": code_version(BROKER_CODE),
            "machine": machine_info(str(work)),
            "config": {
                "body_bytes": BODY_BYTES,
                "queues": QUEUES,
                "broker": BROKER_OPTIONS,
                "duration_s": duration,
                "latency_s": latency_seconds,
                "latency_rate": LATENCY_RATE,
                "low_rate": LOW_LATENCY_RATE,
                "low_rate_s": low_rate_seconds,
                "pull_max_messages": PULL_MAX_MESSAGES,
                "pull_max_bytes": PULL_MAX_BYTES,
                "max_channels": MAX_CHANNELS,
            },
            "startup_s": time.perf_counter() - t0,
        }
        produce = []
        for batch, producers in THROUGHPUT_CASES:
            produce.append(_phase(cluster, bench_produce, batch, producers, 1, duration, profiler))
            if producers == MULTI_PROCESS_PRODUCERS:
                for procs in client_procs:
                    produce.append(_phase(cluster, bench_produce, batch, producers, procs, duration))
        result["produce"] = produce
        result["latency"] = _phase(cluster, bench_latency, LATENCY_RATE, latency_seconds, profiler)
        if low_rate_seconds > 0:
            result["latency_low_rate"] = _phase(cluster, bench_latency, LOW_LATENCY_RATE, low_rate_seconds)
        result["consume"] = bench_consume(cluster, profiler)
        if profiler is not None:
            result["profiles"] = profiler.summaries
        best = max((p for p in produce if p["batch"] == 1000), key=lambda p: p["msgs_per_s"])
        p99 = result["latency"]["latency"]["p99_ms"]
        consumed = result["consume"]["msgs_per_s"]
        result["targets"] = {
            "produce_batch_1000": {
                "value": best["msgs_per_s"],
                "target": TARGET_PRODUCE,
                "layout": f"{best['producers']} producers, {best['client_procs']} client procs",
                "pass": best["msgs_per_s"] >= TARGET_PRODUCE,
            },
            "latency_p99_ms": {"value": p99, "target": TARGET_P99_MS, "pass": p99 <= TARGET_P99_MS},
            "consume": {"value": consumed, "target": TARGET_CONSUME, "pass": consumed >= TARGET_CONSUME},
        }
        return result
    except Exception:
        sys.stderr.write(cluster.logs() + "\n")
        raise
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def _cpu_text(cpu: dict[str, float], roles: Sequence[str]) -> str:
    clients = "+".join(f"{v:.0f}" for k, v in cpu.items() if k.startswith("client")) or "-"
    values = [clients if role == "client" else f"{cpu.get(role, 0):.0f}" for role in roles]
    return "/".join(values)


def _shrunk(phase: dict[str, Any]) -> str:
    changed = phase.get("sync_state_set_changed")
    return "  [SyncStateSet changed: some writes not replicated]" if changed else ""


def _errors_text(errors: dict[str, int]) -> str:
    """ "N errors, mostly CODE": the detail of every error is in the JSON output."""
    top = max(errors, key=lambda e: errors[e])
    return f"{sum(errors.values())} errors, mostly {top.split(':', 1)[0]}"


def _latency_lines(lat: dict[str, Any]) -> list[str]:
    s, f = lat["latency"], lat["latency_from_slot"]
    return [
        f"latency, single-message sends at {lat['rate']:,} msgs/s open loop for {lat['seconds']:.1f} s "
        f"({lat['acked']:,} of {lat['sent']:,} acked, {lat['slots_late_1ms']} slots started >1 ms late"
        + (f", {_errors_text(lat['errors'])}" if lat["errors"] else "")
        + ")"
        + _shrunk(lat),
        f"  send -> ack   p50 {s['p50_ms']:8.3f} ms   p99 {s['p99_ms']:8.3f} ms   p999 {s['p999_ms']:8.3f} "
        f"ms   "
        f"max {s['max_ms']:8.3f} ms",
        f"  slot -> ack   p50 {f['p50_ms']:8.3f} ms   p99 {f['p99_ms']:8.3f} ms   p999 {f['p999_ms']:8.3f} "
        f"ms   "
        f"max {f['max_ms']:8.3f} ms",
        f"  cpu% master/slave/client/others "
        f"{_cpu_text(lat['cpu_pct'], ('master', 'slave', 'client', 'others'))}",
    ]


def format_table(r: dict[str, Any]) -> str:
    m = r["machine"]
    cfg = r["config"]
    lines = [
        f"tidelog produce/consume bench, {r['date']}, code {r['code']}",
        f"machine: {m['cores']} cores shared by the client and all servers, Python {m['python']}, "
        f"grpcio {m['grpc']}, {m['filesystem']} on {m['device']}",
        f"cluster: 1 controller + master + slave on loopback, replication sync (2 in sync), flush async, "
        f"segments {SEGMENT_BYTES >> 20} MiB; {BODY_BYTES} B bodies over {cfg['queues']} queues, MB = 10^6 "
        f"body bytes",
        "",
        f"{'produce (closed loop)':<34}{'msgs/s':>10}{'MB/s':>8}{'req p50':>9}{'req p99':>9}"
        f"  cpu% master/slave/client(s)/others",
    ]
    for p in r["produce"]:
        name = f"batch {p['batch']}, {p['producers']} producer{'s' if p['producers'] > 1 else ''}"
        if p["client_procs"] > 1:
            name += f", {p['client_procs']} procs"
        lat = p["request_latency"]
        lines.append(
            f"{name:<34}{p['msgs_per_s']:>10,.0f}{p['mb_per_s']:>8.1f}{lat['p50_ms']:>7.1f}ms"
            f"{lat['p99_ms']:>7.1f}ms  "
            f"{_cpu_text(p['cpu_pct'], ('master', 'slave', 'client', 'others'))}"
            + (f"  {_errors_text(p['errors'])}" if p["errors"] else "")
            + _shrunk(p)
        )
        if p["slave_lag"]["samples"]:
            g = p["slave_lag"]
            lines.append(
                f"{'':<34}slave lag p50 {g['p50_bytes'] / 1024:,.0f} KiB, p99 {g['p99_bytes'] / 1024:,.0f} KiB, "
                f"max {g['max_bytes'] / 1024:,.0f} KiB ({g['samples']} samples)"
            )
    for key in ("latency", "latency_low_rate"):
        if key in r:
            lines += ["", *_latency_lines(r[key])]
    c = r["consume"]
    cpu = c["cpu_pct"]
    lines += [
        "",
        f"consume from the slave: {c['messages']:,} msgs in {c['seconds']:.2f} s -> {c['msgs_per_s']:,.0f} "
        f"msgs/s, "
        f"{c['mb_per_s']:.1f} MB/s ({c['msgs_per_pull']:.0f} msgs/pull; cpu% slave/client/others "
        f"{_cpu_text(cpu, ('slave', 'client', 'others'))})",
    ]
    t = r["targets"]
    pt, lt, ct = t["produce_batch_1000"], t["latency_p99_ms"], t["consume"]
    lines += [
        "",
        f"target produce batch 1000 >= {pt['target']:,} msgs/s: {pt['value']:,.0f} ({pt['layout']}) "
        f"-> {'PASS' if pt['pass'] else 'FAIL'}",
        f"target p99 at {LATENCY_RATE:,} msgs/s <= {lt['target']} ms: {lt['value']:.3f} ms "
        f"-> {'PASS' if lt['pass'] else 'FAIL'}",
        f"target consume >= {ct['target']:,} msgs/s: {ct['value']:,.0f} "
        f"-> {'PASS' if ct['pass'] else 'FAIL'}",
    ]
    for name, top in r.get("profiles", {}).items():
        lines += ["", f"profile {name} (py-spy, share of samples): self% incl% function"]
        lines += [f"  {e['self_pct']:5.1f} {e['inclusive_pct']:5.1f}  {e['function']}" for e in top]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.produce", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--quick", action="store_true", help="short phases (1.5 s, latency 3 s), one multi-process run"
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds per produce measurement (default 5)"
    )
    ap.add_argument(
        "--latency-seconds", type=float, default=None, help="length of the latency run (default 10)"
    )
    ap.add_argument(
        "--low-rate-seconds",
        type=float,
        default=None,
        help=f"length of the extra latency run at {LOW_LATENCY_RATE} msgs/s (default 5, 0 = skip)",
    )
    ap.add_argument(
        "--client-procs",
        default=None,
        help="comma-separated client process counts for the 16-producer re-runs (default 2,4)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run py-spy on the brokers during some phases and write the profiles to DIR",
    )
    ap.add_argument(
        "--dir",
        default=None,
        help="parent directory for the cluster's data (default: the "
        "system "
        "temp dir unless it is tmpfs, else the current directory)",
    )
    args = ap.parse_args(argv)
    duration = args.duration or (1.5 if args.quick else 5.0)
    latency_seconds = args.latency_seconds or (3.0 if args.quick else 10.0)
    low_rate_seconds = (
        args.low_rate_seconds if args.low_rate_seconds is not None else (0.0 if args.quick else 5.0)
    )
    procs_arg = args.client_procs or ("2" if args.quick else "2,4")
    client_procs = [int(x) for x in procs_arg.split(",") if x.strip() and int(x) > 1]
    result = run(
        pick_base_dir(args.dir),
        duration=duration,
        latency_seconds=latency_seconds,
        low_rate_seconds=low_rate_seconds,
        client_procs=client_procs,
        profile_dir=args.profile,
    )
    if args.json:
        for p in result["produce"]:
            p.pop("latencies", None)
    report(result, args.json, format_table)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
