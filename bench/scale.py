"""How tidelog's costs grow with what it holds: topics and queues, and log size.

Starts its own cluster (bench.cluster: one controller, a broker set of two replicas on loopback)
and grows one dimension in steps, printing per step the costs that should stay flat or grow
slowly, as a table and (with --json) one JSON object per dimension. Run from the repository root:

    python -m bench.scale                                   # topics 1,000 / 5,000 / 20,000; log 256 MB, 1 GB
    python -m bench.scale --topics 2000,20000,100000 --log-gb 1,5,10 --json
    python -m bench.scale --only topics                     # one dimension
    python -m bench.scale --only queues --active-queues 8,1000,10000
    python -m bench.scale --only restart --log-gb 1,5,10    # kill -9 and restart, per log size

Topics (each of `--queues` queues, 8 by default, created through the batched admin call,
`AsyncAdmin.create_topics`: 1,000 a call, two calls in flight):
- create rate (topics/s) for the step's new topics;
- settle (s): from the brokers serving the newest topic until the controller and the master each
  use under 10% of a core over a second; the timings below are taken after it;
- route lookup p50/p99 (ms): 1,000 lookups of random topics, each a fresh route from the
  controllers, one at a time, after 50 untimed ones (the client's channel and first calls);
- idle CPU (% of one core) of the controller and of the master over 5 s with no requests: what
  heartbeats and the leader's loop cost with this many topics;
- RSS (MB) of the controller and the master;
- the controller's snapshot and journal size on disk (MB), and its restart-to-serving time (s):
  SIGTERM, start again, until a route lookup answers;
- `tide topic list` (its first page, 1,000 topics) and `tide cluster status` (s), run as a user
  would, output discarded.

Active queues (each step a fresh cluster; N queues as topics of at most 1,000 queues, the most one
broker set takes per topic): `--producers` closed-loop producers send requests of 1,000 keyless
messages of `--body` bytes for `--seconds`, each request to the next topic in turn, which the
master spreads round-robin over that topic's queues, so every request touches 1,000 queues (or
all of them when fewer) and every checkpoint writes every queue:
- produce throughput (msgs/s) and its ratio to the first step's (the issue's target: 10,000
  queues at least 70% of 8);
- consume-queue files and the master's open file descriptors, all of them and those on
  consume-queue files, at the end of the step (the bound is `cq_max_open_files`, default 16,384,
  lowered to fit the open-file limit; `--cq-max-open-files` sets it).

Store (`--only store`, the `--active-queues` steps): the commit log alone, in a process of its
own, appending batches of 1,000 records of `--body` bytes spread round-robin over N queues for
`--seconds`, its flusher's checkpoints running as a broker's do: what the storage costs per
queue, apart from RPC and replication.

Consumer groups (the storage of group offsets, in this process, no cluster: each of N groups
commits its 8 queues of one topic `--commit-rounds` times, as `%OFFSETS%` records appended in
batches of 1,000; broker/offsets.py):
- append rate of commit records (commits/s; the log alone, not the RPC and replication in front
  of it) and log bytes per commit;
- the restart fold: a fresh `GroupOffsets` folding the log to the latest value per (group,
  topic, queue), as a broker does on its first fetch after a start (s): from the fold's
  checkpoint, taken before the last round of commits (what a broker writes every
  `offsets_checkpoint_interval_ms`), so only that round is read from the log; and, for
  comparison, the full fold of every commit the log holds; the checkpoint's write time and size;
- retention's carry-forward: `MetadataFold.refresh` and `carry_plan` when every commit lies in a
  segment about to go (s, first and second round), and the records and bytes it copies.

Group commits (`--only group-commits`, one cluster): 10,000 groups committing offsets of one
topic's 8 queues, paced at each `--commit-rates` step for `--seconds`:
- with `--commit-clients 1,4,16`, one row per count: the commits made as group members make them
  (`commit_on_master`) through that many AsyncClients, whose commit pace gathers each one's
  groups (client/commitpace.py), as COMMITS frames on the master's data port; the calls a second
  they sent and the commits per call;
- without it, raw calls for comparison: one `CommitOffset` per commit, or with `--commit-batch N`
  N groups' commits per `CommitOffsets` call;
- commits/s done, the CPU of the master and of the slave meanwhile (% of one core), the master's
  idle CPU just before, and the commit path's share: the master's CPU above idle (the issue's
  target: 10,000 groups committing every second within 10% of a broker's CPU).

Controller snapshot (in this process, no cluster: a `ControllerState` holding `--snap-topics`
topics of 8 queues and `--ledgers` closed ledgers (their metadata, as `tide` clients create them),
put through what a controller node does with it at a log compaction, controller/snapshotfile.py):
- the capture the Raft thread takes (s), the file written from it as the writing thread does,
  without its rests (s), and the file's size (MB);
- restore: the file read back into a `ControllerState` (s), what a restart or a follower
  receiving the snapshot pays;
- the Python heap the state takes (MB, tracemalloc).

Ledgers (a cluster; `--ledger-workers` tasks each create a ledger (E = WQ = AQ = 2), add one
entry of 100 bytes and close it, for `--ledger-seconds`):
- create-and-close rate (ledgers/s) and how many there are;
- the controller's RSS, its data on disk (journal and snapshot, MB) and its restart to serving (s);
- opening one ledger for recovery: a ledger of 100 entries whose writer went away without
  closing it, opened by another client with `recovery=True` (fence, read past the LAC, close);
  `--recovery-opens` such ledgers, one after another, each by a fresh client: the median and
  the slowest (ms).
The in-process snapshot dimension above gives the snapshot's cost for more ledgers than fit in a
run's time. `--ledgers-held N` starts the controller from a snapshot that already holds N closed
ledgers (written into its data dir before it starts, as a restart would find it), so that the
restart and the recovery opens above are timed beside a million ledgers.
`--opens-during-compaction S`: then, for S seconds, recovery opens one after another while 4
creators bring the controller's log to a compaction; from the controller's log, the snapshots
written meanwhile (the capture's ms in the Raft thread, the write's s beside it), and the opens
whose time overlapped a write (how many, median and slowest ms), beside the slowest of all.

Fences (a replica's ledger fences, in this process, no cluster: `LedgerIndex` over a log whose
fence files already hold `--fences` fences, as a replica that recovered that many ledgers still
being kept):
- one more fence (ms, median and slowest of 9): what a recovery open waits for on each replica.

Log size (one replica's log grown to each size with 1 MiB batches of 1 KiB records, then the
master killed with SIGKILL and started again):
- restart to serving (s): from the start of the process until it answers a read at the log's
  end as a slave or master (the crash recovery scans only from the last checkpoint);
- the bytes recovery scanned, from the broker's log line.

Restart (`--only restart`, `--log-gb` steps; a broker set of one replica, `flush: async`): the
log grown through produce requests of 1,000 messages of 1 KiB to each size, the broker killed
with SIGKILL and started again: the seconds until it answers as master with its log at the same
end and reads queue 0's last message (process start, recovery from the last checkpoint,
registration and election included).

Slave catch-up (`--only catchup`, `--catchup-gb` steps; a broker set of two, `replication: sync`
with `auto_in_sync_replicas`): the slave killed with SIGKILL while the master takes that much new
log, then started again: the seconds until its log reaches the master's end (and the rate), and
until it is back in the SyncStateSet.

Retention (`--only retention`; a broker set of two with `retention_bytes` = `--retention-mb`,
segments of `--segment-mb`, checked every second): written at full speed for
`--retention-seconds`, each replica's log on disk sampled every second: the largest and the last
size against the limit, and the write rate retention has to keep up with.

Every process it started is stopped by its pid at the end, and nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from bench.cluster import SYNC_REPLICATED, BenchCluster
from tidelog import gcpolicy, private
from tidelog.client.aio import AsyncClient
from tidelog.client.commitpace import DEFAULT_COMMIT_INTERVAL_MS
from tidelog.client.consumer import commit_on_master
from tidelog.errors import TidelogError
from tidelog.invariants import require
from tidelog.localcluster import wait_until
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def idle_cpu_percent(pids: dict[str, int], seconds: float = 5.0) -> dict[str, float]:
    before = {k: cpu_s(p) for k, p in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)  # a measuring window, not an ordering wait
    elapsed = time.monotonic() - started
    return {k: round(100 * (cpu_s(p) - before[k]) / elapsed, 1) for k, p in pids.items()}


def wait_quiet(
    pids: dict[str, int], below_pct: float = 10.0, window: float = 1.0, timeout: float = 60.0
) -> float:
    """Seconds until every process of `pids` used less than `below_pct` of a core over one
    `window` (at most `timeout`): a step's timings are of the cluster at rest, not of the
    brokers still taking in what the step just created."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if all(pct < below_pct for pct in idle_cpu_percent(pids, window).values()):
            break
    return round(time.monotonic() - started, 1)


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_cli(args: list[str], controllers: str) -> float:
    env = dict(os.environ, TIDE_CONTROLLERS=controllers)
    started = time.monotonic()
    subprocess.run(
        [str(Path(sys.executable).with_name("tide")), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=600,
    )
    return round(time.monotonic() - started, 2)


async def create_topics(controllers: str, names: list[str], queues: int, broker_set: str) -> float:
    """Create `names` through the batched admin call (1,000 topics a call, two calls in flight);
    returns topics per second."""
    async with AsyncClient(controllers) as client:
        admin = client.admin()
        chunks = iter([names[i : i + 1000] for i in range(0, len(names), 1000)])

        async def worker() -> None:
            for chunk in chunks:
                outcome = await admin.create_topics(chunk, queues=queues, broker_sets=[broker_set])
                failed = {n: e for n, e in outcome.items() if e is not None}
                if failed:
                    raise RuntimeError(f"{len(failed)} topics not created, e.g. {next(iter(failed.items()))}")

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(2)))
        return len(names) / (time.monotonic() - started)


