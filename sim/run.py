"""Batches of seeds, replay, and shrinking of a failing schedule.

`batch(start, n)` runs seeds start..start+n-1 on a few worker processes (each seed is
independent and deterministic, so the order of completion changes nothing) and returns the
summary the command prints as its last line. `shrink(seed, faults)` drops faults one at a time
while the seed still fails, and returns the smallest schedule found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .faults import Fault
from .world import DEFAULT_FAULTS, Outcome, run_seed

#: CPU time one seed may take in a batch (a seed takes about 0.1 s): the event cap
#: (`net.MAX_EVENTS`) stops a world that loops through events, this one a single event that never
#: returns; such a seed fails, with its replay command, instead of holding its worker. CPU time,
#: not wall time: a worker stopped or starved meanwhile (SIGSTOP, a busy machine) fails nothing.
SEED_CPU_S = 60


class OverCpuTime(BaseException):
    """A seed ran past its CPU time (`cpu_cap`). A BaseException: no `except Exception` on the
    simulated path may swallow it, since the timer fires once."""


@contextlib.contextmanager
def cpu_cap(seconds: float) -> Iterator[None]:
    """Raise `OverCpuTime` in the block once it has used `seconds` of this process's CPU time.
    On the main thread only (a signal handler can be set nowhere else): elsewhere the block runs
    without it, the event cap (`net.MAX_EVENTS`) still holding. The timer may fire just after the
    block ended and before it is disarmed: the caller catches `OverCpuTime` around the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def over(signum: int, frame: Any) -> None:
        if armed:
            raise OverCpuTime

    previous = signal.signal(signal.SIGVTALRM, over)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def _chunk(args: tuple[int, int, int, str | None, bool]) -> list[tuple[int, bool, str, int]]:
    start, n, n_faults, mutant, stop_at_first = args
    if mutant is not None:
        from .mutants import MUTANTS

        MUTANTS[mutant].apply()
    results = []
    for seed in range(start, start + n):
        try:
            with cpu_cap(SEED_CPU_S):
                out = run_seed(seed, n_faults=n_faults)
            results.append((seed, out.ok, out.violation, out.sim_ms))
        except OverCpuTime:
            results.append((seed, False, f"Runaway: more than {SEED_CPU_S} s of CPU time", 0))
        if stop_at_first and not results[-1][1]:
            break
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
    in_process = workers == 1 and mutant is None  # a mutant is applied only in worker processes
    with contextlib.ExitStack() as stack:
        if in_process:
            parts: Iterator[list[tuple[int, bool, str, int]]] = map(_chunk, chunks)
        else:
            parts = stack.enter_context(ProcessPoolExecutor(workers)).map(_chunk, chunks)
        for part in parts:
            before = len(results)
            results.extend(part)
            if progress is not None:
                _report(progress, part, results, before)
            if in_process and stop_at_first and not all(r[1] for r in part):
                break
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


def _report(
    progress: Callable[[str], None],
    part: list[tuple[int, bool, str, int]],
    results: list[tuple[int, bool, str, int]],
    before: int,
) -> None:
    """Each failure of a chunk as it ends, and a line every 1,000 seeds."""
    for seed, ok, why, _ in part:
        if not ok:
            progress(f"seed {seed} failed: {why}")
    if len(results) // 1000 > before // 1000:
        failed = sum(1 for r in results if not r[1])
        progress(f"{len(results)} seeds done, {failed} failed, up to seed {part[-1][0]}")


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
