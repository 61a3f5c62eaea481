"""Crash test of the commit log: SIGKILL a writer that acknowledges only after `flushed`, recover.

Owns the promise "an acknowledged message survives a crash". Each round starts
`crash_writer.py` in a child process (flush="sync", 64 KiB segments so they roll, concurrent
appenders so group commit is exercised), reads its "ACK <seq>" lines, kills it with SIGKILL after
a seeded random number of acks, and then recovers two directories in this process:

- the log directory as the kill left it (a process crash: the page cache survives), and
- the child's shadow copy holding only what a completed fsync/fdatasync covered (a power cut at
  the same moment). Only this one fails if `flushed` resolved before the data was synced, or if
  the checkpoint claimed more than was synced.

In both, every acknowledged message must be readable, in log order, byte-identical, with dense
queue offsets from 0, and a second recovery must find the same max offset.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.commitlog import crash_writer as cw
from tidelog.commitlog import CommitLog, StoredMessage

WRITER = Path(cw.__file__).resolve()
ROUND_SEEDS = (11, 23, 37, 41, 59)
CHILD_TIMEOUT_S = 30.0  # a stuck child is killed by the watchdog; its round then fails


def _read_all(log: CommitLog) -> list[StoredMessage]:
    """Every message of every crash-test queue, checking queue offsets are dense from 0."""
    out: list[StoredMessage] = []
    for q in range(cw.QUEUES):
        offset = 0
        while True:
            got = log.read(cw.TOPIC, q, offset, max_count=256)
            if not got:
                break
            for i, m in enumerate(got):
                assert m.queue_offset == offset + i, (
                    f"queue {q}: offset {m.queue_offset} where {offset + i} was due"
                )
            offset += len(got)
            out.extend(got)
        assert log.queue_offsets(cw.TOPIC, q).max == offset, f"queue {q} has units past what reads return"
    return sorted(out, key=lambda m: m.phys_offset)


def _check_recovered(directory: Path, seed: int, acked: set[int], what: str) -> int:
    """Recover `directory` and check every acked message; returns how many messages it holds."""
    log = CommitLog.open(directory, segment_bytes=cw.SEGMENT_BYTES, flush="sync")
    try:
        log.confirm_offset = log.max_offset
        msgs = _read_all(log)
        max_offset = log.max_offset
        assert log.queues() in ([], [(cw.TOPIC, q) for q in range(cw.QUEUES)])
    finally:
        log.close()
    # The log holds a prefix of what was appended: sequence numbers 0..n-1 in log order.
    for i, m in enumerate(msgs):
        seq = cw.seq_of(m.body)
        assert seq == i, f"{what}: record {i} in log order holds seq {seq}"
        assert m.queue_id == cw.queue_for(seq), f"{what}: seq {seq} is in queue {m.queue_id}"
        assert m.queue_offset == seq // cw.QUEUES, f"{what}: seq {seq} has queue offset {m.queue_offset}"
        assert m.body == cw.body_for(seed, seq), f"{what}: body of seq {seq} differs"
    lost = sorted(s for s in acked if s >= len(msgs))
    assert not lost, (
        f"{what}: {len(lost)} acknowledged messages are missing after recovery "
        f"(first {lost[:5]}, log holds {len(msgs)})"
    )
    # Recovery is idempotent: the first one left nothing for a second one to cut.
    again = CommitLog.open(directory, segment_bytes=cw.SEGMENT_BYTES, flush="sync")
    try:
        assert again.max_offset == max_offset, (
            f"{what}: second recovery moved max offset {max_offset} -> {again.max_offset}"
        )
        again.confirm_offset = again.max_offset
        assert len(_read_all(again)) == len(msgs), (
            f"{what}: second recovery reads a different number of messages"
        )
    finally:
        again.close()
    return len(msgs)


def _run_child(tmp: Path, seed: int) -> tuple[set[int], Path, Path]:
    """Start the writer, kill it with SIGKILL after a seeded number of acks; returns the acks."""
    rng = random.Random(seed)
    kill_after = rng.randint(20, 600)
    log_dir, shadow_dir = tmp / "log", tmp / "shadow"
    stderr_path = tmp / "child.stderr"
    acked: set[int] = set()
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(WRITER), str(log_dir), str(shadow_dir), str(seed)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    watchdog = threading.Timer(CHILD_TIMEOUT_S, lambda: child.kill())
    watchdog.start()
    try:
        assert child.stdout is not None
        for line in child.stdout:
            acked.add(int(line.split()[1]))
            if len(acked) >= kill_after:
                # Land the kill at a random point of the next append/fsync cycle.
                time.sleep(rng.random() * 0.003)
                os.kill(child.pid, signal.SIGKILL)
                break
        # Lines the child printed before it died are acknowledgements too.
        acked.update(int(line.split()[1]) for line in child.stdout)
        child.wait()
    finally:
        watchdog.cancel()
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert len(acked) >= kill_after, (
        f"the writer stopped after {len(acked)} acks (rc {child.returncode}):\n"
        + stderr_path.read_text()[-3000:]
    )
    assert child.returncode == -signal.SIGKILL
    return acked, log_dir, shadow_dir


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", ROUND_SEEDS)
def test_acknowledged_messages_survive_sigkill(tmp_path: Path, seed: int) -> None:
    acked, log_dir, shadow_dir = _run_child(tmp_path, seed)
    segments = len(os.listdir(log_dir / "commitlog"))
    held = _check_recovered(log_dir, seed, acked, "after SIGKILL")
    held_synced = _check_recovered(shadow_dir, seed, acked, "power cut at the kill (synced bytes only)")
    assert held_synced <= held
    if len(acked) > 200:  # enough data that segments must have rolled
        assert segments >= 3, f"{len(acked)} acks fit in {segments} segments; the test meant to roll them"