async def route_lookups(
    controllers: str, names: list[str], count: int = 1000, warm_up: int = 50
) -> list[float]:
    """Milliseconds of `count` lookups of random topics among `names`, after `warm_up` untimed.

    The p99 of 300 lookups from a new client was the 4th slowest, and the slowest were the first
    few calls of the client (its channel, the first run of its code): over three rounds at
    100,000 topics it read 4.4, 6.5 and 2.1 ms, where 1,000 warmed lookups read 3.6, 4.6, 4.3."""
    # the bench's own 100,000 names and the creation's leftovers out of its collector's reach: a
    # full collection of this process is not the controller's lookup time
    gcpolicy.after_start("bench")
    picked = random.Random(7).sample(names, min(count + warm_up, len(names)))
    async with AsyncClient(controllers) as client:
        for name in picked[:warm_up]:
            await client.route(name, refresh=True)
        out = []
        for name in picked[warm_up:]:
            started = time.perf_counter()
            await client.route(name, refresh=True)
            out.append((time.perf_counter() - started) * 1000)
        return out


def restart_controller(cluster: BenchCluster, probe_topic: str) -> float:
    proc = cluster.controller
    proc.stop()
    started = time.monotonic()
    proc.start()

    async def answers() -> bool:
        try:
            async with AsyncClient(cluster.controller_address, send_timeout=2.0) as client:
                await client.route(probe_topic, refresh=True)
            return True
        except Exception:
            return False

    wait_until(lambda: asyncio.run(answers()), 120, 0.05, what="the controller to serve routes again")
    return round(time.monotonic() - started, 2)


