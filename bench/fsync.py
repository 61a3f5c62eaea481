"""The disk's own floor under an fsync'd acknowledgement: pwrite + fdatasync, as tidelog issues them.

An acknowledgement under `flush: sync` waits for an fdatasync on the master and one on each slave
it counts; a ledger add waits for the master's. No code path can acknowledge such a write sooner
than the disk completes those syncs, so their latency, percentiles included, is the floor that
the single-send targets are measured against (bench/RESULTS.md). Run from the repository root:

    python -m bench.fsync                 # table, about 30 s
    python -m bench.fsync --json
    python -m bench.fsync --dir /data     # the disk the brokers' data directories are on

Each variant writes 1,100 bytes (a 1 KiB message and its record header) per round to a fresh,
sparse file of its own, as a segment grows, and times the round:

- back to back: one writer, the next round at once (the best case: a disk kept busy);
- paced: one writer, rounds 1 ms apart (a producer that waits for each acknowledgement leaves the
  disk idle that long between its syncs: a ledger add, or `flush: async`'s master under a forced
  sync);
- two at once, paced: two writers, each its own file, syncing together each round; a round ends
  when both are done (the master's and the slave's syncs under `flush: sync`, on one disk here).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.commitlog import code_version, fdatasync_latency, fs_type, pick_base_dir, report

RECORD_BYTES = 1100
VARIANTS: tuple[tuple[str, float, int], ...] = (
    ("back to back", 0.0, 1),
    ("paced 1 ms", 0.001, 1),
    ("two at once, paced 1 ms", 0.001, 2),
)


def measure(directory: str, rounds: int) -> dict[str, Any]:
    typ, dev = fs_type(directory)
    return {
        "code": code_version(("bench",)),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "directory": directory,
        "filesystem": typ,
        "device": dev,
        "rounds": rounds,
        "variants": {
            name: fdatasync_latency(directory, rounds, size=RECORD_BYTES, pace_s=pace, writers=writers)
            for name, pace, writers in VARIANTS
        },
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"pwrite {RECORD_BYTES} B + fdatasync, {r['rounds']} rounds each, {r['when']}, code {r['code']}",
        f"directory {r['directory']} ({r['filesystem']} on {r['device']})",
        "",
        f"{'variant':<28}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for name, v in r["variants"].items():
        lines.append(
            f"{name:<28}{v['median_ms']:>9.3f}{v['p90_ms']:>9.3f}{v['p99_ms']:>9.3f}{v['max_ms']:>9.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--dir", default=None, help="directory on the disk to measure (default: a temp dir, never tmpfs)"
    )
    ap.add_argument("--rounds", type=int, default=5000, help="rounds per variant")
    args = ap.parse_args(argv)
    if args.rounds < 100:
        ap.error("--rounds must be at least 100 (a p99 needs them)")
    report(measure(pick_base_dir(args.dir), args.rounds), args.json, format_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
