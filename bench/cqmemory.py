"""Consume-queue memory and restart benchmark: a broker's RSS and start-up time over a full log.

Owns the figures of bench/RESULTS.md "Consume queues on disk". Run from the repository root:

    python -m bench.cqmemory --messages 1000000
    python -m bench.cqmemory --messages 1000000 --baseline-path DIR   # also the code in DIR

It fills a broker's data directory with `--messages` small records (16-byte bodies, round robin
over `--queues` queues, batches of 1000) through the CommitLog API in this process, then starts a
real broker process on it (one replica and one controller, on loopback) and measures:

- the time from spawning the broker until it answers `Status` (the log is opened and recovered
  before the broker serves anything), and until it serves the topic as master;
- its VmRSS right after that, and again after pulling a few messages from the start and from the
  end of every queue.

`--baseline-path DIR` names a directory holding another build of the `tidelog` package (for the
code before a change); the broker is then started a second time with `PYTHONPATH=DIR`, on the same
data. Every run fills a new directory (a broker registered with an earlier run's controller
carries that cluster's epochs) and deletes it at the end unless `--keep` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from tidelog.broker import identity
from tidelog.broker.topics import mark_message
from tidelog.clusterauth import new_secret
from tidelog.commitlog import CommitLog, Message
from tidelog.localcluster import BrokerSet, ControllerCluster, create_topic, wait_until
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc

TOPIC = "cqbench"
BROKER_SET = "broker-a"
BATCH = 1000
BODY = b"0123456789abcdef"
# A generation no controller of the bench reaches: the broker serves the filled topic as it is
# instead of writing a marker that would cut its queues at their ends (broker/topics.py).
GENERATION = 1 << 40
STOP_TIMEOUT_S = 300.0  # a clean shutdown, so every start recovers from a clean checkpoint


def fill(data_dir: Path, messages: int, queues: int) -> float:
    """Append `messages` records to the commit log of broker data directory `data_dir`; seconds."""
    started = time.monotonic()
    log = CommitLog.open(data_dir, flush="async")
    try:
        log.append([mark_message(TOPIC, GENERATION, {})])
        for lo in range(0, messages, BATCH):
            log.append([Message(TOPIC, i % queues, BODY) for i in range(lo, min(messages, lo + BATCH))])
        log.confirm_offset = log.max_offset
        log.flush()
    finally:
        log.close()
    return time.monotonic() - started


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def pull_ends(address: str, queues: int) -> int:
    """Pull 32 messages from the start and 32 from the end of every queue; messages pulled."""
    got = 0
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for q in range(queues):
            offsets = stub.GetOffsets(pb.GetOffsetsRequest(topic=TOPIC, queue=q), timeout=30.0).offsets
            for start in (offsets.min, max(offsets.min, offsets.max - 32)):
                reply = stub.Pull(
                    pb.PullRequest(topic=TOPIC, queue=q, offset=start, max_messages=32), timeout=30.0
                )
                got += len(reply.messages)
    return got


class Session:
    """One controller for the whole run and the broker replica of `data_dir`, restarted per
    measurement (the same identity and epoch each time, as a broker restarts in production)."""

    def __init__(self, root: Path, queues: int) -> None:
        self.root = root
        self.queues = queues
        data_dir = root / f"{BROKER_SET}-0"
        identity.save(data_dir, identity.Identity(BROKER_SET, uuid.uuid4().hex, None))
        secret = new_secret()
        (root / "controller").mkdir(exist_ok=True)
        self.controllers = ControllerCluster(root / "controller", 1, secret=secret, heartbeat_timeout_ms=3000)
        self.brokers = BrokerSet(
            root, BROKER_SET, 1, self.controllers.address_list, secret=secret, log_level="WARNING"
        )
        self.created = False

    def __enter__(self) -> Session:
        self.controllers.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.brokers.procs[0].stop(STOP_TIMEOUT_S)
        self.brokers.stop()
        self.controllers.stop()
        shutil.rmtree(self.root / "controller", ignore_errors=True)

    def measure(self, pythonpath: str | None) -> dict[str, Any]:
        """Start the broker (with `pythonpath` first on its path when given), take the figures,
        stop it cleanly."""
        old_path, old_cwd = os.environ.get("PYTHONPATH"), os.getcwd()
        if pythonpath:
            os.environ["PYTHONPATH"] = pythonpath  # the process below inherits it
        # `python -m` puts the working directory first on the path: away from the repository root,
        # the broker imports the build PYTHONPATH names (or the installed one), not the checkout's
        os.chdir(self.root)
        proc = self.brokers.procs[0]
        try:
            spawned = time.monotonic()
            proc.start()
        finally:
            os.chdir(old_cwd)
            if old_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old_path
        try:
            return self._figures(spawned)
        finally:
            proc.stop(STOP_TIMEOUT_S)

    def _figures(self, spawned: float) -> dict[str, Any]:
        brokers = self.brokers
        wait_until(lambda: brokers.status(0) is not None, 900.0, 0.05, what="the broker to answer Status")
        answered = time.monotonic() - spawned
        if not self.created:
            create_topic(self.controllers.address_list, TOPIC, {BROKER_SET: self.queues}, 60.0)
            self.created = True
        brokers.wait_master(120.0)
        brokers.wait_topic(TOPIC, [0], 120.0)
        serving = time.monotonic() - spawned
        pid = brokers.procs[0].pid
        rss_start = rss_kib(pid)
        pulled = pull_ends(brokers.addresses[0], self.queues)
        return {
            "status_s": round(answered, 2),
            "serving_s": round(serving, 2),
            "rss_start_mib": round(rss_start / 1024, 1),
            "rss_after_reads_mib": round(rss_kib(pid) / 1024, 1),
            "pulled": pulled,
        }


def disk_use(path: Path) -> dict[str, float]:
    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    return {
        "commitlog_mib": round(size(path / "commitlog") / 2**20, 1),
        "consumequeue_mib": round(size(path / "consumequeue") / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--data", type=Path, help="work directory (new or empty; default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--baseline-path", help="PYTHONPATH of the code to compare with")
    ap.add_argument("--repeat", type=int, default=1, help="starts per build")
    args = ap.parse_args(argv)
    if args.data is not None and args.data.exists() and any(args.data.iterdir()):
        ap.error(f"{args.data} is not empty")  # it is deleted at the end: never someone's data
    root = (args.data or Path(tempfile.mkdtemp(prefix="cqbench-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / f"{BROKER_SET}-0"
    out: dict[str, Any] = {"messages": args.messages, "queues": args.queues}
    try:
        data_dir.mkdir(parents=True)
        out["fill_s"] = round(fill(data_dir, args.messages, args.queues), 1)
        out["disk"] = disk_use(data_dir)
        builds = [("this", None)] + ([("baseline", args.baseline_path)] if args.baseline_path else [])
        with Session(root, args.queues) as session:
            out["warm_up"] = session.measure(None)  # registers, creates the topic, warms the page cache
            for _ in range(args.repeat):
                for name, path in builds:
                    out.setdefault(name, []).append(session.measure(path))
                    print(name, out[name][-1], file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