def topics_dimension(steps: list[int], queues: int, root: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with BenchCluster(root / "topics", broker_options=dict(SYNC_REPLICATED)) as cluster:
        cluster.wait_ready("scale-probe", queues=1)
        names: list[str] = []
        for step in steps:
            new = [f"scale-{i:07d}" for i in range(len(names), step)]
            rate = asyncio.run(create_topics(cluster.controller_address, new, queues, cluster.broker_set))
            names.extend(new)
            # until the brokers serve the newest topic: heartbeats carried it
            cluster.wait_topic(names[-1], 120)
            pids = cluster.pids
            settle_s = wait_quiet({"controller": pids["controller"], "master": pids["master"]})
            lookups = asyncio.run(route_lookups(cluster.controller_address, names))
            idle = idle_cpu_percent({"controller": pids["controller"], "master": pids["master"]})
            row = {
                "topics": step,
                "queues": step * queues,
                "create_per_s": round(rate),
                "settle_s": settle_s,
                "route_p50_ms": round(statistics.median(lookups), 2),
                "route_p99_ms": round(percentile(lookups, 0.99), 2),
                "idle_cpu_controller_pct": idle["controller"],
                "idle_cpu_master_pct": idle["master"],
                "rss_controller_mb": round(rss_mb(pids["controller"]), 1),
                "rss_master_mb": round(rss_mb(pids["master"]), 1),
                "controller_disk_mb": round(dir_mb(root / "topics" / "controller"), 1),
                "topic_list_s": timed_cli(["topic", "list"], cluster.controller_address),
                "cluster_status_s": timed_cli(["cluster", "status"], cluster.controller_address),
                "controller_restart_s": restart_controller(cluster, names[0]),
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def open_fds(pid: int, under: str = "") -> int:
    """Descriptors process `pid` holds open (on files under `under`, when given)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(under)
    return count


def cq_file_count(cq_dir: Path) -> int:
    return sum(1 for f in cq_dir.rglob("*") if f.is_file())


def every_queue_filed(cq_dir: Path, queues: int) -> None:
    """Until `queues` consume-queue files exist under `cq_dir` (a checkpoint made them)."""
    wait_until(lambda: cq_file_count(cq_dir) >= queues, 120, 0.2, what="every queue's first file")


async def produce_spread(
    address: str,
    topics: list[str],
    batch: int,
    body: int,
    producers: int,
    seconds: float,
    settled: Callable[[], object] | None = None,
) -> tuple[int, float, int]:
    """`producers` closed-loop tasks, each request `batch` keyless messages to the next topic in
    turn; returns (messages acknowledged, seconds, failed requests). After the warm-up (a request
    to each topic) and before the timed part, `settled()` (in a thread): the bench waits there
    until every queue's first consume-queue file exists, a one-time cost per queue that otherwise
    fell inside the timed part at a varying share."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(producers, 4))]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    payload = os.urandom(body)
    requests = [
        pb.ProduceRequest(topic=t, messages=[pb.ProduceMessage(body=payload)] * batch) for t in topics
    ]
    acked = failed = 0
    turn = 0
    try:
        # Warm-up, untimed: the first write to a queue creates its directory and files, which on
        # 10,000 new queues takes longer than a replica's ack timeout
        for r in requests:
            for attempt in range(20):
                try:
                    await stubs[0].Produce(r, timeout=30)
                    break
                except grpc.aio.AioRpcError:
                    if attempt == 19:
                        raise
        if settled is not None:
            await asyncio.to_thread(settled)
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def producer(stub: pb_grpc.BrokerStub) -> None:
            nonlocal acked, failed, turn
            while time.monotonic() < deadline:
                turn += 1
                try:
                    await stub.Produce(requests[turn % len(requests)], timeout=30)
                    acked += batch
                except grpc.aio.AioRpcError:
                    failed += 1

        await asyncio.gather(*(producer(stubs[i % len(stubs)]) for i in range(producers)))
        return acked, time.monotonic() - started, failed
    finally:
        for c in channels:
            await c.close()


def queues_dimension(
    steps: list[int], root: Path, *, seconds: float, body: int, producers: int, max_open: int | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    options = dict(SYNC_REPLICATED)
    if max_open is not None:
        options["cq_max_open_files"] = max_open
    for n in steps:
        per_topic = min(n, 1000)
        sizes = [per_topic] * (n // per_topic) + ([n % per_topic] if n % per_topic else [])
        topics = [f"active-{i:03d}" for i in range(len(sizes))]
        with BenchCluster(root / f"queues-{n}", broker_options=options) as cluster:
            cluster.wait_ready(topics[0], queues=sizes[0], timeout=60)
            for t, q in zip(topics[1:], sizes[1:], strict=True):
                cluster.create_topic(t, q)
            for t in topics:
                cluster.wait_topic(t, 60)
            cq_dir = cluster.data_dirs[cluster.master_index] / "consumequeue"
            acked, took, failed = asyncio.run(
                produce_spread(
                    cluster.master_address,
                    topics,
                    1000,
                    body,
                    producers,
                    seconds,
                    settled=functools.partial(every_queue_filed, cq_dir, n),
                )
            )
            pid = cluster.pids["master"]
            row = {
                "queues": n,
                "msgs_per_s": round(acked / took),
                "failed_requests": failed,
                "cq_files": cq_file_count(cq_dir),
                "master_fds": open_fds(pid),
                "master_cq_fds": open_fds(pid, str(cq_dir.resolve()) + os.sep),
                "rss_master_mb": round(rss_mb(pid), 1),
            }
        if rows:
            row["vs_first"] = round(row["msgs_per_s"] / rows[0]["msgs_per_s"], 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


_STORE = """
import sys, time
from tidelog.commitlog import CommitLog, Message
directory, queues, seconds, body = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
log = CommitLog.open(directory, flush="async")
per_topic = min(queues, 1000)
payload = b"x" * body
batches = [
    [Message(f"store-{t}", i % per_topic, payload) for i in range(1000)]
    for t in range(max(1, queues // per_topic))
]
for b in batches:  # every queue made before the timed part
    log.append(b)
started, count, k = time.monotonic(), 0, 0
while time.monotonic() - started < seconds:
    log.append(batches[k % len(batches)])
    k += 1
    count += 1000
print(round(count / (time.monotonic() - started)))
log.close()
"""


def store_dimension(steps: list[int], root: Path, *, seconds: float, body: int) -> list[dict[str, Any]]:
    """The commit log alone (a process of its own, no RPC, no replication): batches of 1,000
    records spread round-robin over N queues, appended for `seconds` with the flusher's
    checkpoints running as a broker's do."""
    rows: list[dict[str, Any]] = []
    for n in steps:
        directory = root / f"store-{n}"
        out = subprocess.run(
            [sys.executable, "-c", _STORE, str(directory), str(n), str(seconds), str(body)],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        shutil.rmtree(directory, ignore_errors=True)
        row: dict[str, Any] = {"queues": n, "msgs_per_s": int(out.stdout.split()[-1])}
        if rows:
            row["vs_first"] = round(row["msgs_per_s"] / rows[0]["msgs_per_s"], 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


async def commit_paced(
    address: str,
    topic: str,
    groups: int,
    queues: int,
    rate: float,
    seconds: float,
    batch: int = 1,
    tasks: int = 64,
) -> tuple[int, int, float]:
    """Group commits paced at `rate` a second for `seconds`: commit i is group i mod `groups`'s,
    of queue i mod `queues`, due at i / rate. `batch` 1: one `CommitOffset` call each, as a
    consumer sends them; more: `batch` commits of as many groups in one `CommitOffsets` call.
    Returns (committed, failed, seconds)."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    calls = int(rate * seconds) // batch
    turn = iter(range(calls))
    done = failed = 0
    started = time.monotonic()

    def commit(i: int) -> pb.CommitOffsetRequest:
        return pb.CommitOffsetRequest(
            group=f"group-{i % groups:06d}", topic=topic, queue=i % queues, offset=i // groups % 100
        )

    async def committer(stub: pb_grpc.BrokerStub) -> None:
        nonlocal done, failed
        for call in turn:
            due = started + call * batch / rate
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            first = call * batch
            try:
                if batch == 1:
                    await stub.CommitOffset(commit(first), timeout=10)
                else:
                    commits = [commit(i) for i in range(first, first + batch)]
                    await stub.CommitOffsets(pb.CommitOffsetsRequest(commits=commits), timeout=10)
                done += batch
            except grpc.aio.AioRpcError:
                failed += batch

    try:
        await asyncio.gather(*(committer(stubs[k % len(stubs)]) for k in range(tasks)))
    finally:
        for c in channels:
            await c.close()
    return done, failed, time.monotonic() - started


async def commit_through_clients(
    address: str,
    topic: str,
    groups: int,
    queues: int,
    rate: float,
    seconds: float,
    clients: int,
    interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
) -> tuple[int, int, float, int]:
    """Group commits as members make them: commit i is group i mod `groups`'s, of queue i mod
    `queues`, due at i / rate, made through `commit_on_master` (what every member's commit goes
    through) of one of `clients` AsyncClients, group g always the same one's. Each client's pace
    (client/commitpace.py) gathers its groups' commits. Returns (committed, failed, seconds,
    commit calls the clients sent)."""
    pool = [AsyncClient(address, commit_interval_ms=interval_ms) for _ in range(clients)]
    total = int(rate * seconds)
    done = failed = 0

    async def one(i: int) -> None:
        nonlocal done, failed
        group = i % groups
        try:
            await commit_on_master(
                pool[group % clients],
                address,
                f"group-{group:06d}",
                topic,
                [(("", i % queues), i // groups % 100)],
            )
            done += 1
        except TidelogError:
            failed += 1

    tasks: list[asyncio.Task[None]] = []
    started = time.monotonic()
    i = 0
    while i < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        tasks.extend(asyncio.ensure_future(one(k)) for k in range(i, due))
        i = due
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    calls = sum(c.commits.calls for c in pool)
    for c in pool:
        await c.close()
    return done, failed, elapsed, calls


def group_commits_dimension(
    steps: list[int], seconds: float, batch: int, clients: list[int], interval_ms: int, root: Path
) -> list[dict[str, Any]]:
    """Per step of `steps` (commits a second): raw calls of `batch` commits when `clients` is
    empty, else one row per count of clients the groups commit through (`commit_through_clients`)."""
    rows: list[dict[str, Any]] = []
    with BenchCluster(root / "group-commits", broker_options=dict(SYNC_REPLICATED)) as cluster:
        topic = "commits"
        cluster.wait_ready(topic, queues=8)
        # offsets up to 100 are valid commits: each queue holds at least 100 messages
        asyncio.run(produce_spread(cluster.master_address, [topic], 1000, 16, producers=1, seconds=0.5))
        pids = cluster.pids
        for rate in steps:
            for n in clients or [0]:
                idle = idle_cpu_percent({"master": pids["master"], "slave": pids["slave"]}, 3.0)
                before = {k: cpu_s(pids[k]) for k in ("master", "slave")}
                if n:
                    done, failed, elapsed, calls = asyncio.run(
                        commit_through_clients(
                            cluster.master_address, topic, 10_000, 8, rate, seconds, n, interval_ms
                        )
                    )
                else:
                    done, failed, elapsed = asyncio.run(
                        commit_paced(cluster.master_address, topic, 10_000, 8, rate, seconds, batch)
                    )
                    calls = done // batch
                used = {k: 100 * (cpu_s(pids[k]) - before[k]) / elapsed for k in before}
                row = {
                    "groups": 10_000,
                    "asked_commits_per_s": rate,
                    "through_clients": n or "-",
                    "commit_interval_ms": interval_ms if n else "-",
                    "calls_per_s": round(calls / elapsed, 1),
                    "commits_per_call": round(done / max(calls, 1), 1),
                    "commits_per_s": round(done / elapsed),
                    "failed": failed,
                    "master_cpu_pct": round(used["master"], 1),
                    "master_idle_cpu_pct": idle["master"],
                    "commit_path_cpu_pct": round(used["master"] - idle["master"], 1),
                    # the bench's own process may fall a little behind the asked rate
                    "commit_path_cpu_pct_at_asked_rate": round(
                        (used["master"] - idle["master"]) * rate / max(done / elapsed, 1), 1
                    ),
                    "slave_cpu_pct": round(used["slave"], 1),
                }
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def groups_dimension(steps: list[int], rounds: int, root: Path) -> list[dict[str, Any]]:
    from tidelog.broker.compaction import MetadataFold, carry_plan, copy_message
    from tidelog.broker.offsets import CHECKPOINT_FILE, GroupOffsets, commit_message
    from tidelog.commitlog import CommitLog

    rows: list[dict[str, Any]] = []
    for n in steps:
        directory = root / f"groups-{n}"
        log = CommitLog.open(directory, flush="async")
        try:
            append_s = 0.0
            commits = 0
            checkpoint_s = checkpoint_mb = 0.0
            for r in range(rounds):
                if r == rounds - 1 and r > 0:
                    # the broker's periodic checkpoint, before the last round of commits
                    log.confirm_offset = log.max_offset
                    running = GroupOffsets(log)
                    running.committed()  # the running broker's fold, up to date
                    started = time.monotonic()
                    require(running.save_checkpoint(), "the fold was checkpointed")
                    checkpoint_s = time.monotonic() - started
                    checkpoint_mb = os.path.getsize(os.path.join(log.directory, CHECKPOINT_FILE)) / 1e6
                started = time.monotonic()
                batch = [
                    commit_message(f"group-{g:06d}", "orders", q, 100 * r + q)
                    for g in range(n)
                    for q in range(8)
                ]
                for i in range(0, len(batch), 1000):
                    log.append(batch[i : i + 1000])
                commits += len(batch)
                append_s += time.monotonic() - started
            log.confirm_offset = log.max_offset
            started = time.monotonic()
            full = GroupOffsets(log, checkpoint=False).committed()
            full_s = time.monotonic() - started
            started = time.monotonic()
            folded = GroupOffsets(log).committed()
            fold_s = time.monotonic() - started
            require(folded == full, "the fold from the checkpoint is the fold of every commit")
            fold = MetadataFold(log)
            started = time.monotonic()
            live, pending = fold.refresh()
            plan = carry_plan(live, pending, log.max_offset, {}, set())
            carry_s = time.monotonic() - started
            started = time.monotonic()
            live, pending = fold.refresh()
            carry_plan(live, pending, log.max_offset, {}, set())
            carry_again_s = time.monotonic() - started
            row = {
                "groups": n,
                "commits": commits,
                "keys": len(folded),
                "commits_per_s": round(commits / append_s),
                "bytes_per_commit": round(log.max_offset / commits),
                "restart_fold_s": round(fold_s, 2),
                "full_fold_s": round(full_s, 2),
                "commits_after_checkpoint": n * 8 if rounds > 1 else commits,
                "checkpoint_write_s": round(checkpoint_s, 2),
                "checkpoint_mb": round(checkpoint_mb, 1),
                "carry_plan_s": round(carry_s, 2),
                "carry_plan_again_s": round(carry_again_s, 2),
                "carried": len(plan.carry),
                "carried_mb": round(sum(len(copy_message(r).body) for r in plan.carry) / 1e6, 1),
            }
        finally:
            log.close()
            shutil.rmtree(directory, ignore_errors=True)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


async def create_and_close(controllers: str, seconds: float, workers: int) -> tuple[int, float]:
    from tidelog.ledger import AsyncLedgers

    async with AsyncClient(controllers) as client:
        ledgers = AsyncLedgers(client)
        deadline = time.monotonic() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                w = await ledgers.create_ledger(2, 2, 2, b"scale")
                await w.add_entry(b"x" * 100)
                await w.close()
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return done, time.monotonic() - started


async def recovery_open(controllers: str) -> float:
    from tidelog.errors import NotEnoughBookiesError
    from tidelog.ledger import AsyncLedgers

    async with AsyncClient(controllers) as writer_client:
        deadline = time.monotonic() + 60
        while True:
            try:
                w = await AsyncLedgers(writer_client).create_ledger(2, 2, 2, b"scale")
                break
            except NotEnoughBookiesError:
                # a controller just restarted has not heard both replicas' heartbeats yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        for _ in range(100):
            await w.add_entry(b"y" * 100)
        ledger_id = w.ledger_id
        # no w.close(): leaving this block closes the writer's connections, the ledger stays OPEN
    async with AsyncClient(controllers) as client:
        ledgers = AsyncLedgers(client)
        await client.controller.cluster_status()  # connected before the timed part
        started = time.perf_counter()
        r = await ledgers.open_ledger(ledger_id, b"scale", recovery=True)
        took = time.perf_counter() - started
        require(
            r.is_closed and r.last_add_confirmed == 99, "recovery closed the ledger where its writer stopped"
        )
        await r.close()
        return took


def ledgers_dimension(
    seconds: float, workers: int, opens: int, root: Path, held: int = 0, compaction_seconds: float = 0
) -> list[dict[str, Any]]:
    cluster = BenchCluster(root / "ledgers", broker_options=dict(SYNC_REPLICATED))
    if held:
        write_held_snapshot(root / "ledgers" / "controller" / "data" / "c1", held)
    with cluster:
        cluster.wait_ready("scale-probe", queues=1, timeout=120)
        done, took = asyncio.run(create_and_close(cluster.controller_address, seconds, workers))
        pid = cluster.pids["controller"]
        row: dict[str, Any] = {
            "ledgers_held": held,
            "ledgers": done,
            "create_close_per_s": round(done / took),
            "rss_controller_mb": round(rss_mb(pid), 1),
            "controller_disk_mb": round(dir_mb(root / "ledgers" / "controller"), 1),
            "controller_restart_s": restart_controller(cluster, "scale-probe"),
        }
        # one open is a handful of round trips and two fsyncs: on a shared machine a single
        # sample says little, so several, each a ledger of its own and a fresh client
        recovered = [asyncio.run(recovery_open(cluster.controller_address)) * 1000 for _ in range(opens)]
        row["recovery_open_ms"] = round(statistics.median(recovered), 1)
        row["recovery_open_max_ms"] = round(max(recovered), 1)
        if compaction_seconds:
            row.update(opens_during_compaction(cluster, compaction_seconds))
    print(json.dumps(row), file=sys.stderr, flush=True)
    return [row]


_SNAPSHOT_LINE = re.compile(
    r"^(\S+ \S+) INFO tidelog\.controller\.snapshotfile .*controller snapshot of entry \d+ written: "
    r".*captured in (\d+) ms in the Raft thread, written in ([\d.]+) s beside it",
    re.MULTILINE,
)


def opens_during_compaction(cluster: BenchCluster, seconds: float) -> dict[str, Any]:
    """Recovery opens one after another for `seconds` while 4 creators make the controller's log
    grow to its next compaction (controller/snapshotfile.py): the opens whose time overlapped the
    writing of a snapshot (from the controller's log), their median and slowest (ms)."""
    import datetime
    import threading

    load = threading.Thread(
        target=lambda: asyncio.run(create_and_close(cluster.controller_address, seconds, 4)), daemon=True
    )
    load.start()
    timed: list[tuple[float, float, float]] = []  # (start, end) wall time, ms
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.time()
        took = asyncio.run(recovery_open(cluster.controller_address))
        timed.append((started, time.time(), took * 1000))
    load.join()
    windows, captures = [], []
    for stamp, capture_ms, write_s in _SNAPSHOT_LINE.findall(cluster.logs(tail=200_000)):
        end = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        windows.append((end - float(write_s), end))
        captures.append(int(capture_ms))
    during = [ms for a, b, ms in timed if any(a < w1 and b > w0 for w0, w1 in windows)]
    return {
        "snapshots_written": len(windows),
        "snapshot_capture_ms": max(captures, default=None),
        "snapshot_write_s": round(max((w1 - w0 for w0, w1 in windows), default=0.0), 2),
        "opens_during_snapshot": len(during),
        "recovery_open_during_snapshot_ms": round(statistics.median(during), 1) if during else None,
        "recovery_open_during_snapshot_max_ms": round(max(during), 1) if during else None,
        "recovery_open_busy_max_ms": round(max(ms for _, _, ms in timed), 1),
    }


def fences_dimension(steps: list[int], root: Path) -> list[dict[str, Any]]:
    from tidelog.commitlog import CommitLog, Message
    from tidelog.ledger.store import LedgerIndex

    rows: list[dict[str, Any]] = []
    for n in steps:
        directory = root / f"fences-{n}"
        log = CommitLog.open(directory, flush="async")
        try:
            log.append([Message("scale", 0, b"x")])
            held = LedgerIndex(log)
            held._fences.update({10**9 + i: 1 for i in range(n)})  # noqa: SLF001 - the bench's setup
            held._save_fences()  # noqa: SLF001
            index = LedgerIndex(log)
            took = []
            for ledger_id in range(9):
                started = time.perf_counter()
                require(index.fence(ledger_id), "a new fence")
                took.append((time.perf_counter() - started) * 1000)
            row = {
                "fences_held": n,
                "fence_ms": round(statistics.median(took), 1),
                "fence_max_ms": round(max(took), 1),
            }
        finally:
            log.close()
            shutil.rmtree(directory, ignore_errors=True)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def held_state(topics: int, ledgers: int) -> Any:
    """A controller state holding `topics` topics of 8 queues on broker-a and `ledgers` closed
    ledgers of 100 entries on broker-a's replicas 1 and 2 (ids 0..ledgers-1, the id counter
    past them)."""
    from tidelog.controller.model import MetaEntry, Topic
    from tidelog.controller.state import ControllerState
    from tidelog.ledger.metadata import LedgerMetadata, LedgerState, hash_password
    from tidelog.ledger.params import COUNTER_KEY, ledger_key

    state = ControllerState()
    for i in range(topics):
        name = f"scale-{i:07d}"
        state.topics[name] = Topic(name, {"broker-a": 8}, created_ms=1_700_000_000_000 + i, generation=i + 1)
    state.next_topic_generation = topics + 1
    pw = hash_password(b"secret")
    for i in range(ledgers):
        meta = LedgerMetadata(
            ledger_id=i,
            broker_set="broker-a",
            ensemble_size=2,
            write_quorum=2,
            ack_quorum=2,
            ensembles=((0, (1, 2)),),
            password_hash=pw,
            state=LedgerState.CLOSED,
            last_entry_id=99,
            length=102_400,
            ctime_ms=1_700_000_000_000 + i,
        )
        key = ledger_key(i)
        state.metadata[key] = MetaEntry(key, meta.encode(), 3, 1_700_000_000_000 + i)
    if ledgers:
        state.metadata[COUNTER_KEY] = MetaEntry(
            COUNTER_KEY, str(ledgers).encode("ascii"), 1, 1_700_000_000_000
        )
    return state


def write_held_snapshot(node_dir: Path, ledgers: int) -> None:
    """A controller node's snapshot file holding `ledgers` closed ledgers, as its Raft node writes
    one (controller/snapshotfile.py), for the node to start from as after a restart."""
    from tidelog.controller import snapshot, snapshotfile

    state = held_state(0, ledgers)
    private.private_dir(node_dir)  # the controller refuses a data dir others can read
    for d in (node_dir.parent, node_dir):
        d.chmod(0o700)
    path = node_dir / "raft.snapshot"
    # Raft's part: the last two entries the snapshot covers (command, index, term), no cluster
    snapshotfile.write(path, ((b"", 2, 1), (b"", 1, 1), set()), snapshot.capture(state))
    path.chmod(0o600)


def snapshot_dimension(topic_steps: list[int], ledger_steps: list[int]) -> list[dict[str, Any]]:
    """Per step, a controller state's snapshot as its Raft node takes it (controller/snapshotfile.py):
    the capture in the Raft thread, the file written beside it, and the restore."""
    import tempfile
    import tracemalloc

    from tidelog.controller import snapshot, snapshotfile

    rows: list[dict[str, Any]] = []
    for topics, ledgers in zip(topic_steps, ledger_steps, strict=True):
        tracemalloc.start()
        state = held_state(topics, ledgers)
        heap = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        gcpolicy.settle()  # as a controller does with a state it keeps (tidelog/gcpolicy.py)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "raft.snapshot"
            started = time.perf_counter()
            captured = snapshot.capture(state)
            capture_s = time.perf_counter() - started
            started = time.perf_counter()
            size = snapshotfile.write(path, ((b"", 2, 1), (b"", 1, 1), set()), captured)
            write_s = time.perf_counter() - started
            started = time.perf_counter()
            with gcpolicy.paused():  # as the Raft node's load (controller/raft.py)
                restored, _ = snapshotfile.read(path, state.max_meta_value_bytes)
            restore_s = time.perf_counter() - started
        require(restored == state, "snapshot round trip")
        del state, captured, restored  # freed now, not inside the next step's timed capture
        row = {
            "topics": topics,
            "ledgers": ledgers,
            "state_heap_mb": round(heap / 1e6, 1),
            "raft_thread_s": round(capture_s, 3),
            "write_s": round(write_s, 2),
            "snapshot_mb": round(size / 1e6, 1),
            "restore_s": round(restore_s, 2),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


_GROW = """
import os, sys, time
from tidelog.commitlog import CommitLog, Message
directory, target = sys.argv[1], int(sys.argv[2])
log = CommitLog.open(directory, flush="async")
body = os.urandom(1024)
batch = [Message("scale", q % 8, body) for q in range(1000)]
while log.max_offset < target:
    log.append(batch)
end = log.max_offset
while log.flushed_offset < end:  # the flusher's checkpoint follows within its interval
    time.sleep(0.05)
time.sleep(1.5)  # one checkpoint interval: recovery then starts at most one interval back
os._exit(0)  # a crash: no clean close
"""

_OPEN = """
import sys, time
started = time.monotonic()
from tidelog.commitlog import CommitLog
imported = time.monotonic()
log = CommitLog.open(sys.argv[1], flush="async")
opened = time.monotonic()
print(log.max_offset, round(imported - started, 3), round(opened - imported, 3))
log.close()
"""


def log_dimension(steps_gb: list[float], root: Path) -> list[dict[str, Any]]:
    """Grow one log to each size, leave it as a crash would, and time the next open."""
    directory = root / "log"
    rows: list[dict[str, Any]] = []
    for gb in steps_gb:
        target = int(gb * 1e9)
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", _GROW, str(directory), str(target)], check=True, timeout=3600)
        write_s = time.monotonic() - started
        out = subprocess.run(
            [sys.executable, "-c", _OPEN, str(directory)],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout.split()
        row = {
            "log_gb": round(int(out[0]) / 1e9, 2),
            "write_mb_s": round(target / 1e6 / write_s),
            "open_after_crash_s": float(out[2]),
            "import_s": float(out[1]),
            "segments": len(list((directory / "commitlog").glob("*"))),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


async def produce_to(
    address: str, topic: str, target: int, body: int, producers: int = 4
) -> tuple[int, float]:
    """Closed-loop producers sending requests of 1,000 keyless messages of `body` bytes to
    `topic` until the broker's log reaches `target` bytes; returns (its max offset, seconds)."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(producers)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    request = pb.ProduceRequest(topic=topic, messages=[pb.ProduceMessage(body=os.urandom(body))] * 1000)
    started = time.monotonic()
    end = 0
    try:

        async def producer(stub: pb_grpc.BrokerStub) -> None:
            nonlocal end
            while end < target:
                try:
                    await stub.Produce(request, timeout=30)
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)  # a failover or a full queue: try again shortly
                status = await stub.Status(pb.StatusRequest(), timeout=5)
                end = max(end, status.max_offset)

        await asyncio.gather(*(producer(stub) for stub in stubs))
        return end, time.monotonic() - started
    finally:
        for c in channels:
            await c.close()


def _serves_end(stub: pb_grpc.BrokerStub, topic: str, end: int) -> bool:
    """Whether the broker answers as master with its log at `end` and reads queue 0's last message."""
    try:
        status = stub.Status(pb.StatusRequest(), timeout=1)
        if status.role != "master" or status.max_offset < end or status.confirm_offset < end:
            return False
        offsets = stub.GetOffsets(pb.GetOffsetsRequest(topic=topic, queue=0), timeout=1).offsets
        if offsets.max == 0:
            return False
        read = stub.Pull(
            pb.PullRequest(topic=topic, queue=0, offset=offsets.max - 1, max_messages=1), timeout=2
        )
        return len(read.messages) == 1
    except grpc.RpcError:
        return False


def restart_dimension(steps_gb: list[float], root: Path, body: int) -> list[dict[str, Any]]:
    """One replica grown through produce requests to each size, killed with SIGKILL and started
    again: the time until it serves, as master, a read of its log's last message."""
    rows: list[dict[str, Any]] = []
    with BenchCluster(root / "restart", replicas=1, broker_options={"flush": "async"}) as cluster:
        cluster.wait_ready("scale", 8)
        stub = cluster.stubs[0]
        for gb in steps_gb:
            end, took = asyncio.run(produce_to(cluster.master_address, "scale", int(gb * 1e9), body))
            proc = cluster.brokers[0]
            proc.kill9()
            started = time.monotonic()
            proc.start()
            wait_until(
                lambda end=end: _serves_end(stub, "scale", end), 300, 0.02, what="the restarted broker serves"
            )
            restart_s = time.monotonic() - started
            row = {
                "log_gb": round(end / 1e9, 2),
                "produce_mb_s": round((end - (rows[-1]["end"] if rows else 0)) / 1e6 / took),
                "restart_to_serving_s": round(restart_s, 2),
                "end": end,
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    for row in rows:
        del row["end"]
    return rows


def catchup_dimension(steps_gb: list[float], root: Path, body: int) -> list[dict[str, Any]]:
    """A slave away (SIGKILL) while its master takes each amount of new log, then started again:
    how long it takes to copy what it missed (its max offset reaching the master's) and to be
    back in the SyncStateSet."""
    rows: list[dict[str, Any]] = []
    with BenchCluster(root / "catchup", broker_options=dict(SYNC_REPLICATED)) as cluster:
        cluster.wait_ready("scale", 8)
        slave_index = 1 - cluster.master_index
        slave, slave_stub = cluster.brokers[slave_index], cluster.stubs[slave_index]
        master_stub = cluster.stubs[cluster.master_index]
        for gb in steps_gb:
            slave.kill9()
            before = master_stub.Status(pb.StatusRequest(), timeout=5).max_offset
            end, took = asyncio.run(produce_to(cluster.master_address, "scale", before + int(gb * 1e9), body))
            started = time.monotonic()
            slave.start()

            def caught_up(end: int = end) -> bool:
                try:
                    return slave_stub.Status(pb.StatusRequest(), timeout=1).max_offset >= end
                except grpc.RpcError:
                    return False

            wait_until(caught_up, 1800, 0.05, what="the slave caught up")
            copy_s = time.monotonic() - started
            cluster.wait_in_sync(300)
            row = {
                "missed_gb": round((end - before) / 1e9, 2),
                "produce_mb_s": round((end - before) / 1e6 / took),
                "catch_up_s": round(copy_s, 2),
                "catch_up_mb_s": round((end - before) / 1e6 / copy_s),
                "back_in_sync_s": round(time.monotonic() - started, 2),
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def retention_dimension(
    seconds: float, root: Path, body: int, limit_mb: int, segment_mb: int
) -> list[dict[str, Any]]:
    """A broker set of two with `retention_bytes` set, written at full speed for `seconds`: does
    retention delete as fast as the log grows? The replicas' logs on disk are sampled every
    second: the largest, and the last."""
    options = {
        **SYNC_REPLICATED,
        "segment_bytes": segment_mb << 20,
        "retention_bytes": limit_mb << 20,
        "retention_check_interval_ms": 1000,
    }
    with BenchCluster(root / "retention", broker_options=options) as cluster:
        cluster.wait_ready("scale", 8)
        logs = [d / "commitlog" for d in cluster.data_dirs]
        sizes: list[list[float]] = [[] for _ in logs]
        done = False

        async def sample() -> None:
            while not done:
                for i, d in enumerate(logs):
                    sizes[i].append(dir_mb(d) if d.exists() else 0.0)
                await asyncio.sleep(1.0)  # the sampling period, not an ordering wait

        async def both() -> tuple[int, float]:
            nonlocal done
            sampler = asyncio.create_task(sample())
            try:
                acked, took, _ = await produce_spread(
                    cluster.master_address, ["scale"], 1000, body, 8, seconds
                )
                return acked, took
            finally:
                done = True
                await sampler

        acked, took = asyncio.run(both())
        status = cluster.stubs[cluster.master_index].Status(pb.StatusRequest(), timeout=5)
        row = {
            "written_mb": round(status.max_offset / 1e6),
            "write_mb_s": round(status.max_offset / 1e6 / took),
            "retention_mb": round((limit_mb << 20) / 1e6),
            "segment_mb": round((segment_mb << 20) / 1e6),
            "largest_mb": [round(max(s), 1) for s in sizes],
            "last_mb": [round(s[-1], 1) for s in sizes],
            "min_offset_mb": round(status.min_offset / 1e6),
        }
    print(json.dumps(row), file=sys.stderr, flush=True)
    return [row]


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def _floats(text: str) -> list[float]:
    return sorted(float(s) for s in text.split(",") if s)


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Every dimension asked for (`--only`: one), in order."""
    dimensions: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "topics": lambda: topics_dimension(sorted(_ints(args.topics)), args.queues, root),
        "queues": lambda: queues_dimension(
            sorted(_ints(args.active_queues)),
            root,
            seconds=args.seconds,
            body=args.body,
            producers=args.producers,
            max_open=args.cq_max_open_files,
        ),
        "store": lambda: store_dimension(
            sorted(_ints(args.active_queues)), root, seconds=args.seconds, body=args.body
        ),
        "groups": lambda: groups_dimension(sorted(_ints(args.groups)), args.commit_rounds, root),
        "group-commits": lambda: group_commits_dimension(
            sorted(_ints(args.commit_rates)),
            args.seconds,
            args.commit_batch,
            _ints(args.commit_clients),
            args.commit_interval_ms,
            root,
        ),
        "ledgers": lambda: ledgers_dimension(
            args.ledger_seconds,
            args.ledger_workers,
            args.recovery_opens,
            root,
            args.ledgers_held,
            args.opens_during_compaction,
        ),
        "fences": lambda: fences_dimension(sorted(_ints(args.fences)), root),
        "snapshot": lambda: snapshot_dimension(_ints(args.snap_topics), _ints(args.ledgers)),
        "log": lambda: log_dimension(_floats(args.log_gb), root),
        "restart": lambda: restart_dimension(_floats(args.log_gb), root, 1024),
        "catchup": lambda: catchup_dimension(_floats(args.catchup_gb), root, 1024),
        "retention": lambda: retention_dimension(
            args.retention_seconds, root, 1024, args.retention_mb, args.segment_mb
        ),
    }
    return {name: measure() for name, measure in dimensions.items() if args.only in (None, name)}


def _ledger_arguments(parser: argparse.ArgumentParser) -> None:
    """The ledgers dimension's options."""
    parser.add_argument("--ledger-seconds", type=float, default=60.0, help="ledgers: create-and-close time")
    parser.add_argument("--ledger-workers", type=int, default=32, help="ledgers: concurrent creators")
    parser.add_argument(
        "--recovery-opens", type=int, default=5, help="ledgers: recovery opens timed (median, max)"
    )
    parser.add_argument(
        "--ledgers-held", type=int, default=0, help="ledgers: closed ledgers the controller starts with"
    )
    parser.add_argument(
        "--opens-during-compaction",
        type=float,
        default=0.0,
        help="ledgers: seconds of recovery opens beside creators that bring on a log compaction (0: none)",
    )


def _commit_arguments(parser: argparse.ArgumentParser) -> None:
    """The group-commits dimension's options."""
    parser.add_argument(
        "--commit-batch",
        type=int,
        default=1,
        help="group commits per call (1: CommitOffset; more: CommitOffsets)",
    )
    parser.add_argument(
        "--commit-clients",
        default="",
        help="group commits through this many clients, one row each (e.g. 1,4,16; none: raw calls)",
    )
    parser.add_argument(
        "--commit-interval-ms",
        type=int,
        default=DEFAULT_COMMIT_INTERVAL_MS,
        help="group commits through clients: their commit_interval_ms",
    )
    parser.add_argument(
        "--commit-rates",
        default="1000,2500,5000,10000",
        help="group commits: commits a second, one step each",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", default="1000,5000,20000", help="topic counts, one step each")
    parser.add_argument("--queues", type=int, default=8, help="queues per topic")
    parser.add_argument("--log-gb", default="0.25,1", help="log sizes in GB, one step each (log, restart)")
    parser.add_argument("--catchup-gb", default="1,4", help="catch-up: GB a slave misses, one step each")
    parser.add_argument("--retention-seconds", type=float, default=60.0, help="retention: produce time")
    parser.add_argument("--retention-mb", type=int, default=512, help="retention: retention_bytes in MiB")
    parser.add_argument("--segment-mb", type=int, default=64, help="retention: segment_bytes in MiB")
    parser.add_argument("--active-queues", default="8,1000,10000", help="active queue counts, one step each")
    parser.add_argument("--seconds", type=float, default=15.0, help="produce time per active-queues step")
    parser.add_argument("--body", type=int, default=256, help="message body bytes (active queues)")
    parser.add_argument("--producers", type=int, default=8, help="concurrent producers (active queues)")
    parser.add_argument(
        "--cq-max-open-files", type=int, help="the brokers' cq_max_open_files (default theirs)"
    )
    parser.add_argument("--groups", default="1000,10000", help="consumer-group counts, one step each")
    parser.add_argument("--commit-rounds", type=int, default=3, help="commits of every queue per group")
    _commit_arguments(parser)
    parser.add_argument("--fences", default="0,100000,1000000", help="fences held, one step each")
    parser.add_argument("--snap-topics", default="100000,0,0", help="controller snapshot: topics, per step")
    parser.add_argument("--ledgers", default="0,100000,300000", help="controller snapshot: ledgers, per step")
    _ledger_arguments(parser)
    parser.add_argument(
        "--only",
        choices=(
            "topics",
            "queues",
            "groups",
            "group-commits",
            "ledgers",
            "fences",
            "snapshot",
            "log",
            "restart",
            "catchup",
            "retention",
            "store",
        ),
        help="run one dimension",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--workdir", help="where the clusters live (default: a temporary directory)")
    args = parser.parse_args(argv)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="tidelog-scale-"))
    try:
        results = run(args, root)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
        return 0
    for dimension, rows in results.items():
        print(f"\n{dimension}")
        keys = list(rows[0]) if rows else []
        print("  ".join(f"{k:>14}" for k in keys))
        for row in rows:
            print("  ".join(f"{row[k]!s:>14}" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
