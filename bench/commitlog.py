"""Commit-log benchmark: append, group-commit, read and raw-disk figures in one run.

Owns the numbers behind bench/RESULTS.md. Run from the repository root:

    python -m bench.commitlog            # table
    python -m bench.commitlog --json     # machine-readable

What it measures (MB = 10^6 bytes; bytes are record sizes, header included):

- batched append of 1 KiB-body records, batch sizes 1, 100 and 1000, flush="async"; the timed
  region ends with one `flush()` so the figure is for bytes that reached the disk;
- sync group commit: 1, 16 and 64 asyncio appenders, each appending one record and awaiting
  `flushed(end)` before the next;
- sequential read of everything the batch-1000 run wrote, by queue offset, first from the page
  cache, then after asking the kernel to drop the segments' cached pages;
- the raw baseline: the same bytes written with `os.write` of 1 MiB chunks and one `fdatasync`
  per chunk to a file in the same directory.

and it checks two targets: batched append at batch 1000 reaches at least 50% of the raw
baseline's bytes/s, and 64 sync appenders reach at least 25x the records/s of one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tidelog.commitlog import CommitLog, Message

BODY_BYTES = 1024
SEGMENT_BYTES = 256 << 20
RAW_CHUNK = 1 << 20
TOPIC = "bench"
BATCH_SIZES = (1, 100, 1000)
APPENDER_COUNTS = (1, 16, 64)
APPEND_TARGET_FRACTION = 0.50  # batched async append vs the raw baseline, bytes/s
GROUP_COMMIT_TARGET = 25.0  # records/s with 64 sync appenders vs with one


# ---------------------------------------------------------------------------------- machine


def fs_type(path: str) -> tuple[str, str]:
    """(filesystem type, device) of the mount holding `path`, from /proc/self/mounts."""
    path = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[0]):
                    best = (mnt, typ, dev)
    except OSError:
        pass
    return best[1], best[2]


def pick_base_dir(requested: str | None) -> str:
    """Where the bench's temporary directory goes: a disk, never tmpfs (it would hide fdatasync)."""
    if requested:
        return requested
    tmp = tempfile.gettempdir()
    if fs_type(tmp)[0] in ("tmpfs", "ramfs"):
        return os.getcwd()
    return tmp


def report(result: dict[str, Any], as_json: bool, format_table: Callable[[dict[str, Any]], str]) -> None:
    """Print a bench's figures: JSON for machines, or its table for people."""
    if as_json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(result))


