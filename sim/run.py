"""Batches of seeds, replay, and shrinking of a failing schedule.

`batch(start, n)` runs seeds start..start+n-1 on a few worker processes (each seed is
independent and deterministic, so the order of completion changes nothing) and returns the
summary the command prints as its last line. `shrink(seed, faults)` drops faults one at a time
while the seed still fails, and returns the smallest schedule found.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .faults import Fault
from .world import DEFAULT_FAULTS, Outcome, run_seed

#: CPU time one seed may take in a batch (a seed takes about 0.1 s): the event cap
#: (`net.MAX_EVENTS`) stops a world that loops through events, this one a single event that never
#: returns; such a seed fails, with its replay command, instead of holding its worker. CPU time,
#: not wall time: a worker stopped or starved meanwhile (SIGSTOP, a busy machine) fails nothing.
SEED_CPU_S = 60


class _OverCpuTime(Exception):
    pass


def _over_cpu_time(signum: int, frame: Any) -> None:
    raise _OverCpuTime


def _chunk(args: tuple[int, int, int, str | None, bool]) -> list[tuple[int, bool, str, int]]:
    start, n, n_faults, mutant, stop_at_first = args
    if mutant is not None:
        from .mutants import MUTANTS

        MUTANTS[mutant].apply()
    results = []
    # a signal handler can be set on the main thread only (a batch run in-process elsewhere goes
    # without the CPU-time cap; the event cap holds everywhere)
    timed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGVTALRM, _over_cpu_time) if timed else None
    try:
        for seed in range(start, start + n):
            if timed:
                signal.setitimer(signal.ITIMER_VIRTUAL, SEED_CPU_S)
            try:
                out = run_seed(seed, n_faults=n_faults)
                results.append((seed, out.ok, out.violation, out.sim_ms))
            except _OverCpuTime:
                results.append((seed, False, f"Runaway: more than {SEED_CPU_S} s of CPU time", 0))
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            if stop_at_first and not results[-1][1]:
                break
    finally:
        if timed:
            signal.signal(signal.SIGVTALRM, previous)
    return results


def batch(
    start: int,
    n: int,
    *,
    n_faults: int = DEFAULT_FAULTS,
    workers: int | None = None,
    mutant: str | None = None,
    stop_at_first: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the seeds; the summary dict, plus the failures as (seed, violation)."""
    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.monotonic()
    results: list[tuple[int, bool, str, int]] = []
    size = max(1, min(50, n // (workers * 4) or 1))
    chunks = [
        (s, min(size, start + n - s), n_faults, mutant, stop_at_first) for s in range(start, start + n, size)
    ]
    if workers == 1 and mutant is None:  # a mutant is applied only in worker processes
        for c in chunks:
            results.extend(_chunk(c))
            if stop_at_first and not all(r[1] for r in results):
                break
    else:
        with ProcessPoolExecutor(workers) as pool:
            for part in pool.map(_chunk, chunks):
                before = len(results)
                results.extend(part)
                if progress is None:
                    continue
                for seed, ok, why, _ in part:
                    if not ok:
                        progress(f"seed {seed} failed: {why}")
                if len(results) // 1000 > before // 1000:
                    failed = sum(1 for r in results if not r[1])
                    progress(f"{len(results)} seeds done, {failed} failed, up to seed {part[-1][0]}")
    elapsed = max(time.monotonic() - t0, 1e-9)
    failed = sorted((seed, why) for seed, ok, why, _ in results if not ok)
    return {
        "seeds": len(results),
        "failed": len(failed),
        "first_failed_seed": failed[0][0] if failed else None,
        "seeds_per_min": round(len(results) / elapsed * 60, 1),
        "sim_seconds": round(sum(r[3] for r in results) / 1000, 1),
        "_failures": failed,
    }


def shrink(seed: int, faults: list[Fault], n_faults: int = DEFAULT_FAULTS) -> tuple[list[Fault], Outcome]:
    """Drop faults while the seed still fails (any violation); the smallest schedule and its run."""
    best = run_seed(seed, faults=faults, n_faults=n_faults)
    if best.ok:
        return faults, best
    current = list(faults)
    changed = True
    while changed:
        changed = False
        i = 0
        while i < len(current):
            trial = current[:i] + current[i + 1 :]
            out = run_seed(seed, faults=trial, n_faults=n_faults)
            if not out.ok:
                current, best, changed = trial, out, True
            else:
                i += 1
    return current, best