def fdatasync_latency(
    directory: str, rounds: int = 200, *, size: int = 4096, pace_s: float = 0.0, writers: int = 1
) -> dict[str, float]:
    """Percentiles of a round, a `size`-byte pwrite then fdatasync: the floor of one group commit.

    `pace_s` sleeps between rounds (a writer that waits for each acknowledgement leaves the disk
    idle between its syncs, unlike a loop of back-to-back syncs). With `writers` > 1, that many
    threads each append to a file of their own and sync it at once, every round; a round's time
    is until the last of them is done: two replicas of a broker set on one disk under `flush:
    sync`, where an acknowledgement waits for both syncs."""
    paths = [os.path.join(directory, f"fdatasync-probe-{i}") for i in range(writers)]
    fds = [os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for path in paths]
    block = os.urandom(size)
    samples: list[float] = []
    barrier = threading.Barrier(writers + 1, timeout=60)  # a writer that failed breaks it, not hangs it

    def writer(fd: int) -> None:
        for i in range(rounds):
            barrier.wait()
            os.pwrite(fd, block, i * size)
            os.fdatasync(fd)
            barrier.wait()

    # one writer syncs in this thread: no hand-over between threads inside its timed rounds
    threads = [threading.Thread(target=writer, args=(fd,), daemon=True) for fd in fds] if writers > 1 else []
    try:
        for t in threads:
            t.start()
        for i in range(rounds):
            if pace_s:
                time.sleep(pace_s)
            if threads:
                barrier.wait()
                t0 = time.perf_counter()
                barrier.wait()
            else:
                t0 = time.perf_counter()
                os.pwrite(fds[0], block, i * size)
                os.fdatasync(fds[0])
            samples.append(time.perf_counter() - t0)
    finally:
        for t in threads:
            t.join()
        for fd, path in zip(fds, paths, strict=True):
            os.close(fd)
            os.unlink(path)
    samples.sort()
    n = len(samples)
    return {
        "median_ms": samples[n // 2] * 1e3,
        "p90_ms": samples[n * 9 // 10] * 1e3,
        "p99_ms": samples[n * 99 // 100] * 1e3,
        "max_ms": samples[-1] * 1e3,
    }


def code_version(paths: Sequence[str] = ("commitlog",)) -> str:
    """The commit measured, marked "+dirty" when `paths` have uncommitted changes."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_info(directory: str) -> dict[str, Any]:
    typ, dev = fs_type(directory)
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "filesystem": typ,
        "device": dev,
        "fdatasync_4k": fdatasync_latency(directory),
    }


# ---------------------------------------------------------------------------------- append


def _message() -> Message:
    return Message(TOPIC, 0, os.urandom(BODY_BYTES))


def bench_append(
    directory: str, batch: int, duration: float, max_bytes: int
) -> tuple[dict[str, Any], CommitLog]:
    """Append `batch`-record batches for `duration` s (or `max_bytes`), flush="async".

    Returns the figures and the still-open log, so the read bench can read what was written.
    """
    log = CommitLog.open(directory, segment_bytes=SEGMENT_BYTES, flush="async")
    msgs = [_message() for _ in range(batch)]
    records = 0
    nbytes = 0
    start = time.perf_counter()
    deadline = start + duration
    while True:
        placed = log.append(msgs)
        records += len(placed)
        nbytes += sum(p.size for p in placed)
        if nbytes >= max_bytes or time.perf_counter() >= deadline:
            break
    # One flush inside the timed region: the raw baseline fdatasyncs everything it writes too.
    log.flush()
    elapsed = time.perf_counter() - start
    return {
        "batch": batch,
        "records": records,
        "bytes": nbytes,
        "seconds": elapsed,
        "records_per_s": records / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
    }, log


# ---------------------------------------------------------------------------------- read


def _drop_cache(directory: str) -> None:
    """Ask the kernel to drop the cached pages of the log's segment files (this log only)."""
    seg_dir = os.path.join(directory, "commitlog")
    for name in os.listdir(seg_dir):
        fd = os.open(os.path.join(seg_dir, name), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_read(log: CommitLog, max_count: int, cold: bool) -> dict[str, Any]:
    """Read queue 0 of the bench topic from offset 0 to the end, `max_count` records a call."""
    log.confirm_offset = log.max_offset
    if cold:
        _drop_cache(log.directory)
    records = 0
    nbytes = 0
    offset = 0
    start = time.perf_counter()
    while True:
        got = log.read(TOPIC, 0, offset, max_count=max_count)
        if not got:
            break
        records += len(got)
        nbytes += sum(m.size for m in got)
        offset += len(got)
    elapsed = time.perf_counter() - start
    return {
        "cache": "cold" if cold else "warm",
        "max_count": max_count,
        "records": records,
        "bytes": nbytes,
        "seconds": elapsed,
        "records_per_s": records / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
    }


# ---------------------------------------------------------------------------------- raw


def bench_raw(directory: str, nbytes: int, min_seconds: float) -> dict[str, Any]:
    """Write `nbytes` (whole MiB) with os.write + one fdatasync per MiB to a new file.

    A pass shorter than `min_seconds` is repeated into another new file, and the figure is the
    aggregate, so a fast disk still gets a stable number.
    """
    chunks = max(1, -(-nbytes // RAW_CHUNK))
    block = os.urandom(RAW_CHUNK)
    total = 0
    passes = 0
    elapsed = 0.0
    while passes == 0 or elapsed < min_seconds:
        path = os.path.join(directory, f"raw-{passes}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            start = time.perf_counter()
            for _ in range(chunks):
                os.write(fd, block)
                os.fdatasync(fd)
            elapsed += time.perf_counter() - start
        finally:
            os.close(fd)
            os.unlink(path)
        total += chunks * RAW_CHUNK
        passes += 1
    return {"bytes": total, "passes": passes, "seconds": elapsed, "mb_per_s": total / elapsed / 1e6}


# ---------------------------------------------------------------------------------- group commit


async def _group_commit(log: CommitLog, appenders: int, duration: float) -> dict[str, Any]:
    msg = _message()
    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def appender() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            placed = log.append([msg])
            await log.flushed(placed[-1].phys_offset + placed[-1].size)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {
        "appenders": appenders,
        "records": n,
        "seconds": elapsed,
        "records_per_s": n / elapsed,
        "latency_p50_ms": latencies[n // 2] * 1e3,
        "latency_p99_ms": latencies[min(n - 1, n * 99 // 100)] * 1e3,
    }


def bench_group_commit(directory: str, appenders: int, duration: float) -> dict[str, Any]:
    log = CommitLog.open(directory, segment_bytes=SEGMENT_BYTES, flush="sync")
    try:
        # Every flush round writes one checkpoint; its sequence number counts the rounds, which
        # tells how many records shared each fdatasync. Private, so only when present.
        cp = getattr(log, "_checkpoint", None)
        seq0 = getattr(cp, "_seq", None)
        out = asyncio.run(_group_commit(log, appenders, duration))
        seq1 = getattr(cp, "_seq", None)
        if seq0 is not None and seq1 is not None and seq1 > seq0:
            out["flush_rounds"] = seq1 - seq0
            out["records_per_flush"] = out["records"] / (seq1 - seq0)
    finally:
        log.close()
    return out


# ---------------------------------------------------------------------------------- report


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def _spread(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    vals = [s[key] for s in samples]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def _config(duration: float, max_bytes: int, read_count: int, repeats: int) -> dict[str, Any]:
    """The run's settings, as recorded in the result."""
    return {
        "body_bytes": BODY_BYTES,
        "segment_bytes": SEGMENT_BYTES,
        "duration_s": duration,
        "max_bytes": max_bytes,
        "read_max_count": read_count,
        "repeats": repeats,
    }


def _measure_append_read_raw(
    work: str, duration: float, max_bytes: int, read_count: int, repeats: int
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Append at each batch size; batch 1000 `repeats` times, each paired with the raw baseline.

    The last batch-1000 log is read back warm then cold. Returns (appends by batch, raws, reads).
    """
    appends: dict[int, list[dict[str, Any]]] = {}
    for batch in BATCH_SIZES[:-1]:
        ldir = os.path.join(work, f"append-{batch}")
        figures, log = bench_append(ldir, batch, duration, max_bytes)
        log.close()
        shutil.rmtree(ldir)
        appends[batch] = [figures]
    big = BATCH_SIZES[-1]
    appends[big] = []
    raws: list[dict[str, Any]] = []
    reads: list[dict[str, Any]] = []
    for i in range(repeats):
        ldir = os.path.join(work, f"append-{big}-{i}")
        figures, log = bench_append(ldir, big, duration, max_bytes)
        try:
            if i == repeats - 1:  # read back what the last run wrote
                reads.append(bench_read(log, read_count, cold=False))
                reads.append(bench_read(log, read_count, cold=True))
        finally:
            log.close()
            shutil.rmtree(ldir)
        appends[big].append(figures)
        raws.append(bench_raw(work, figures["bytes"], min_seconds=1.0))
    return appends, raws, reads


def _measure_group_commit(work: str, duration: float, repeats: int) -> dict[int, list[dict[str, Any]]]:
    """Sync group commit: one and 64 appenders back to back `repeats` times, the middle counts once."""

    def sync(n: int, i: int) -> dict[str, Any]:
        gdir = os.path.join(work, f"sync-{n}-{i}")
        try:
            return bench_group_commit(gdir, n, duration)
        finally:
            shutil.rmtree(gdir, ignore_errors=True)

    one, many = APPENDER_COUNTS[0], APPENDER_COUNTS[-1]
    gc: dict[int, list[dict[str, Any]]] = {n: [] for n in APPENDER_COUNTS}
    for i in range(repeats):
        gc[one].append(sync(one, i))
        gc[many].append(sync(many, i))
        if i == 0:
            for n in APPENDER_COUNTS[1:-1]:
                gc[n].append(sync(n, i))
    return gc


def _group_commit_summary(gc: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per appender count: the samples and their medians (records per flush when every sample has it)."""
    return [
        {
            "appenders": n,
            "samples": s,
            "records_per_s": _spread(s, "records_per_s"),
            "latency_p50_ms": _median(s, "latency_p50_ms"),
            "latency_p99_ms": _median(s, "latency_p99_ms"),
            **(
                {"records_per_flush": _median(s, "records_per_flush")}
                if all("records_per_flush" in x for x in s)
                else {}
            ),
        }
        for n, s in gc.items()
    ]


def _targets(append_ratios: list[float], gc_ratios: list[float]) -> dict[str, Any]:
    """Judge each target on the median of its per-pair ratios."""
    append_ratio = statistics.median(append_ratios)
    gc_ratio = statistics.median(gc_ratios)
    return {
        "append_vs_raw": {
            "ratio": append_ratio,
            "samples": append_ratios,
            "target": APPEND_TARGET_FRACTION,
            "pass": append_ratio >= APPEND_TARGET_FRACTION,
        },
        "group_commit_64_vs_1": {
            "ratio": gc_ratio,
            "samples": gc_ratios,
            "target": GROUP_COMMIT_TARGET,
            "pass": gc_ratio >= GROUP_COMMIT_TARGET,
        },
    }


def run(base_dir: str, duration: float, max_bytes: int, read_count: int, repeats: int) -> dict[str, Any]:
    """Every measurement, in an order that keeps the two target ratios fair on a noisy machine.

    Each ratio's two sides are measured back to back `repeats` times (append batch 1000, then
    the raw baseline of the same bytes; one appender, then 64), and a target is judged on the
    median of the per-pair ratios, so load that drifts during the run hits both sides alike.
    """
    work = tempfile.mkdtemp(prefix="tidelog-bench-", dir=base_dir)
    try:
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "code": code_version(),
            "machine": machine_info(work),
            "config": _config(duration, max_bytes, read_count, repeats),
        }
        appends, raws, reads = _measure_append_read_raw(work, duration, max_bytes, read_count, repeats)
        big = BATCH_SIZES[-1]
        append_ratios = [a["mb_per_s"] / r["mb_per_s"] for a, r in zip(appends[big], raws, strict=True)]

        gc = _measure_group_commit(work, duration, repeats)
        one, many = APPENDER_COUNTS[0], APPENDER_COUNTS[-1]
        gc_ratios = [m["records_per_s"] / o["records_per_s"] for o, m in zip(gc[one], gc[many], strict=True)]

        result["append"] = [
            {
                "batch": b,
                "samples": s,
                "records_per_s": _spread(s, "records_per_s"),
                "mb_per_s": _spread(s, "mb_per_s"),
            }
            for b, s in appends.items()
        ]
        result["read"] = reads
        result["raw"] = {"samples": raws, "mb_per_s": _spread(raws, "mb_per_s")}
        result["group_commit"] = _group_commit_summary(gc)
        result["targets"] = _targets(append_ratios, gc_ratios)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _range(s: dict[str, float], fmt: str) -> str:
    if s["min"] == s["max"]:
        return format(s["median"], fmt)
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"


def format_table(r: dict[str, Any]) -> str:
    m = r["machine"]
    first = r["append"][0]["samples"][0]
    lines = [
        f"tidelog commit-log bench, {r['date']}, code {r['code']}",
        f"machine: {m['cores']} cores, Python {m['python']}, {m['filesystem']} on {m['device']}, "
        f"fdatasync(4 KiB) median {m['fdatasync_4k']['median_ms']:.3f} ms, "
        f"p90 {m['fdatasync_4k']['p90_ms']:.3f} ms",
        f"records: {BODY_BYTES} B body ({first['bytes'] // max(1, first['records'])} B on disk), "
        f"segments {SEGMENT_BYTES >> 20} MiB, MB = 10^6 bytes; "
        f"median (min-max) of {r['config']['repeats']} runs where repeated",
        "",
        f"{'measurement':<40}{'records/s':>28}{'MB/s':>22}",
    ]
    for a in r["append"]:
        lines.append(
            f"{'append async, batch ' + str(a['batch']):<40}{_range(a['records_per_s'], ',.0f'):>28}"
            f"{_range(a['mb_per_s'], ',.1f'):>22}"
        )
    for rd in r["read"]:
        lines.append(
            f"{'read ' + rd['cache'] + ' cache, max_count ' + str(rd['max_count']):<40}"
            f"{rd['records_per_s']:>28,.0f}{rd['mb_per_s']:>22,.1f}"
        )
    lines.append(f"{'raw os.write 1 MiB + fdatasync':<40}{'-':>28}{_range(r['raw']['mb_per_s'], ',.1f'):>22}")
    lines.append("")
    lines.append(f"{'sync group commit':<22}{'records/s':>28}{'p50 ms':>9}{'p99 ms':>9}{'rec/flush':>11}")
    for g in r["group_commit"]:
        per = f"{g['records_per_flush']:.1f}" if "records_per_flush" in g else "-"
        lines.append(
            f"{str(g['appenders']) + ' appenders':<22}{_range(g['records_per_s'], ',.0f'):>28}"
            f"{g['latency_p50_ms']:>9.2f}{g['latency_p99_ms']:>9.2f}{per:>11}"
        )
    t = r["targets"]
    a, g = t["append_vs_raw"], t["group_commit_64_vs_1"]
    lines += [
        "",
        f"target append batch {BATCH_SIZES[-1]} / raw >= {a['target']:.0%}: {a['ratio']:.1%} "
        f"(pairs: {', '.join(f'{x:.0%}' for x in a['samples'])}) -> {'PASS' if a['pass'] else 'FAIL'}",
        f"target sync {APPENDER_COUNTS[-1]} / {APPENDER_COUNTS[0]} appenders >= {g['target']:.0f}x: "
        f"{g['ratio']:.1f}x (pairs: {', '.join(f'{x:.1f}x' for x in g['samples'])}) "
        f"-> {'PASS' if g['pass'] else 'FAIL'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.commitlog", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--duration", type=float, default=2.0, help="seconds per append or group-commit measurement"
    )
    ap.add_argument("--repeats", type=int, default=3, help="back-to-back pairs behind each target ratio")
    ap.add_argument("--max-mb", type=int, default=1024, help="cap on MB appended per append measurement")
    ap.add_argument("--read-count", type=int, default=1000, help="max_count of each read call")
    ap.add_argument(
        "--dir",
        default=None,
        help="parent directory for the bench's temporary files "
        "(default: the system temp dir unless it is tmpfs, else the current directory)",
    )
    args = ap.parse_args(argv)
    base = pick_base_dir(args.dir)
    result = run(base, args.duration, args.max_mb * 1_000_000, args.read_count, max(1, args.repeats))
    report(result, args.json, format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
